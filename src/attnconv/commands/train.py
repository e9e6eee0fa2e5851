"""`attnconv train CONFIG.yaml [--set key=value ...] [--resume]` (also under torchrun)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .options import add_device

HELP = "train a model from a YAML config (resumable; torchrun for several processes)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config (see configs/ and configs/cpu/)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set optim.lr=0.05 (repeatable)",
    )
    p.add_argument("--out", help="run folder (default: config out_dir or runs/<config name>)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue exactly from the run folder's latest checkpoint",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a run already in the run folder (refused otherwise)",
    )
    p.add_argument(
        "--stop-at-step",
        type=int,
        default=None,
        metavar="N",
        help="save a resumable checkpoint after N steps and stop (as if interrupted)",
    )
    add_device(p)


def run(args: argparse.Namespace) -> int:
    from attnconv.train.config import load_config
    from attnconv.train.run import train
    from attnconv.train.stopping import Interrupted, NonFiniteLoss

    cfg = load_config(args.config, args.overrides)
    if args.out:
        cfg.out_dir = args.out
    if cfg.out_dir is None:
        cfg.out_dir = str(Path("runs") / Path(args.config).stem)
    if args.stop_at_step is not None and args.stop_at_step < 1:
        raise ValueError(f"--stop-at-step must be >= 1, got {args.stop_at_step}")
    try:
        last = train(
            cfg,
            resume=args.resume,
            stop_at_step=args.stop_at_step,
            overwrite=args.overwrite,
            device=args.device,
        )
    except Interrupted as e:
        return 128 + e.signum if e.signum else 0
    except NonFiniteLoss as e:
        print(f"attnconv train: error: {e}", file=sys.stderr)
        return 3
    import os

    if int(os.environ.get("RANK", "0")) == 0:
        acc = f"; eval accuracy {100 * last['eval_acc']:.2f}%" if last else ""
        print(f"run folder: {cfg.out_dir}{acc}")
    return 0
