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


def _holds_run(out: Path) -> bool:
    """A run was saved in ``out`` (a checkpoint or logged metrics), not only a config file."""
    return any((out / "checkpoints").glob("step-*")) or (out / "metrics.csv").is_file()


def run(args: argparse.Namespace) -> int:
    from attnconv.train.config import load_config
    from attnconv.train.run import train
    from attnconv.train.stopping import Interrupted, NonFiniteLoss

    folder = Path(args.config)
    if folder.is_dir():  # a run folder, say ("no such config file" said it was not there)
        run = folder / "config.yaml"
        hint = f"`attnconv train {run} --out {folder} --resume`"
        raise IsADirectoryError(
            f"{args.config} is a folder, not a config file"
            + (f" (a run folder: continue it with {hint})" if _holds_run(folder) else "")
        )
    cfg = load_config(args.config, args.overrides)
    if args.out:
        cfg.out_dir = args.out
    if cfg.out_dir is None:
        cfg.out_dir = str(Path("runs") / Path(args.config).stem)
    if args.stop_at_step is not None and args.stop_at_step < 1:
        raise ValueError(f"--stop-at-step must be >= 1, got {args.stop_at_step}")
    out = Path(cfg.out_dir)
    if folder.resolve() == (out / "config.yaml").resolve() and not _holds_run(out):
        # the run writes its resolved config there: the user's file (comments, base:) was lost
        raise ValueError(
            f"{args.config} is the config.yaml that a run in {out} writes (its resolved "
            "config): training would replace your file; keep it outside the run folder or "
            "train into another folder (--out)"
        )
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
