"""The experiments' run folders read back: each one's progress, and the report that
benchmarks/experiments.py `report` writes (tables and figures of docs/experiments.md, from the
run folders only; nothing typed by hand). ``RUNS``: the run root, set by experiments.py."""

from __future__ import annotations

import csv
import json
import os
import platform
import shutil
from pathlib import Path

import experiments_captions as captions
from experiments_cost import cost_section
from experiments_grid import grid_formation
from experiments_long import long_budget
from experiments_runs import (
    CONFIGS,
    FIGS,
    RESULTS,
    ROOT,
    finished,
    kept,
    mean_std,
    per_layer,
    run_cells,
)
from experiments_stats import welch
from experiments_tests import tests_section

RUNS = Path(os.environ.get("ATTNCONV_RUNS") or ROOT.parent / "attnconv-runs")  # see --runs
DOCS = ROOT / "docs" / "experiments.md"  # the page that shows the report
BEGIN, END = "<!-- experiments:begin -->", "<!-- experiments:end -->"
# figures shown inline on the page (the rest are linked)
INLINE_FIGURES = ("attention_average", "mass_contours", "center_trajectories_gif")


TABLE1 = ("resnet18", "sa_quadratic", "sa_learned", "sa_learned_content")


def table1_done() -> bool:
    """A Table 1 model's seed-0 run finished under this run root: the table is regenerated
    from the runs here, the others' rows say "not run" (until then the report keeps the last
    regenerated Table 1, never a table of empty rows)."""
    return any(finished(RUNS / f"table1_{n}") for n in TABLE1)  # a complete wall.json


def table1(lines: list[str]) -> None:
    if not table1_done():
        lines += kept("### Table 1 at CPU scale", "\n### ")  # up to the next section
        return
    paper = {
        "resnet18": (93.8, "11.2M"),
        "sa_quadratic": (93.8, "12.1M"),
        "sa_learned": (91.8, "12.3M"),
        "sa_learned_content": (87.1, "29.5M"),
    }
    lines += [
        "### Table 1 at CPU scale (Cordonnier et al. 2020)",
        "",
        "| model | test acc. (here, seed 0) | params (here) | train images/s | train wall | "
        "seeds: mean +- std (n: each) | paper acc. (params) |",
        "|---|---|---|---|---|---|---|",
    ]
    accs, spread, collapsed = {}, {}, []
    for name, (acc, par) in paper.items():
        cells, by_run = seed_cells(name)
        seeds = list(by_run.values())
        m, sd = mean_std(seeds)
        over = seeds_cell(seeds)
        chance = [r for r, a in by_run.items() if a <= CHANCE]
        if chance:
            rest = mean_std([a for a in seeds if a > CHANCE])
            over += (
                f"; {len(chance)} at chance, the others {100 * rest[0]:.1f} +- {100 * rest[1]:.1f}%"
            )
            collapsed += chance
        lines.append(f"| {name} | {cells} | {over} | {acc}% ({par}) |")
        if seeds:
            accs[name], spread[name] = m, sd
    extra = [
        ("sa_learned, `init: bert` (ablation)", "table1_sa_learned_bert"),
        ("sa_quadratic in bf16 autocast (precision check)", "table1_sa_quadratic_bf16"),
        ("sa_learned seed 1, 30% warm-up (collapse check)", "table1_sa_learned_warmup_seed1"),
    ]
    for label, run in extra:
        if (RUNS / run).exists():
            lines.append(f"| {label} | {run_cells(RUNS / run)[0]} | |")
    if len(accs) >= 2:
        ranked = sorted(accs, key=lambda n: -accs[n])
        seeds = {n: [100 * a for a in seed_cells(n)[1].values()] for n in ranked}
        tested = [welch(seeds[a], seeds[b]) for a, b in zip(ranked, ranked[1:])]
        order = (
            ranked[0]
            + "".join(  # '>' where the page's test orders the two neighbours
                f" {'>' if w is not None and w.ordered else '~'} {b}"
                for w, b in zip(tested, ranked[1:])
            )
        )
        missing = [n for n in paper if n not in accs]
        lines += [
            "",
            "Paper's order: sa_quadratic ~ resnet18 > sa_learned > sa_learned_content. "
            "Order here, by mean over seeds ('>': Welch's test orders the two neighbours at "
            f"p < 0.05, '~': it does not tell them apart; each test in the table of tests "
            f"below): {order}" + (f" ({', '.join(missing)}: not run yet)" if missing else "") + ".",
        ]
        if collapsed:
            lines += [
                "",
                f"At chance (test accuracy <= {100 * CHANCE:.0f}%: the training "
                f"collapsed to a constant output, loss ln 10): {', '.join(collapsed)}; "
                "it counts in the mean above.",
            ]
    lines.append("")
    heads(lines)


def seed_runs(name: str, prefix: str = "table1_") -> list[str]:
    """<prefix><name> (seed 0) and its <prefix><name>_seed<N> repeats that have a config."""
    base = f"{prefix}{name}"
    return [base] + sorted(p.stem for p in CONFIGS.glob(f"{base}_seed*.yaml"))


def decimals(sd: float) -> int:
    """Decimals of a spread's figures: two under a std of 0.1 point (two seeds 0.05 apart are
    not '+- 0.0'), one otherwise."""
    return 1 if 100 * sd >= 0.1 else 2


def pm(m: float, sd: float) -> str:
    """'mean +- std%' of accuracies in [0, 1], the std to ``decimals``."""
    return f"{100 * m:.1f} +- {100 * sd:.{decimals(sd)}f}%"


def seeds_cell(accs: list[float]) -> str:
    """'mean +- std% (n: each seed's, seed 0 first)' over the finished seeds; one seed has no
    std: 'acc% (1 seed)'."""
    if not accs:
        return "not run"
    if len(accs) == 1:
        return f"{100 * accs[0]:.1f}% (1 seed)"
    m, sd = mean_std(accs)
    each = ", ".join(f"{100 * a:.{decimals(sd)}f}" for a in accs)
    return f"{pm(m, sd)} ({len(accs)}: {each})"


CHANCE = 0.11  # 10 classes: a run at or below this test accuracy learned nothing


def seed_cells(name: str, prefix: str = "table1_") -> tuple[str, dict[str, float]]:
    """The seed-0 run's table cells and the test accuracy of every finished seed by run name,
    each run folder read once (run_cells loads the model to count its parameters)."""
    names = seed_runs(name, prefix)
    runs = [run_cells(RUNS / r) for r in names]
    return runs[0][0], {r: a for r, (_, a) in zip(names, runs) if a is not None}


def heads(lines: list[str]) -> None:
    """Per layer: mean attention distance (and the uniform head's), grid score of quadratic
    layers (distinct 3x3 / 5x5 offsets held by sharp heads), conv-likeness."""
    runs = [
        ("sa_quadratic", "table1_sa_quadratic", "analysis"),
        ("sa_quadratic at step 0", "table1_sa_quadratic", "analysis_init"),
        ("sa_learned", "table1_sa_learned", "analysis"),
        ("sa_learned at step 0", "table1_sa_learned", "analysis_init"),
        ("sa_learned, init: bert", "table1_sa_learned_bert", "analysis"),
        ("sa_learned, init: bert, at step 0", "table1_sa_learned_bert", "analysis_init"),
        ("sa_learned_content", "table1_sa_learned_content", "analysis"),
        ("sa_learned_content at step 0", "table1_sa_learned_content", "analysis_init"),
    ]
    runs += [  # the other seeds, where analyzed (fig. 5-6 read over seeds)
        (f"{m}, seed {run.rsplit('_seed', 1)[1]}{at}", run, folder)
        for m in ("sa_quadratic", "sa_learned", "sa_learned_content")
        for run in seed_runs(m)[1:]
        for at, folder in (("", "analysis"), (" at step 0", "analysis_init"))
    ]
    rows = []
    for label, run, folder in runs:
        rep = RUNS / run / folder / "report.json"
        if not rep.exists():
            continue
        r = json.loads(rep.read_text())
        dist = r["mean_distance_px"]
        grid = r.get("grid_score", [])
        g = per_layer([f"{x['grid3']}/{x['grid5']}" for x in grid], "{}") if grid else "n/a"
        sharp = per_layer([x["sharp_heads"] for x in grid], "{}") if grid else "n/a"
        conv = per_layer((c["score"] for c in r["conv_likeness"]), "{:.2f}")
        rows.append(
            f"| {label} | {per_layer(sum(d) / len(d) for d in dist)} | "
            f"{per_layer(min(d) for d in dist)} | {g} | {sharp} | {conv} |"
        )
        uniform = r["uniform_distance_px"]
    if rows:
        lines += [
            "#### What the heads learned, per layer (layer 1 -> 6)",
            "",
            "From `attnconv analyze` over 100 test images, query at the image centre. Mean "
            f"attention distance in image pixels (a uniform head: {uniform:.1f}) averaged "
            "over the heads, and the nearest head's; grid score: distinct offsets of the "
            "3x3 / 5x5 neighbourhood held by a sharp head (> 50% of its mass on one "
            "pixel), and the number of sharp heads (of 9); conv-likeness (1 = hard heads "
            'on a K x K grid). "at step 0": the same model before training (same seed).',
            "",
            "| model | mean distance | nearest head | grid score 3x3/5x5 | sharp heads "
            "| conv-likeness |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
        ]


SASA_CLAIMS = [
    ("k=3", "k3"),
    ("k=7 (default)", "k7"),
    ("positional none", "pos_none"),
    ("conv stem", "convstem"),
    ("logits q^T r only", "logits_qr"),
    ("4 heads: positional absolute", "pos_absolute"),
    ("4 heads: positional relative (default)", "pos_relative_h4"),
]
SASA_SINGLE = [
    ("k=5", "k5"),
    ("k=9", "k9"),
]


def sasa(lines: list[str]) -> None:
    """The SASA ablations: the claimed variants with their seeds (mean +- std), then the
    single-seed variants; their tests are the tests section's (experiments_tests.py)."""
    title = "### SASA ablations at CPU scale (Ramachandran et al. 2019)"
    names = [f"sasa_{v}" for _, v in SASA_CLAIMS + SASA_SINGLE]
    if not any((RUNS / n).exists() for n in names):
        if block := kept(title, "\n#"):  # the last regenerated table: its runs are not here
            lines += block
            return
    lines += [
        title,
        "",
        "Every run: 1,000 steps of 64 images (the Table 1 budget), evaluated on all 10,000 "
        "test images; one change from the default (k=7, relative embeddings, q^T k + q^T r "
        "logits, attention stem).",
        "",
        "| variant (one change from the default) | test acc. (seed 0) | params | "
        "train images/s | train wall | seeds: mean +- std (n: each) |",
        "|---|---|---|---|---|---|",
    ]
    for label, v in SASA_CLAIMS:
        cells, by_run = seed_cells(v, prefix="sasa_")
        over = seeds_cell(list(by_run.values()))
        lines.append(f"| {label} | {cells} | {over} |")
    for label, v in SASA_SINGLE:
        if (RUNS / f"sasa_{v}").exists():
            lines.append(f"| {label} | {run_cells(RUNS / f'sasa_{v}')[0]} | 1 seed |")
    lines += [
        "",
        "Each variant against another: the table of tests below (Welch's test over the seeds; "
        "k=5 and k=9 are single runs, not tested).",
        "",
    ]


def train_seconds(run: Path) -> float:
    """A finished run's training time over all its sittings: the sum of each sitting's clock in
    metrics.csv (the trainer's ``seconds`` restarted at every resume before its checkpoints
    saved the clock; a drop starts a new sitting), or the runner's wall.json
    where that is larger (it times each sitting's whole command; before wall_partial.json it
    kept only the last sitting: grid_long's 4.0 h of its 23.8)."""
    total = last = 0.0
    with open(run / "metrics.csv") as f:
        for row in csv.DictReader(f):
            s = float(row["seconds"])
            total, last = (total + last, s) if s < last else (total, s)
    wall = json.loads((run / "wall.json").read_text())["train_seconds"]
    return max(total + last, wall)


def analysis(lines: list[str]) -> None:
    if not table1_done():
        lines += kept("#### What the heads of sa_quadratic learned", "### Theorem 1")
        return
    for name in ("sa_quadratic", "sa_learned", "sa_learned_bert", "sa_learned_content"):
        rep = RUNS / f"table1_{name}" / "analysis" / "report.json"
        if not rep.exists():
            continue
        r = json.loads(rep.read_text())
        dst = FIGS / name
        dst.mkdir(parents=True, exist_ok=True)
        steps = int(list(csv.DictReader(open(RUNS / f"table1_{name}" / "metrics.csv")))[-1]["step"])
        lines += [f"#### What the heads of {name} learned in Table 1's {steps:,} steps", ""]
        figs = r.get("figures", {})
        for fname in figs.values():  # every figure lands in docs/figures/<model>/
            shutil.copy(rep.parent / fname, dst / fname)
        links = [f"[{k.replace('_', ' ')}](figures/{name}/{f})" for k, f in figs.items()]
        lines.append("All figures: " + ", ".join(links) + ".")
        lines.append("")
        for key in INLINE_FIGURES:  # the ones shown inline
            if key in figs:
                lines += [
                    f"![{key}](figures/{name}/{figs[key]})",
                    "",
                    *captions.analysis_figure(key, name, steps, r),
                ]


def conversion(lines: list[str]) -> None:
    conv = RUNS / "table1_resnet18" / "convert.json"
    if not (RUNS / "table1_resnet18").exists():
        lines += kept("### Theorem 1 on the trained ResNet18", "Lemma 2, error")
    if conv.exists():
        c = json.loads(conv.read_text())
        t = c.get("test_set", {})
        worst = max(r["max_abs_diff"] for r in c["layers"])
        lines += [
            "### Theorem 1 on the trained ResNet18",
            "",
            f"`attnconv convert` replaced its {len(c['layers'])} convolutions by hard "
            f"quadratic self-attention layers (worst per-layer max |diff| {worst:.1e}). "
            f"On the {t.get('images', 0)} CIFAR-10 test images: accuracy "
            f"{100 * t.get('accuracy_before', float('nan')):.2f}% before, "
            f"{100 * t.get('accuracy_after', float('nan')):.2f}% after, predictions "
            f"differ on {t.get('predictions_differ', 'n/a')} images, max |logit diff| "
            f"{t.get('max_abs_logit_diff', float('nan')):.1e}.",
            "",
        ]
    png = ROOT / "benchmarks" / "results" / "convert_lemma2.png"
    if png.exists():  # shown from docs/figures/, beside the page
        FIGS.mkdir(parents=True, exist_ok=True)
        shutil.copy(png, FIGS / png.name)
        bench = png.with_name("convert.json")  # the sweep's conv and images
        sweep = json.loads(bench.read_text()).get("lemma2", {}) if bench.exists() else {}
        lines += [
            "Lemma 2, error of the soft conversion against alpha (from `attnconv bench "
            "--suite convert --update-results`):",
            "",
            f"![lemma2](figures/{png.name})",
            "",
            *captions.lemma2(sweep.get("conv"), sweep.get("images")),
        ]


def report(runs: Path) -> None:
    global RUNS
    RUNS = runs
    lines = [
        f"Machine: {platform.machine()}, {platform.processor() or 'CPU'}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}; "
        "regenerated by `python benchmarks/experiments.py report`.",
        "",
    ]
    walls = [train_seconds(p.parent) for p in RUNS.glob("*/wall.json") if finished(p.parent)]
    if walls:
        lines += [
            f"Wall time of the {len(walls)} training runs: {sum(walls) / 3600:.1f} h in "
            "all, every sitting counted (several ran side by side on the 2 cores).",
            "",
        ]
    cost_section(lines, RUNS)
    table1(lines)
    long_budget(lines, RUNS)
    grid_formation(lines, RUNS)
    sasa(lines)
    tests_section(lines, RUNS)
    analysis(lines)
    conversion(lines)
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    s = DOCS.read_text()
    if BEGIN in s and END in s:
        s = s[: s.index(BEGIN) + len(BEGIN)] + "\n" + text + s[s.index(END) :]
        DOCS.write_text(s)
    print(text)
