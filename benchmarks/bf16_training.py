"""Does bf16 autocast train each Table 1 model as well as float32? Accuracy at a fixed budget.

    python benchmarks/bf16_training.py run [--jobs 3] [--steps 50] [--seeds 0 1]
    python benchmarks/bf16_training.py report

`run` trains every model of the Table 1 experiment (configs/experiments/table1_*.yaml: its
geometry, optimizer and schedule) on real CIFAR-10 for the same small budget (``--steps``
steps of ``--batch`` images, the same seeds, the same data order) in float32 and under bf16
autocast, into runs/bf16_training/<model>_<fp32|bf16>_s<seed>/ (a finished run is skipped);
each is evaluated on the first ``--eval-per-class`` test images of every class. `report`
writes benchmarks/results/bf16_training.md and the bf16-training block of
docs/benchmarks/precision.md:
per model, the test accuracy of every seed in both precisions, the seed-to-seed spreads (the
noise), the bf16 - fp32 difference of the means, and the training throughput of each run (its
metrics.csv; runs side by side on a shared machine, so the interleaved ``attnconv bench --suite
models`` is the speed-up to quote). bf16 counts as verified for a model when |mean bf16 - mean
fp32| <= max(fp32 spread, bf16 spread, 1 point).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from attnconv.bench.models_report import replace_block
from attnconv.catalog import RECIPES
from attnconv.device import bf16_passed_over
from experiments_runs import default_data  # beside this file

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = RECIPES / "experiments"
RUNS = ROOT / "runs" / "bf16_training"
RESULTS = ROOT / "benchmarks" / "results" / "bf16_training.md"
DOCS = ROOT / "docs" / "benchmarks" / "precision.md"  # the page that shows the block
BEGIN, END = "<!-- bf16-training:begin -->", "<!-- bf16-training:end -->"
CLI = [sys.executable, "-m", "attnconv.cli"]
# (row name, experiment config, extra overrides)
MODELS = [
    ("sa_quadratic", "table1_sa_quadratic", []),
    (
        "sa_quadratic attn dropout 0.1 (batch mask)",
        "table1_sa_quadratic",
        ["model.kwargs.attn_dropout=0.1", "model.kwargs.attn_dropout_mask=batch"],
    ),
    ("sa_learned", "table1_sa_learned", []),
    ("sa_learned_content", "table1_sa_learned_content", []),
    ("resnet18_cifar", "table1_resnet18", []),
]
PRECISIONS = ("fp32", "bf16")


def run_dir(i: int, precision: str, seed: int) -> Path:
    return RUNS / f"{i}_{MODELS[i][1]}_{precision}_s{seed}"


def train_one(i: int, precision: str, seed: int, args: argparse.Namespace) -> str:
    out = run_dir(i, precision, seed)
    if read_run(out) is not None:
        return f"skip {out.name}"
    out.mkdir(parents=True, exist_ok=True)
    _, config, extra = MODELS[i]
    sets = [
        f"data.dataset={args.data}",
        "data.eval_max_per_class=" + str(args.eval_per_class),
        "train.epochs=1",
        f"train.steps_per_epoch={args.steps}",
        f"train.batch_size={args.batch}",
        f"train.seed={seed}",
        f"train.bf16={'true' if precision == 'bf16' else 'false'}",
        "train.checkpoint_every=0",
        f"train.log_every={args.steps}",
        "train.threads=1",
        *extra,
    ]
    cmd = [*CLI, "train", str(CONFIGS / f"{config}.yaml"), "--out", str(out), "--overwrite"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.time()
    with open(out / "run.log", "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if rc != 0:
        return f"FAILED {out.name} (exit {rc}, see {out / 'run.log'})"
    return f"done {out.name} in {time.time() - t0:.0f} s"


def run(args: argparse.Namespace) -> None:
    if not Path(args.data).exists():
        raise SystemExit(f"--data {args.data}: no such file")
    # attnconv train runs float32 where bf16 autocast would slow it: the bf16 runs would be
    # float32 runs, and the comparison empty
    passed_over = bf16_passed_over(torch.device("cpu"))
    if passed_over:
        raise SystemExit(
            f"bf16 autocast is passed over on this machine ({passed_over}): run "
            "the comparison where it is not"
        )
    # the slowest model first, so the jobs finish together
    order = sorted(range(len(MODELS)), key=lambda i: "content" not in MODELS[i][0])
    picked = [i for i in order if not args.models or MODELS[i][0] in args.models]
    jobs = [(i, p, s) for s in args.seeds for i in picked for p in PRECISIONS]
    with ThreadPoolExecutor(args.jobs) as pool:
        for msg in pool.map(lambda j: train_one(*j, args), jobs):
            print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def read_run(path: Path) -> dict | None:
    """A finished run's test accuracy (%) and training img/s, or None."""
    if not (path / "metrics.csv").exists():
        return None
    rows = list(csv.DictReader(open(path / "metrics.csv")))
    ev = [r for r in rows if r["kind"] == "eval"]
    tr = [r for r in rows if r["kind"] == "train"]
    if not ev or not tr:
        return None
    return {"acc": 100 * float(ev[-1]["acc"]), "img_s": float(tr[-1]["images_per_s"])}


def spread(v: list[float]) -> float | None:
    return max(v) - min(v) if len(v) > 1 else None


def report(args: argparse.Namespace) -> str:
    lines = [
        "| model | fp32 test acc % (seeds) | bf16 test acc % (seeds) | fp32 / bf16 seed spread "
        "| bf16 - fp32 (means) | fp32 / bf16 img/s (training runs) | bf16 verified |",
        "|---|---|---|---|---|---|---|",
    ]
    budget = (
        f"{args.steps} SGD steps of {args.batch} images (same seed, same data order), "
        f"evaluated on {args.eval_per_class} test images per class"
    )
    for i, (name, _, _) in enumerate(MODELS):
        res = {p: [r for s in args.seeds if (r := read_run(run_dir(i, p, s)))] for p in PRECISIONS}
        if not all(res.values()):
            lines.append(f"| {name} | not run | | | | | |")
            continue
        acc = {p: [r["acc"] for r in res[p]] for p in PRECISIONS}
        ips = {p: statistics.median(r["img_s"] for r in res[p]) for p in PRECISIONS}
        diff = statistics.mean(acc["bf16"]) - statistics.mean(acc["fp32"])
        spreads = [spread(acc[p]) for p in PRECISIONS]
        noise = max([v for v in spreads if v is not None] + [1.0])
        ok = "yes" if abs(diff) <= noise else "no"
        if None in spreads:
            ok = "not resolved (one seed: noise not measured)"
        lines.append(
            f"| {name} | {' / '.join(f'{a:.1f}' for a in acc['fp32'])} "
            f"| {' / '.join(f'{a:.1f}' for a in acc['bf16'])} "
            f"| {' / '.join('-' if v is None else f'{v:.1f}' for v in spreads)} | {diff:+.1f} "
            f"| {ips['fp32']:.1f} / {ips['bf16']:.1f} | {ok} |"
        )
    cmd = "python benchmarks/bf16_training.py run && python benchmarks/bf16_training.py report"
    note = (
        f"Regenerated by `{cmd}` (seeds {' '.join(map(str, args.seeds))}). Budget per run: "
        + budget
        + "; the rest of each configs/experiments/table1_* config. Verified: |bf16 - fp32| "
        "<= max(seed spread, 1 point). img/s: the training runs' own, run side by side on a "
        "shared machine; the interleaved speed-up is `attnconv bench --suite models`."
    )
    text = note + "\n\n" + "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    replace_block(text, DOCS, BEGIN, END)
    print(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("run", "report"))
    ap.add_argument("--data", default=str(default_data()), help="CIFAR-10 (cifar10-jpeg.zip)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--eval-per-class", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument(
        "--models",
        nargs="+",
        choices=[m[0] for m in MODELS],
        help="only these rows of the table (default: all)",
    )
    ap.add_argument("--jobs", type=int, default=3, help="runs side by side (one thread each)")
    args = ap.parse_args()
    run(args) if args.action == "run" else report(args)


if __name__ == "__main__":
    main()
