"""Table 1 at a real budget (the report's section; Cordonnier et al. 2020, Table 1): grid_long
(sa_quadratic) and resnet18_long (Table 1's quarter-width ResNet18) trained with the same
150,000 steps of 64 images, schedule and augmentation, their test accuracy at every evaluation
side by side, from the two run folders only."""

from __future__ import annotations

import csv
from pathlib import Path

from experiments_runs import finished, kept, n_params, read_metrics, summed_lr
from experiments_stats import verdict

TITLE = "### Table 1 at grid_long's budget: sa_quadratic against ResNet18 trained as long"
RUNS_COMPARED = (("sa_quadratic", "grid_long"), ("ResNet18", "resnet18_long"))
# more seeds of a compared model at the same budget, shown once finished (the seed spread)
SEED_RUNS = (("ResNet18 seed 1", "resnet18_long_seed1"), ("sa_quadratic seed 1", "grid_long_seed1"))


def evals(run: Path) -> dict[int, float]:
    """step -> test accuracy of every evaluation in the run's metrics.csv."""
    rows = csv.DictReader(open(run / "metrics.csv"))
    return {int(r["step"]): float(r["acc"]) for r in rows if r["kind"] == "eval"}


def train_acc_end(run: Path, last: int = 750) -> float:
    """Training accuracy over the run's last ``last`` steps (the logged windows, weighted by
    their steps): the fit of the training set, beside the test accuracy."""
    rows = [r for r in csv.DictReader(open(run / "metrics.csv")) if r["kind"] == "train"]
    end = int(rows[-1]["step"])
    prev, acc, n = None, 0.0, 0
    for r in rows:
        step = int(r["step"])
        if step > end - last and prev is not None:
            acc, n = acc + float(r["acc"]) * (step - prev), n + step - prev
        prev = step
    return acc / n if n else float("nan")


GPU_RATE = 900.0  # img/s: no CPU run of these models logged more (ResNet18's up to 660)
# sa_quadratic (hidden 64 and 128): its CPU rows reach 183 img/s (grid_long as two processes),
# its GPU rows start at 474 (a row whose window began before a GPU stretch); an H200's 750-3,070
MODEL_GPU_RATE = {"sa_quadratic": 300.0}


def gpu_rate(run: Path) -> float:
    """The images/s above which a training row of ``run``'s model ran on a GPU."""
    import yaml

    name = yaml.safe_load((run / "config.yaml").read_text())["model"]["name"]
    return MODEL_GPU_RATE.get(name, GPU_RATE)


def hardware(run: Path) -> tuple[float, str]:
    """(median images/s of the CPU rows, where GPU rows were) of a run's training rows: a row
    logged above its model's gpu_rate ran on a GPU."""
    rows = [r for r in csv.DictReader(open(run / "metrics.csv")) if r["kind"] == "train"]
    rate = gpu_rate(run)
    cpu = sorted(float(r["images_per_s"]) for r in rows if float(r["images_per_s"]) <= rate)
    gpu = [int(r["step"]) for r in rows if float(r["images_per_s"]) > rate]
    where = f"{len(gpu)} of {len(rows)} rows, steps {min(gpu):,}-{max(gpu):,}" if gpu else "none"
    return (cpu[len(cpu) // 2] if cpu else float("nan")), where


def long_budget(lines: list[str], runs: Path) -> None:
    folders = [runs / run for _, run in RUNS_COMPARED]
    if not all(finished(f) for f in folders):  # a complete wall.json, as the runner reads it
        lines += kept(TITLE, "\n### ")
        return
    shown = [*RUNS_COMPARED, *((m, r) for m, r in SEED_RUNS if finished(runs / r))]
    folders = [runs / run for _, run in shown]
    curves = [evals(f) for f in folders]
    lr = summed_lr(folders[0])
    extra = [m.split(" seed")[0] for m, _ in shown[len(RUNS_COMPARED) :]]
    seeds = "one seed each" if not extra else f"seed 0 each, and seed 1 of {' and '.join(extra)}"
    lines += [
        TITLE,
        "",
        f"{seeds[0].upper() + seeds[1:]}, float32, on CPUs (and a GPU where the GPU rows "
        f"column says so: a training row logged above {MODEL_GPU_RATE['sa_quadratic']:.0f} "
        f"img/s for sa_quadratic, {GPU_RATE:.0f} for ResNet18); the same recipe as every Table 1 "
        "run (SGD 0.1, momentum 0.9, cosine with 5% warm-up per step, crop + flip, the "
        "reference's weight decay) for 150,000 steps of 64 images. Test accuracy on the 10,000 "
        "test images:",
        "",
        "| step | images seen | summed lr | " + " | ".join(f"{m} (`{r}`)" for m, r in shown) + " |",
        "|---" * (3 + len(shown)) + "|",
    ]
    for step in sorted(set.intersection(*(set(c) for c in curves))):
        accs = " | ".join(f"{100 * c[step]:.1f}%" for c in curves)
        lines.append(f"| {step:,} | {64 * step / 1e6:.2f}M | {lr(step):,.0f} | {accs} |")
    rows, final = [], []
    for (model, _), f in zip(shown, folders):
        m = read_metrics(f)
        final.append(100 * m["test_acc"])
        cpu_ips, gpu_rows = hardware(f)
        rows.append(
            f"| {model} | {n_params(f) / 1e6:.2f}M | {100 * m['test_acc']:.2f}% | "
            f"{100 * train_acc_end(f):.1f}% | {cpu_ips:.0f} | {gpu_rows} |"
        )
    lines += [
        "",
        "| model | params | final test acc. | train acc. (last 750 steps) | CPU images/s "
        "(median of CPU rows) | GPU rows |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    if len(shown) > 2:  # the seed spread beside the models' gap
        lines += [seed_spread([m for m, _ in shown], final), ""]


WORDS = {2: "two", 3: "three"}


def seed_spread(names: list[str], final: list[float]) -> str:
    """Each model's seeds apart, and ResNet18 minus sa_quadratic over every pair of seeds."""
    by_model: dict[str, list[float]] = {}
    for name, acc in zip(names, final):
        by_model.setdefault(name.split(" seed")[0], []).append(acc)
    out = [
        f"{model}'s {WORDS.get(len(accs), len(accs))} seeds end "
        f"{max(accs) - min(accs):.2f} points apart "
        f"({' and '.join(f'{a:.2f}%' for a in accs)})"
        for model, accs in by_model.items()
        if len(accs) > 1
    ]
    gaps = [r - q for r in by_model["ResNet18"] for q in by_model["sa_quadratic"]]
    pairs = len(gaps)
    gap = f"{gaps[0]:+.2f}" if pairs == 1 else f"{min(gaps):+.2f} to {max(gaps):+.2f}"
    test = verdict("ResNet18", "sa_quadratic", by_model["ResNet18"], by_model["sa_quadratic"])
    return (
        "; ".join(out)
        + f". ResNet18 minus sa_quadratic over the {pairs} pairs of seeds: {gap} points. "
        + f"The page's test (seeds varied; runs moved between machines): {test}."
    )
