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

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "experiments"
RUNS = Path(os.environ.get("ATTNCONV_RUNS") or ROOT.parent / "attnconv-runs")  # see --runs
DOCS = ROOT / "docs" / "experiments.md"  # the page that shows the report
FIGS = ROOT / "docs" / "figures"
RESULTS = ROOT / "benchmarks" / "results" / "experiments.md"
BEGIN, END = "<!-- experiments:begin -->", "<!-- experiments:end -->"
# figures shown inline on the page (the rest are linked)
INLINE_FIGURES = ("attention_average", "mass_contours", "center_trajectories_gif")


def train_config(cfg: Path):
    """An experiment's ``train`` section (its steps and batch)."""
    from attnconv.train.config import load_config

    return load_config(cfg).train


def total_steps(cfg: Path, t=None) -> int | None:
    """Training steps an experiment's config asks for (None: a whole-split epoch, not capped);
    ``t``: its train section, if already read."""
    t = t or train_config(cfg)
    return t.epochs * t.steps_per_epoch if t.steps_per_epoch else None


def progress(cfg: Path, out: Path) -> str:
    """'done', 'not started', or 'step S of N (P%), ~H h left at R img/s' from the run folder's
    metrics.csv (the steps a resume restarts from are those of its last checkpoint)."""
    if (out / "wall.json").exists():
        return "done"
    rows = list(csv.DictReader(open(out / "metrics.csv"))) if (out / "metrics.csv").exists() else []
    train = [r for r in rows if r["kind"] == "train"]
    if not train:
        return "not started"
    t = train_config(cfg)
    step, n = int(train[-1]["step"]), total_steps(cfg, t)
    ips = sorted(float(r["images_per_s"]) for r in train[-20:])[len(train[-20:]) // 2]
    if not n:
        return f"step {step} ({ips:.0f} img/s)"
    left_h = (n - step) * t.batch_size / max(ips, 1e-9) / 3600
    return f"step {step} of {n} ({100 * step / n:.0f}%), ~{left_h:.1f} h left at {ips:.0f} img/s"



def read_metrics(run: Path) -> dict:
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    ips = sorted(float(r["images_per_s"]) for r in train)
    return {
        "test_acc": float(evals[-1]["acc"]) if evals else float("nan"),
        "images_per_s": ips[len(ips) // 2] if ips else float("nan"),
        "steps": int(train[-1]["step"]) if train else 0,
    }


def n_params(run: Path) -> int:
    from attnconv.loading import load_model

    model, _ = load_model(run)
    return sum(p.numel() for p in model.parameters())


def run_cells(run: Path) -> tuple[str, float | None]:
    """The table cells 'test acc. | params | train images/s | train wall' of a run folder, and
    its test accuracy (None, with empty cells, for a run not finished)."""
    if not (run / "wall.json").exists():
        return "not run | | |", None
    m, wall = read_metrics(run), json.loads((run / "wall.json").read_text())
    cells = (f"{100 * m['test_acc']:.1f}% | {n_params(run) / 1e6:.2f}M | "
             f"{m['images_per_s']:.0f} | {wall['train_seconds'] / 60:.1f} min")  # fmt: skip
    return cells, m["test_acc"]


TABLE1 = ("resnet18", "sa_quadratic", "sa_learned", "sa_learned_content")


def table1_done() -> bool:
    """Every Table 1 model's seed-0 run finished under this run root (until then the report
    keeps the last regenerated Table 1, never a table of empty rows)."""
    return all((RUNS / f"table1_{n}" / "wall.json").exists() for n in TABLE1)


def table1(lines: list[str]) -> None:
    if not table1_done():
        lines += kept("### Table 1 at CPU scale", "\n### ")  # up to the next section
        return
    paper = {"resnet18": (93.8, "11.2M"), "sa_quadratic": (93.8, "12.1M"),
             "sa_learned": (91.8, "12.3M"), "sa_learned_content": (87.1, "29.5M")}  # fmt: skip
    lines += ["### Table 1 at CPU scale (Cordonnier et al. 2020)", "",
              "| model | test acc. (here, seed 0) | params (here) | train images/s | train wall | "
              "seeds: mean +- std (n) | paper acc. (params) |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    accs, spread, collapsed = {}, {}, []
    for name, (acc, par) in paper.items():
        cells, by_run = seed_cells(name)
        seeds = list(by_run.values())
        m, sd = mean_std(seeds)
        over = f"{100 * m:.1f} +- {100 * sd:.1f}% ({len(seeds)})" if seeds else "not run"
        chance = [r for r, a in by_run.items() if a <= CHANCE]
        if chance:
            rest = mean_std([a for a in seeds if a > CHANCE])
            over += (f"; {len(chance)} at chance, the others {100 * rest[0]:.1f} +- "
                     f"{100 * rest[1]:.1f}%")  # fmt: skip
            collapsed += chance
        lines.append(f"| {name} | {cells} | {over} | {acc}% ({par}) |")
        if seeds:
            accs[name], spread[name] = m, sd
    extra = [("sa_learned, `init: bert` (ablation)", "table1_sa_learned_bert"),
             ("sa_quadratic in fp32 (bf16 check)", "table1_sa_quadratic_fp32")]  # fmt: skip
    for label, run in extra:
        if (RUNS / run).exists():
            lines.append(f"| {label} | {run_cells(RUNS / run)[0]} | |")
    if len(accs) == len(paper):
        ranked = sorted(accs, key=lambda n: -accs[n])
        order = ranked[0] + "".join(  # '~' where two means lie within one std of each other
            f" {'~' if accs[a] - accs[b] <= max(spread[a], spread[b]) else '>'} {b}"
            for a, b in zip(ranked, ranked[1:]))  # fmt: skip
        lines += ["", "Paper's order: sa_quadratic ~ resnet18 > sa_learned > sa_learned_content. "
                  f"Order here, by mean over seeds ('~': within one std): {order}."]  # fmt: skip
        if collapsed:
            lines += ["", f"At chance (test accuracy <= {100 * CHANCE:.0f}%: the training "
                      f"collapsed to a constant output, loss ln 10): {', '.join(collapsed)}; "
                      "it counts in the mean above."]  # fmt: skip
    lines.append("")
    heads(lines)


def seed_runs(name: str, prefix: str = "table1_") -> list[str]:
    """<prefix><name> (seed 0) and its <prefix><name>_seed<N> repeats that have a config."""
    base = f"{prefix}{name}"
    return [base] + sorted(p.stem for p in CONFIGS.glob(f"{base}_seed*.yaml"))


CHANCE = 0.11  # 10 classes: a run at or below this test accuracy learned nothing


def seed_cells(name: str, prefix: str = "table1_") -> tuple[str, dict[str, float]]:
    """The seed-0 run's table cells and the test accuracy of every finished seed by run name,
    each run folder read once (run_cells loads the model to count its parameters)."""
    names = seed_runs(name, prefix)
    runs = [run_cells(RUNS / r) for r in names]
    return runs[0][0], {r: a for r, (_, a) in zip(names, runs) if a is not None}


def mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for fewer than two values)."""
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    sd = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
    return m, sd


def per_layer(values, fmt: str = "{:.1f}") -> str:
    """One table cell of per-layer values, layer 1 first."""
    return ", ".join(fmt.format(v) for v in values)


def heads(lines: list[str]) -> None:
    """Per layer: mean attention distance (and the uniform head's), grid score of quadratic
    layers (distinct 3x3 / 5x5 offsets held by sharp heads), conv-likeness."""
    runs = [("sa_quadratic", "table1_sa_quadratic", "analysis"),
            ("sa_quadratic at step 0", "table1_sa_quadratic", "analysis_init"),
            ("sa_learned", "table1_sa_learned", "analysis"),
            ("sa_learned at step 0", "table1_sa_learned", "analysis_init"),
            ("sa_learned, init: bert", "table1_sa_learned_bert", "analysis"),
            ("sa_learned, init: bert, at step 0", "table1_sa_learned_bert", "analysis_init"),
            ("sa_learned_content", "table1_sa_learned_content", "analysis"),
            ("sa_learned_content at step 0", "table1_sa_learned_content",
             "analysis_init")]  # fmt: skip
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
        rows.append(f"| {label} | {per_layer(sum(d) / len(d) for d in dist)} | "
                    f"{per_layer(min(d) for d in dist)} | {g} | {sharp} | {conv} |")  # fmt: skip
        uniform = r["uniform_distance_px"]
    if rows:
        lines += ["#### What the heads learned, per layer (layer 1 -> 6)", "",
                  "From `attnconv analyze` over 100 test images, query at the image centre. Mean "
                  f"attention distance in image pixels (a uniform head: {uniform:.1f}) averaged "
                  "over the heads, and the nearest head's; grid score: distinct offsets of the "
                  "3x3 / 5x5 neighbourhood held by a sharp head (> 50% of its mass on one "
                  "pixel), and the number of sharp heads (of 9); conv-likeness (1 = hard heads "
                  "on a K x K grid). \"at step 0\": the same model before training (same seed).",
                  "", "| model | mean distance | nearest head | grid score 3x3/5x5 | sharp heads "
                  "| conv-likeness |", "|---|---|---|---|---|---|", *rows, ""]  # fmt: skip


KEPT_NOTE = "(SASA table kept from its last regeneration: its run folders are not on this machine.)"
KEPT = "(Kept from its last regeneration: its run folders are not under this run root.)"


def kept(start: str, stop: str | None) -> list[str]:
    """The last regenerated report's lines from heading ``start`` up to heading ``stop``, with
    one KEPT note: a section whose runs are not here is kept, not replaced by empty cells."""
    old = RESULTS.read_text() if RESULTS.exists() else ""
    if start not in old:
        return []
    block = old[old.index(start):]
    end = block.find(stop, len(start)) if stop else -1
    if end >= 0:
        block = block[:end]
    block = block.replace(KEPT, "").rstrip("\n")
    return [block, "", KEPT, ""]


SASA_CLAIMS = [("k=3", "k3"), ("k=7 (default)", "k7"), ("positional none", "pos_none")]
SASA_SINGLE = [("k=5", "k5"), ("k=9", "k9"), ("logits q^T r only", "logits_qr"),
               ("conv stem", "convstem"), ("4 heads: positional absolute", "pos_absolute"),
               ("4 heads: positional relative (default)", "pos_relative_h4")]  # fmt: skip


def sasa(lines: list[str]) -> None:
    """The SASA ablations: the claimed variants with their seeds (mean +- std), the measured
    seed noise, then the single-seed variants (read against that noise)."""
    title = "### SASA ablations at CPU scale (Ramachandran et al. 2019)"
    names = [f"sasa_{v}" for _, v in SASA_CLAIMS + SASA_SINGLE]
    if not any((RUNS / n).exists() for n in names) and RESULTS.exists():
        old = RESULTS.read_text()  # keep the last regenerated table: its runs are not here
        if title in old:
            block = old[old.index(title):].split("\n#", 1)[0].replace(KEPT_NOTE, "")
            lines += [block.rstrip("\n"), "", KEPT_NOTE, ""]  # idempotent: one note
            return
    lines += [title, "",
              "Every run: 1,000 steps of 64 images (the Table 1 budget), evaluated on all 10,000 "
              "test images; one change from the default (k=7, relative embeddings, q^T k + q^T r "
              "logits, attention stem).", "",
              "| variant (one change from the default) | test acc. (seed 0) | params | "
              "train images/s | train wall | seeds: mean +- std (n) |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    sds = []
    for label, v in SASA_CLAIMS:
        cells, by_run = seed_cells(v, prefix="sasa_")
        accs = list(by_run.values())
        m, sd = mean_std(accs)
        over = f"{100 * m:.1f} +- {100 * sd:.1f}% ({len(accs)})" if accs else "not run"
        sds += [sd] if len(accs) > 1 else []
        lines.append(f"| {label} | {cells} | {over} |")
    for label, v in SASA_SINGLE:
        if (RUNS / f"sasa_{v}").exists():
            lines.append(f"| {label} | {run_cells(RUNS / f'sasa_{v}')[0]} | 1 seed |")
    if sds:
        noise = 100 * (sum(x * x for x in sds) / len(sds)) ** 0.5
        lines += ["", f"Seed noise at this budget (pooled std of the variants with 2+ seeds): "
                  f"{noise:.1f} points; a difference between two means counts only above about "
                  f"twice that ({2 * noise:.1f} points)."]  # fmt: skip
    lines.append("")


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
        lines += [f"#### What the heads of {name} learned", ""]
        figs = r.get("figures", {})
        for fname in figs.values():  # every figure lands in docs/figures/<model>/
            shutil.copy(rep.parent / fname, dst / fname)
        links = [f"[{k.replace('_', ' ')}](figures/{name}/{f})" for k, f in figs.items()]
        lines.append("All figures: " + ", ".join(links) + ".")
        lines.append("")
        for key in INLINE_FIGURES:  # the ones shown inline
            if key in figs:
                lines += [f"![{key}](figures/{name}/{figs[key]})", ""]


def conversion(lines: list[str]) -> None:
    conv = RUNS / "table1_resnet18" / "convert.json"
    if not (RUNS / "table1_resnet18").exists():
        lines += kept("### Theorem 1 on the trained ResNet18", "Lemma 2, error")
    if conv.exists():
        c = json.loads(conv.read_text())
        t = c.get("test_set", {})
        worst = max(r["max_abs_diff"] for r in c["layers"])
        lines += ["### Theorem 1 on the trained ResNet18", "",
                  f"`attnconv convert` replaced its {len(c['layers'])} convolutions by hard "
                  f"quadratic self-attention layers (worst per-layer max |diff| {worst:.1e}). "
                  f"On the {t.get('images', 0)} CIFAR-10 test images: accuracy "
                  f"{100 * t.get('accuracy_before', float('nan')):.2f}% before, "
                  f"{100 * t.get('accuracy_after', float('nan')):.2f}% after, predictions "
                  f"differ on {t.get('predictions_differ', 'n/a')} images, max |logit diff| "
                  f"{t.get('max_abs_logit_diff', float('nan')):.1e}.", ""]  # fmt: skip
    png = ROOT / "benchmarks" / "results" / "convert_lemma2.png"
    if png.exists():  # shown from docs/figures/, beside the page
        FIGS.mkdir(parents=True, exist_ok=True)
        shutil.copy(png, FIGS / png.name)
        lines += ["Lemma 2, error of the soft conversion against alpha (from `attnconv bench "
                  "--suite convert --update-results`):", "",
                  f"![lemma2](figures/{png.name})", ""]  # fmt: skip


def grid_formation(lines: list[str]) -> None:
    """Issue: do the quadratic heads form a grid at a CPU budget? The grid_sa_quadratic run's
    centre log (finished or not) against steps: table at a few steps and a figure."""
    from attnconv.analysis.evolution import evolution_figure, head_evolution

    name = "grid_sa_quadratic"
    log = RUNS / name / "centers.jsonl"
    if not log.exists():
        return
    evo = head_evolution(log)
    cfg = CONFIGS / f"{name}.yaml"
    lines += ["### Do the quadratic heads form a grid? (Cordonnier et al. 2020, fig. 3-4)", "",
              f"`{name}`: sa_quadratic at the Table 1 CPU scale with 20x its budget "
              f"({total_steps(cfg)} steps of {train_config(cfg).batch_size} images, cosine); "
              f"{progress(cfg, RUNS / name)}. "
              "Per layer (1 -> 6), from its centre log (exact: position-only attention does not "
              "depend on the input): centre displacement from step 0 and mean attention "
              "distance in tokens of the 16x16 grid, the largest top-key share of a head (sharp "
              "above 0.5), sharp heads, grid score 3x3/5x5; the sum of the learning rate over "
              "the steps so far (the distance plain SGD moves a parameter per unit gradient).",
              "", "| step | sum of lr | displacement | mean distance | largest peak | sharp heads "
              "| grid 3x3/5x5 |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    picks = sorted({round(i * (len(evo) - 1) / 5) for i in range(6)})
    lr_sum = summed_lr(RUNS / name)
    for e in (evo[i] for i in picks):
        lay = e["layers"]
        lines.append(
            f"| {e['step']} | {lr_sum(e['step']):.0f} | "
            f"{per_layer((x['displacement'] for x in lay), '{:.2f}')} | "
            f"{per_layer(x['mean_distance'] for x in lay)} | "
            f"{per_layer((max(x['peak_mass']) for x in lay), '{:.2f}')} | "
            f"{per_layer((x['sharp_heads'] for x in lay), '{}')} | "
            f"{per_layer((str(x['grid3']) + '/' + str(x['grid5']) for x in lay), '{}')} |"
        )
    FIGS.mkdir(parents=True, exist_ok=True)
    fig = evolution_figure(evo, FIGS / "grid_evolution.png")
    lines += ["", f"![grid evolution](figures/{fig.name})", ""]
    if (RUNS / name / "metrics.csv").exists():
        ips, images = read_metrics(RUNS / name)["images_per_s"], 300 * 50_000
        lines += [f"The reference code's budget (its recipe, configs/sa_quadratic.yaml: 300 epochs "
                  f"of the 50,000 training images, batch 100, hidden 400) is "
                  f"{images / 1e6:.0f}M images, "
                  f"{images / train_config(cfg).batch_size / total_steps(cfg):.0f}x this run's; "
                  f"at this run's measured {ips:.0f} images/s (hidden 64, one core) it would take "
                  f"{images / ips / 3600:.0f} h of one core, a lower bound for hidden 400.",
                  ""]  # fmt: skip
    grid_heads(lines, log)
    grid_sensitivity(lines)


def summed_lr(run: Path):
    """step -> the learning rate summed over the steps up to it, from the run's metrics.csv
    (lr logged every few steps, each logged value standing for the steps since the last log)."""
    rows = [r for r in csv.DictReader(open(run / "metrics.csv")) if r["kind"] == "train"]
    marks, total, last = [(0, 0.0)], 0.0, 0
    for r in sorted(rows, key=lambda r: int(r["step"])):
        step = int(r["step"])
        total += float(r["lr"]) * (step - last)
        marks.append((step, total))
        last = step
    return lambda s: max(t for st, t in marks if st <= s)


def grid_heads(lines: list[str], log: Path) -> None:
    """The grid run's heads: every centre's path (fig. 3), the mass contours at the last logged
    step, and per layer where its sharp heads sit."""
    import numpy as np

    from attnconv.analysis.center_figures import plot_center_trajectories, plot_mass_contours
    from attnconv.analysis.evolution import last_heads, read_evolution

    recs = read_evolution(log)
    steps = np.array([r["step"] for r in recs])
    paths = [np.array([r["layers"][li] for r in recs], dtype=np.float64)
             for li in range(len(recs[0]["layers"]))]  # fmt: skip
    traj = plot_center_trajectories(steps, paths, FIGS / "grid_center_trajectories.png",
                                    unit="step")  # fmt: skip
    step, heads = last_heads(log)
    contours = plot_mass_contours(
        [hd["maps"] for hd in heads], (8, 8), (16, 16), FIGS / "grid_mass_contours.png",
        centers=[hd["centers"] for hd in heads],
        title=f"step {step}: 50% (solid) / 90% (dashed) of each head's mass for the middle "
        "query; x = head centre",
    )
    lines += [f"Where the heads sit at step {step} (offset = the top key minus the query, in "
              "tokens (row, col); a sharp head puts > 50% of its mass there):", "",
              "| layer | sharp heads: offset (top-key share) | the other heads: top-key share |",
              "|---|---|---|"]  # fmt: skip
    for li, hd in enumerate(heads, 1):
        g = hd["score"]
        sharp = sorted((tuple(o), p) for o, p in zip(g.offsets, g.peak_mass) if p > 0.5)
        rest = sorted((p for p in g.peak_mass if p <= 0.5), reverse=True)
        lines.append(f"| {li} | {', '.join(f'({r}, {c}) {p:.2f}' for (r, c), p in sharp) or '-'}"
                     f" | {', '.join(f'{p:.2f}' for p in rest) or '-'} |")  # fmt: skip
    lines += ["", f"![grid centre trajectories](figures/{traj.name})", "",
              f"![grid mass contours](figures/{contours.name})", ""]


def grid_sensitivity(lines: list[str]) -> None:
    """The grid5k_* runs (one change each from grid5k_base, 5,000 steps): where their heads are
    at their last logged step."""
    from attnconv.analysis.evolution import head_evolution

    rows = []
    for cfg in sorted(CONFIGS.glob("grid5k_*.yaml")):
        log = RUNS / cfg.stem / "centers.jsonl"
        if not log.exists():
            continue
        last = head_evolution(log)[-1]
        lay = last["layers"]
        acc = run_cells(RUNS / cfg.stem)[1]
        rows.append(
            f"| {cfg.stem} | {progress(cfg, RUNS / cfg.stem)} | {last['step']} | "
            f"{per_layer((x['displacement'] for x in lay), '{:.2f}')} | "
            f"{per_layer((max(x['peak_mass']) for x in lay), '{:.2f}')} | "
            f"{sum(x['sharp_heads'] for x in lay)} | {sum(x['grid3'] for x in lay)} | "
            f"{'' if acc is None else f'{100 * acc:.1f}%'} |"
        )
    if rows:
        lines += ["#### Sensitivity: one change at a time, 5,000 steps", "",
                  "| run | progress | step | displacement | largest peak | sharp heads (all "
                  "layers) | 3x3 grid score (all layers) | test acc. |",
                  "|---|---|---|---|---|---|---|---|", *rows, ""]  # fmt: skip


def report(runs: Path) -> None:
    global RUNS
    RUNS = runs
    lines = [f"Machine: {platform.machine()}, {platform.processor() or 'CPU'}, "
             f"{os.cpu_count()} cores, Python {platform.python_version()}; "
             "regenerated by `python benchmarks/experiments.py report`.", ""]  # fmt: skip
    walls = [json.loads(p.read_text())["train_seconds"] for p in RUNS.glob("*/wall.json")]
    if walls:
        lines += [f"Wall time of the {len(walls)} training runs: {sum(walls) / 3600:.1f} h in "
                  "all (several ran side by side on the 2 cores).", ""]  # fmt: skip
    table1(lines)
    grid_formation(lines)
    sasa(lines)
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
