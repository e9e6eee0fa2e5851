"""`attnconv demo`: train a CPU-scale quadratic self-attention model for a couple of minutes, then
write its checkpoint, metrics and figures of its heads into a run folder.

Data: ``--data`` if given, else the full CIFAR-10 JPEG zip at ``../shared/data/cifar10-jpeg.zip``
(or ``$ATTNCONV_CIFAR_ZIP``) when it exists, else the CIFAR-10 sample embedded in the package, so
it runs offline on a fresh machine. The number of steps is planned from a throughput probe to fit
``--minutes``; a hard time limit (25% more) ends training gracefully if the machine is slower.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

HELP = "train a small quadratic-attention model for ~2 minutes and draw what its heads learned"

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
        help="dataset (default: ../shared/data/cifar10-jpeg.zip if found, "
        "else the embedded sample)",
    )
    p.add_argument("--out", help="run folder (default: runs/demo-<date>-<time>)")
    p.add_argument("--minutes", type=float, default=2.0, help="training time budget (2)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (as in attnconv train)",
    )
    p.add_argument("--no-figures", action="store_true", help="skip the figures")


def default_data() -> str:
    for cand in (os.environ.get("ATTNCONV_CIFAR_ZIP"), "../shared/data/cifar10-jpeg.zip"):
        if cand and Path(cand).is_file():
            return cand
    return "sample"


def _throughput(cfg, num_classes: int, threads: int) -> float:
    """Training images/s of the demo model here (median of 3 steps after a warm-up)."""
    import torch
    import torch.nn.functional as F

    from attnconv.models import create_model

    torch.set_num_threads(threads)
    model = create_model(cfg.model.name, num_classes=num_classes, **cfg.model.kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(cfg.train.batch_size, 3, 32, 32)
    y = torch.randint(0, num_classes, (cfg.train.batch_size,))
    times = []
    for _ in range(4):
        t = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return cfg.train.batch_size / sorted(times[1:])[1]


def run(args: argparse.Namespace) -> int:
    from attnconv.data import load_dataset
    from attnconv.train.config import apply_overrides, config_from_dict
    from attnconv.train.loop import train

    if args.minutes <= 0:
        raise ValueError(f"--minutes must be > 0, got {args.minutes}")
    data = args.data or default_data()
    out = Path(args.out or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    base = {
        "model": {"name": "sa_quadratic", "kwargs": dict(MODEL)},
        "data": {"dataset": data, "eval_max_per_class": 100},
        "optim": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4},
        "schedule": {"name": "cosine", "warmup": 0.05},
        "train": {"epochs": 1, "batch_size": 50, "log_every": 10, "checkpoint_every": 50},
        "out_dir": str(out),
    }
    cfg = config_from_dict(apply_overrides(base, args.overrides))
    t0 = time.time()
    train_ds = load_dataset(
        cfg.data.dataset,
        cfg.data.train_split,
        root=cfg.data.root,
        max_per_class=cfg.data.max_per_class,
    )
    import torch

    # on a busy machine one thread can beat several by far: measure both, keep the faster
    ips, threads = max(
        (_throughput(cfg, train_ds.num_classes, n), n) for n in sorted({1, torch.get_num_threads()})
    )
    cfg.train.threads = cfg.train.threads or threads
    budget = 60 * args.minutes - (time.time() - t0)
    steps = max(10, int(ips * budget * 0.85 / cfg.train.batch_size))  # eval + saving take a bit
    # at least 6 (short) epochs so centers.jsonl shows the heads' centres moving; eval at the end
    per_epoch = len(train_ds) // cfg.train.batch_size
    cfg.train.epochs = max(6, steps // per_epoch)
    cfg.train.steps_per_epoch = min(per_epoch, max(1, steps // cfg.train.epochs))
    cfg.train.eval_every = cfg.train.epochs
    cfg.train.time_limit = 1.25 * max(budget, 10.0)
    n_img = cfg.train.epochs * cfg.train.steps_per_epoch * cfg.train.batch_size
    print(
        f"demo: {cfg.model.name} {cfg.model.kwargs} on {data} ({len(train_ds)} training images); "
        f"~{ips:.0f} images/s here ({threads} thread(s)) -> {cfg.train.epochs} epoch(s), "
        f"{n_img} images; run folder {out}"
    )
    last = train(cfg)
    print(
        f"demo: trained {last.get('step')} steps in {last.get('seconds', 0):.0f} s; "
        f"test accuracy {100 * last.get('eval_acc', 0):.1f}% on "
        f"{cfg.data.eval_max_per_class} images per class"
    )
    figures = out / "figures"
    if not args.no_figures:
        from .analyze import analyze_checkpoint

        report = analyze_checkpoint(out, figures, num_images=100)
        print(f"wrote {len(report['figures'])} figures to {figures}")
    print(f"\nrun folder: {out.resolve()}")
    print(f"  checkpoint  {out / 'checkpoints'} (attnconv eval {out})")
    print(f"  metrics     {out / 'metrics.csv'}, head centres per epoch {out / 'centers.jsonl'}")
    if figures is not None and not args.no_figures:
        print(f"  figures     {figures / 'index.html'} ({figures / 'index.md'})")
    return 0
