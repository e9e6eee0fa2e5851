"""Every ordering the experiments page states between two models, with the page's one test
(experiments_stats.py: Welch's t-test, an order claimed only at p < 0.05): the report's section
of tests, read from the run folders only (final test accuracies from metrics.csv, seeds from
config.yaml, machines from machines.jsonl where a run logged them, mean attention distances from
the analyzed runs' report.json). A side with one run gets no test and says so."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from experiments_long import gpu_rate
from experiments_runs import finished, read_metrics
from experiments_stats import p_text, welch

TITLE = "### The tests behind the page's orderings"

T1, LONG, SASA = "Table 1, 1,000 steps", "150,000 steps", "SASA, 1,000 steps"
# (what was measured, label A, run A, label B, run B): each run with its _seed<N> repeats
COMPARISONS = (
    (T1, "resnet18", "table1_resnet18", "sa_learned", "table1_sa_learned"),
    (T1, "resnet18", "table1_resnet18", "sa_quadratic", "table1_sa_quadratic"),
    (T1, "sa_learned", "table1_sa_learned", "sa_quadratic", "table1_sa_quadratic"),
    (T1, "sa_learned", "table1_sa_learned", "sa_learned_content", "table1_sa_learned_content"),
    (T1, "sa_quadratic", "table1_sa_quadratic", "sa_learned_content", "table1_sa_learned_content"),
    (T1, "sa_quadratic", "table1_sa_quadratic", "sa_quadratic bf16", "table1_sa_quadratic_bf16"),
    (T1, "sa_learned", "table1_sa_learned", "sa_learned, BERT's init", "table1_sa_learned_bert"),
    (
        T1,
        "sa_learned seed 1, 30% warm-up",
        "table1_sa_learned_warmup_seed1",
        "sa_learned seed 1, 5%",
        "table1_sa_learned_seed1",
    ),
    (LONG, "ResNet18 (widths 16-128)", "resnet18_long", "sa_quadratic", "grid_long"),
    (LONG, "ResNet18 (widths 11-88)", "resnet18_matched_long", "sa_quadratic", "grid_long"),
    (SASA, "k=7", "sasa_k7", "k=3", "sasa_k3"),
    (SASA, "k=5", "sasa_k5", "k=3", "sasa_k3"),
    (SASA, "k=7", "sasa_k7", "k=5", "sasa_k5"),
    (SASA, "k=9", "sasa_k9", "k=7", "sasa_k7"),
    (SASA, "relative positions (k=7)", "sasa_k7", "none", "sasa_pos_none"),
    (SASA, "conv stem", "sasa_convstem", "attention stem (k=7)", "sasa_k7"),
    (SASA, "q^T k + q^T r (k=7)", "sasa_k7", "q^T r", "sasa_logits_qr"),
    (SASA, "relative, 4 heads", "sasa_pos_relative_h4", "absolute, 4 heads", "sasa_pos_absolute"),
)
HEADS = "Table 1 heads, mean attention distance (px)"
TRAINED, STEP0 = "analysis", "analysis_init"  # the analyzed run after training, at step 0
LEARNED, CONTENT = "table1_sa_learned", "table1_sa_learned_content"
HEAD_COMPARISONS = (  # (label A, run A, folder A, label B, run B ('': run A), folder B)
    ("sa_learned", LEARNED, TRAINED, "its step 0", "", STEP0),
    ("sa_learned_content", CONTENT, TRAINED, "its step 0", "", STEP0),
    ("sa_learned", LEARNED, TRAINED, "sa_learned_content", CONTENT, TRAINED),
)


def seeds_of(runs: Path, base: str) -> list[Path]:
    """``base`` and its finished ``base``_seed<N> repeats under ``runs`` (``base`` first)."""
    found = [runs / base] + sorted(runs.glob(f"{base}_seed*"), key=lambda p: p.name)
    return [p for p in found if finished(p)]


def accuracy(run: Path) -> float:
    return 100 * read_metrics(run)["test_acc"]


def distance(run: Path, folder: str) -> float | None:
    """The mean attention distance (px) of the analyzed run: over its heads, then its layers."""
    rep = run / folder / "report.json"
    if not rep.exists():
        return None
    dist = json.loads(rep.read_text())["mean_distance_px"]
    return sum(sum(d) / len(d) for d in dist) / len(dist)


def seed(run: Path) -> int:
    import yaml

    return int(yaml.safe_load((run / "config.yaml").read_text())["train"]["seed"])


def machines(run: Path) -> tuple[set[str], int]:
    """The machine names a run logged (machines.jsonl; empty where it logged none) and its
    training rows logged at a GPU's rate (experiments_long.gpu_rate)."""
    log, names = run / "machines.jsonl", set()
    if log.exists():
        for line in log.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                names.add(rec.get("name", rec.get("device", "?")).replace("(R)", ""))
    rows = [r for r in csv.DictReader(open(run / "metrics.csv")) if r["kind"] == "train"]
    rate = gpu_rate(run)
    return names, sum(float(r["images_per_s"]) > rate for r in rows)


def varied(a: list[Path], b: list[Path]) -> str:
    """What differs between the runs compared besides the model: their seeds, and the machines
    as their logs record them (machines.jsonl; GPU rows from the logged rates)."""
    seeds = sorted({seed(r) for r in a + b})
    span = f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 2 else ", ".join(map(str, seeds))
    out, unlogged, runs = (
        [f"seed{'s' if len(seeds) > 1 else ''} {span}"],
        0,
        list(dict.fromkeys(a + b)),
    )
    for r in runs:
        names, gpu = machines(r)
        unlogged += not names
        out += [f"{r.name} logged {'; '.join(sorted(names))}"] if names else []
        out += [f"{r.name} {gpu} GPU rows"] if gpu else []
    if unlogged:
        n = f"{unlogged} of {len(runs)} runs" if unlogged < len(runs) else f"all {len(runs)} runs"
        n = "both runs" if n == "all 2 runs" else n
        out.append(f"no machine log ({n})")
    return "; ".join(out)


def row(what: str, la: str, lb: str, a: list[float], b: list[float], hw: str, unit: str) -> str:
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    w = welch(a, b)
    head = f"| {what} | {la} - {lb} | {hw} | {len(a)} and {len(b)} | {ma:.2f} - {mb:.2f} "
    if w is None:
        return head + f"= {ma - mb:+.2f}{unit} | | | single run on a side: no test |"
    verdict = f"{la} {'>' if w.diff > 0 else '<'} {lb}" if w.ordered else "not told apart"
    return (
        head + f"= {w.diff:+.2f}{unit} | [{w.low:+.2f}, {w.high:+.2f}] | "
        f"{w.t:.2f}, {w.df:.1f} | {p_text(w.p)} | {verdict} |"
    )


def tests_section(lines: list[str], runs: Path) -> None:
    """The table of every comparison whose runs have finished under ``runs``."""
    rows = []
    for what, la, ra, lb, rb in COMPARISONS:
        a, b = seeds_of(runs, ra), seeds_of(runs, rb)
        if ra.endswith("_seed1"):  # a named seed: that run alone
            a, b = a[:1], b[:1]
        if a and b:
            accs = [accuracy(r) for r in a], [accuracy(r) for r in b]
            rows.append(row(what, la, lb, *accs, varied(a, b), ""))
    for la, ra, fa, lb, rb, fb in HEAD_COMPARISONS:
        a, b = seeds_of(runs, ra), seeds_of(runs, rb or ra)
        da = [d for d in (distance(r, fa) for r in a) if d is not None]
        db = [d for d in (distance(r, fb) for r in b) if d is not None]
        if da and db:
            rows.append(row(HEADS, la, lb, da, db, varied(a, b), " px"))
    if not rows:
        return
    lines += [
        TITLE,
        "",
        "Every ordering between two models that this page states, with its test: the difference "
        "of the means of their final test accuracies on the 10,000 test images (in points; the "
        "heads rows: the mean attention distance over heads and layers, in image pixels), its "
        "95% interval, Welch's t and its degrees of freedom, the two-sided p, n (runs on each "
        "side) and what varied between the runs besides the model (GPU rows: training rows "
        "logged at a GPU's rate, as in the long-budget table). The verdict follows the rule "
        'of "The one test" above; a side with one run gets no test. Generated by `python '
        "benchmarks/experiments.py report` from the run folders "
        "(benchmarks/experiments_tests.py).",
        "",
        "| measured | A - B | what varied | n | mean A - mean B | 95% interval | Welch t, df "
        "| p | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
