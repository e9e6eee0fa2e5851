"""One experiment's run folder read back (its config's budget, its progress, its metrics), for
the runner (benchmarks/experiments.py) and the report (experiments_report.py,
experiments_grid.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from attnconv.catalog import RECIPES

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = RECIPES / "experiments"
FIGS = ROOT / "docs" / "figures"
RESULTS = ROOT / "benchmarks" / "results" / "experiments.md"  # the last regenerated report


def default_data() -> Path:
    """The real CIFAR-10 JPEG zip in a ``shared/data`` folder above the repository."""
    for parent in ROOT.parents:
        if (p := parent / "shared" / "data" / "cifar10-jpeg.zip").exists():
            return p
    return ROOT.parent / "shared" / "data" / "cifar10-jpeg.zip"


def train_config(cfg: Path):
    """An experiment's ``train`` section (its steps and batch)."""
    from attnconv.train.config import load_config

    return load_config(cfg).train


def total_steps(cfg: Path, t=None, n_train: int = 50_000) -> int:
    """Training steps an experiment's config asks for, as the trainer counts them: an epoch is
    ``steps_per_epoch`` batches capped at one pass over the ``n_train`` training images (the
    last partial batch dropped); ``t``: its train section, if already read."""
    t = t or train_config(cfg)
    per_pass = n_train // t.batch_size
    return t.epochs * (min(per_pass, t.steps_per_epoch) if t.steps_per_epoch else per_pass)


def finished(run: Path) -> bool:
    """Whether ``run`` is a finished run: its wall.json (written last, atomically, by the runner)
    reads back as complete JSON with its training seconds. An empty or cut file (a copy or a
    write killed half-way) is not a finish."""
    try:
        wall = json.loads((run / "wall.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(wall, dict) and isinstance(wall.get("train_seconds"), (int, float))


def progress(cfg: Path, out: Path) -> str:
    """'done', 'not started', or 'step S of N (P%), ~H h left at R img/s' from the run folder's
    metrics.csv (the steps a resume restarts from are those of its last checkpoint)."""
    if finished(out):
        return "done"
    if (out / "wall.json").exists():  # never taken for a finish, nor trained again by `run`
        return "wall.json damaged (not a finished run; `run --rerun NAME` trains it again)"
    rows = list(csv.DictReader(open(out / "metrics.csv"))) if (out / "metrics.csv").exists() else []
    train = [r for r in rows if r["kind"] == "train"]
    if not train:
        return "not started"
    t = train_config(cfg)
    step, n = int(train[-1]["step"]), total_steps(cfg, t)
    ips = sorted(float(r["images_per_s"]) for r in train[-20:])[len(train[-20:]) // 2]
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
    """The model's parameters, built from the run's config.yaml (no checkpoint needed: the
    archive keeps none of a finished run)."""
    import yaml

    from attnconv.models import create_model

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    model = create_model(cfg["model"]["name"], **{"num_classes": 10, **cfg["model"]["kwargs"]})
    return sum(p.numel() for p in model.parameters())


def run_cells(run: Path) -> tuple[str, float | None]:
    """The table cells 'test acc. | params | train images/s | train wall' of a run folder, and
    its test accuracy (None, with empty cells, for a run not finished)."""
    if not finished(run):
        return "not run | | |", None
    m, wall = read_metrics(run), json.loads((run / "wall.json").read_text())
    cells = (
        f"{100 * m['test_acc']:.1f}% | {n_params(run) / 1e6:.2f}M | "
        f"{m['images_per_s']:.0f} | {wall['train_seconds'] / 60:.1f} min"
    )
    return cells, m["test_acc"]


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


def planned_lr_sum(cfg: Path, n_train: int = 50_000) -> tuple[int, float]:
    """A config's planned steps and the sum of its schedule's learning rate over them (the
    trainer's schedule, attnconv.train.optim.lr_at; epochs as total_steps counts them)."""
    from attnconv.train.config import load_config
    from attnconv.train.optim import lr_at

    c = load_config(cfg)
    total = total_steps(cfg, c.train, n_train)
    spe = total // c.train.epochs
    return total, sum(lr_at(s, c.optim.lr, c.schedule, total, spe) for s in range(total))


KEPT = "(Kept from its last regeneration: its run folders are not under this run root.)"


def kept(start: str, stop: str | tuple[str, ...] | None) -> list[str]:
    """The last regenerated report's lines from heading ``start`` up to heading ``stop`` (the
    first of several that the report holds), with one KEPT note: a section whose runs are not
    here is kept, not replaced by empty cells."""
    old = RESULTS.read_text() if RESULTS.exists() else ""
    if start not in old:
        return []
    block = old[old.index(start) :]
    stops = (stop,) if isinstance(stop, str) else stop or ()
    ends = [e for e in (block.find(s, len(start)) for s in stops) if e >= 0]
    end = min(ends) if ends else -1
    if end >= 0:
        block = block[:end]
    block = block.replace(KEPT, "").rstrip("\n")
    return [block, "", KEPT, ""]
