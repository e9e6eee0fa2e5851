"""`attnconv demo`: train a CPU-scale quadratic self-attention model for a couple of minutes, then
write its checkpoint, metrics and figures of its heads into a run folder.

Data: ``--data`` if given, else the full CIFAR-10 JPEG zip that ``$ATTNCONV_CIFAR_ZIP`` names
when it is set, else the CIFAR-10 sample embedded in the package, so it runs offline on a fresh
machine. The whole command fits ``--minutes``: after the test images are
decoded, a short timed warm-up of the real training step (real batches, augmentation, optimizer)
and of an evaluation batch measures this machine's throughput; only as many training images as
the time left can use are decoded, and the schedule (steps, cosine to its end) is sized so that
training, the final evaluation and the figures fit the time left, with a margin. A hard time
limit ends training gracefully if the machine slows down later (the summary then says the
schedule did not finish).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import statistics
import time
from pathlib import Path

from .options import check_output_folder

HELP = "train a small quadratic-attention model for ~2 minutes and draw what its heads learned"
log = logging.getLogger(__name__)
MARGIN = 0.8  # plan the steps for this share of the time left (the machine may be shared)
# the time limit stops training only at this multiple of its allotment: a planned schedule
# finishes on a machine up to LIMIT_SLACK / MARGIN times slower than its probe measured (a
# shared machine slows down unannounced); only a far slower one is cut short (and the summary
# says so)
LIMIT_SLACK = 2.0
PROBE_S = 3.0  # a speed probe stops after this many seconds (a slow thread count is seen soon)
PROBE_SHARE = 0.04  # ... or after this share of the budget if less (then 1 thread only)
PROBE_PER_CLASS = 50  # test images per class the speed probe trains on (its batches)
CLASS_STEP = 500  # training images decoded per class: a multiple of this (the decoded cache's key)
MIN_TRAIN_S = 10.0  # training time a demo always gets, however short its budget
# Planning estimate: drawing the figures (matplotlib) costs about as much CPU time as training on
# this many images, so FIGURES_IMAGES / (measured images/s) seconds are kept for them (set from
# short demos on a shared 2-core machine: docs/benchmarks.md, "Figures behind the code's
# comments"). Every demo run prints the figures' actual time beside this plan, so it is
# checked each time.
FIGURES_IMAGES = 4500

# 3 layers x 9 quadratic heads, hidden 64, 4x4 space-to-depth (8x8 tokens); no dropout (short run)
MODEL = {
    "downsample": 4,
    "hidden_size": 64,
    "num_layers": 3,
    "num_heads": 9,
    "ff_size": 128,
    "dropout": 0.0,
    "attn_dropout": 0.0,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        help="dataset (default: the full CIFAR-10 JPEG zip $ATTNCONV_CIFAR_ZIP names, "
        "else the embedded sample)",
    )
    p.add_argument("--out", help="run folder (default: runs/demo-<date>-<time>)")
    p.add_argument(
        "--minutes",
        type=float,
        default=2.0,
        help="time budget of the whole demo, figures included (2)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (as in attnconv train)",
    )
    p.add_argument("--no-figures", action="store_true", help="skip the figures")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (nothing of it is kept)",
    )


def default_data() -> str:
    from attnconv.catalog import cifar_zip

    found = cifar_zip()
    return found if found and Path(found).is_file() else "sample"


def _probe(cfg, ds, threads: int, probe_s: float, steps: int = 6) -> tuple[float, float]:
    """(training images/s, evaluation images/s) of the demo model here with ``threads``: the
    mean over up to ``steps`` real training steps on ``ds`` (loader batches with augmentation,
    forward, cross-entropy, backward, SGD) after one warm-up step (or that step alone),
    stopping after ``probe_s`` seconds, and one timed evaluation batch (of at most 100 images)."""
    import torch
    import torch.nn.functional as F

    from attnconv.data import Loader
    from attnconv.models import create_model
    from attnconv.train.loaders import model_kwargs_for, train_loader

    torch.set_num_threads(threads)
    d, t = cfg.data, cfg.train
    model = create_model(cfg.model.name, **model_kwargs_for(cfg, ds.num_classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = train_loader(cfg, ds)
    times, t0 = [], time.perf_counter()
    for i, (x, y) in enumerate(loader.batches(0)):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        now = time.perf_counter()
        times.append(now - t0)
        t0 = now
        if i == steps or sum(times) > probe_s:  # a slow thread count: its warm-up tells
            break
    eval_loader = Loader(ds, min(100, t.eval_batch_size), shuffle=False, mean=d.mean, std=d.std)
    x, _ = next(eval_loader.batches(0))
    t0 = time.perf_counter()
    with torch.no_grad():
        model.eval()(x)
    timed = times[1:] or times
    return t.batch_size / statistics.mean(timed), len(x) / (time.perf_counter() - t0)


def _last_lr(metrics: Path) -> float | None:
    """The learning rate of the last training row of metrics.csv."""
    with open(metrics, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["kind"] == "train"]
    return float(rows[-1]["lr"]) if rows else None


def _centres_moved(path: Path) -> float | None:
    """Mean distance (tokens) each head's centre travelled, first to last line of centers.jsonl."""
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        first, last = rows[0]["layers"], rows[-1]["layers"]
    except (OSError, ValueError, IndexError, KeyError):
        return None
    d = [math.dist(a, b) for la, lb in zip(first, last) for a, b in zip(la, lb)]
    return sum(d) / len(d) if d else None


def run(args: argparse.Namespace) -> int:
    from attnconv.data import load_dataset
    from attnconv.train.config import apply_overrides, check_training_size, config_from_dict
    from attnconv.train.loaders import model_kwargs_for
    from attnconv.train.optim import lr_at
    from attnconv.train.run import train

    # finite, and so is the time limit made of it (1e308 min would overflow to inf seconds)
    if not math.isfinite(60 * LIMIT_SLACK * args.minutes) or args.minutes <= 0:
        raise ValueError(f"--minutes must be a finite number > 0, got {args.minutes:g}")
    t_start = time.time()
    data = args.data or default_data()
    out = Path(args.out or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    check_output_folder("--out", out)  # a file, or a folder under one: before any work
    if out.exists() and any(out.iterdir()) and not args.overwrite:  # before any work
        what = "a run is already there" if (out / "config.yaml").is_file() else "not empty"
        raise ValueError(
            f"--out {out}: {what}; choose another --out, or pass --overwrite (it replaces "
            "the files a run writes there, nothing else)"
        )
    base = {
        "model": {"name": "sa_quadratic", "kwargs": dict(MODEL)},
        "data": {"dataset": data, "eval_max_per_class": 100},
        "optim": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4},
        "schedule": {"name": "cosine", "warmup": 0.05},
        "train": {"epochs": 1, "batch_size": 50, "log_every": 10, "checkpoint_every": 50},
        "out_dir": str(out),
    }
    cfg = config_from_dict(apply_overrides(base, args.overrides))
    check_training_size(cfg)  # the trainer's bound, before the speed probe builds the model
    d, budget_s = cfg.data, 60 * args.minutes
    log.info(f"demo: reading the test images of {data}")
    eval_ds = load_dataset(d.dataset, d.eval_split, root=d.root, max_per_class=d.eval_max_per_class)
    model_kwargs_for(cfg, eval_ds.num_classes)  # a num_classes other than the data's: refused
    probe_ds = load_dataset(d.dataset, d.eval_split, root=d.root, max_per_class=PROBE_PER_CLASS)
    import torch

    # on a busy machine one thread can beat several by far: measure both, keep the faster; a
    # short budget measures one thread only (several, on a busy machine, took seconds a step)
    probe_s = min(PROBE_S, PROBE_SHARE * budget_s)
    counts = sorted({1, torch.get_num_threads() if probe_s == PROBE_S else 1})
    log.info(
        f"demo: measuring this machine's speed (real training steps, {probe_s:.1f} s for "
        f"{' and '.join(map(str, counts))} thread(s))"
    )
    probes = {n: _probe(cfg, probe_ds, n, probe_s) for n in counts}
    threads = max(probes, key=lambda n: probes[n][0])
    ips, eval_ips = probes[threads]
    cfg.train.threads = cfg.train.threads or threads
    eval_s = len(eval_ds) / eval_ips
    figures_s = 0.0 if args.no_figures else FIGURES_IMAGES / ips

    def train_time() -> float:  # what the budget leaves for training now
        return budget_s - (time.time() - t_start) - eval_s - figures_s

    # decode only the training images the time left can use (the probe trained on test images)
    per_class = math.ceil(ips * max(train_time(), MIN_TRAIN_S) / eval_ds.num_classes / CLASS_STEP)
    if d.max_per_class is None or per_class * CLASS_STEP < d.max_per_class:
        d.max_per_class = per_class * CLASS_STEP
    log.info(
        f"demo: {ips:.0f} training images/s here ({threads} thread(s)); reading at most "
        f"{d.max_per_class} training images per class"
    )
    train_ds = load_dataset(d.dataset, d.train_split, root=d.root, max_per_class=d.max_per_class)
    if len(train_ds) < cfg.train.batch_size:  # the trainer's refusal, before the plan divides
        raise ValueError(  # by the epoch's steps (0)
            f"{train_ds.source}: {len(train_ds)} images, fewer than one batch of "
            f"{cfg.train.batch_size}"
        )
    train_s = max(train_time(), MIN_TRAIN_S)
    if train_time() < MIN_TRAIN_S:  # said up front, never a negative allotment
        over = (time.time() - t_start + MIN_TRAIN_S + eval_s + figures_s) / 60
        log.info(
            f"demo: {args.minutes:g} min is less than this machine needs for the data, "
            f"speed probe, evaluation and figures; training gets its minimum "
            f"{MIN_TRAIN_S:.0f} s and the demo will take about {over:.1f} min"
        )
    steps = max(10, int(ips * MARGIN * train_s / cfg.train.batch_size))
    # at least 6 (short) epochs so centers.jsonl shows the heads' centres moving; eval at the end
    per_epoch = len(train_ds) // cfg.train.batch_size
    cfg.train.epochs = max(6, steps // per_epoch)
    cfg.train.steps_per_epoch = min(per_epoch, max(1, steps // cfg.train.epochs))
    cfg.train.eval_every = cfg.train.epochs
    cfg.train.time_limit = LIMIT_SLACK * train_s
    planned = cfg.train.epochs * cfg.train.steps_per_epoch
    log.info(
        f"demo: {len(train_ds)} training images: planned {planned} steps of "
        f"{cfg.train.batch_size} images ({cfg.train.epochs} short epochs) in {train_s:.0f} s, "
        f"to fit {args.minutes:g} min"
    )
    t_train = time.time()
    last = train(cfg, overwrite=args.overwrite)
    figures = out / "figures"
    t_figures = time.time()
    if not args.no_figures:
        from .analyze import analyze_checkpoint

        analyze_checkpoint(out, figures, num_images=100)
    wall = time.time() - t_start
    took = (
        f"data and speed probe {t_train - t_start:.0f} s, training and evaluation "
        f"{t_figures - t_train:.0f} s (allotted {train_s + eval_s:.0f} s)"
    )
    if not args.no_figures:
        took += f", figures {time.time() - t_figures:.0f} s (allotted {figures_s:.0f} s)"
    step = int(last.get("step", 0))
    lr_end = _last_lr(out / "metrics.csv")
    lr_goal = lr_at(planned - 1, cfg.optim.lr, cfg.schedule, planned, cfg.train.steps_per_epoch)
    n_eval = len(eval_ds)
    print(f"\nThe demo took {wall / 60:.1f} min (budget {args.minutes:g} min): {took}.")
    kw = {**MODEL, **cfg.model.kwargs}  # the model trained: --set model.kwargs.* included
    print(
        f"It trained {cfg.model.name} ({kw['num_layers']} layers of {kw['num_heads']} "
        f"attention heads) on {len(train_ds)} images of {data} for {step} steps of "
        f"{cfg.train.batch_size} images ({step * cfg.train.batch_size} images seen)."
    )
    if step >= planned:
        print(
            f"The learning rate followed its {cfg.schedule.name} schedule to the end "
            f"({cfg.optim.lr:g} -> {lr_end:.2g})."
        )
    else:
        print(
            f"The time limit stopped training at step {step} of {planned}: the schedule did "
            f"not finish (learning rate {lr_end:.3g}, it would have ended at {lr_goal:.2g}); "
            "this machine was slower than measured at the start."
        )
    print(
        f"Test accuracy: {100 * last.get('eval_acc', 0):.1f}% on {n_eval} test images "
        f"(chance: {100 / train_ds.num_classes:.0f}%)."
    )
    moved = _centres_moved(out / "centers.jsonl")
    if moved is not None:
        print(
            f"The Gaussian centres moved {moved:.2f} tokens on average (each head's centre, "
            "start to end). The grid of the paper's fig. 3 forms over thousands of steps, not "
            "minutes: docs/experiments.md shows it in a 150,000-step run (grid_long)."
        )
    _offer_pretrained()
    print(f"\nrun folder: {out.resolve()}")
    print(f"  checkpoint  {out / 'checkpoints'} (attnconv eval {out})")
    print(f"  metrics     {out / 'metrics.csv'}, head centres per epoch {out / 'centers.jsonl'}")
    if not args.no_figures:
        print(f"  figures     {figures / 'index.html'} ({figures / 'index.md'})")
    return 0


def _offer_pretrained() -> None:
    """The demo's closing offer: the shipped model trained to the grid (one command)."""
    from attnconv.catalog import PretrainedError, pretrained_info

    try:
        card = pretrained_info("sa_quadratic")  # its default tag
    except PretrainedError:  # no sa_quadratic ships
        return
    print(
        f"That run ships trained: {card['name']} ({card['steps']:,} steps, "
        f"{100 * card['test_accuracy']:.1f}% on the test set). Open its heads with:\n"
        f"  attnconv explore {card['name']} --out grid.html"
    )
