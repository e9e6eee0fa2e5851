"""`attnconv train RECIPE [--data PATH] [--set key=value ...] [--resume]` (also under torchrun).

RECIPE is a shipped recipe's name (``attnconv train --list``) or a YAML file."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .options import add_device

HELP = "train a model from a YAML config (resumable; torchrun for several processes)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config",
        nargs="?",
        metavar="RECIPE",
        help="a shipped recipe's name (e.g. cpu/sa_quadratic, experiments/grid_long; "
        "--list names them all) or a YAML config file",
    )
    p.add_argument("--list", action="store_true", help="list the shipped recipes and stop")
    p.add_argument(
        "--data",
        metavar="PATH",
        help="the training data instead of the recipe's (data.dataset): sample, cifar10 or a "
        "PATH, e.g. the full CIFAR-10 JPEG zip the experiments recipes need (or set "
        "ATTNCONV_CIFAR_ZIP)",
    )
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
        "--resume-from-intact",
        action="store_true",
        help="--resume from the newest intact checkpoint when the latest is damaged (the "
        "damaged ones are kept aside as checkpoints/damaged-step-N)",
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


def _to_intact(out: Path) -> None:
    """--resume-from-intact: ``latest`` pointed at the newest intact checkpoint (under the run
    folder's lock; said in one line), before the trainer reads it. Under torchrun rank 0 alone
    repairs, before it joins the process group; the other ranks wait for it there (the trainer's
    first barrier on --resume)."""
    from attnconv.train.intact import resume_from_intact
    from attnconv.train.runfolder import RunLock

    if int(os.environ.get("RANK", "0")) != 0 or not (out / "checkpoints").is_dir():
        return  # rank 0 repairs; no checkpoints: --resume says so
    lock = RunLock(out)
    try:
        line = resume_from_intact(out / "checkpoints")
    finally:
        lock.release()
    if line:
        print(f"attnconv train: {line}", flush=True)


def print_recipes() -> None:
    from attnconv.catalog import CIFAR_ZIP, list_recipes

    recipes = list_recipes()
    width = max(map(len, recipes))
    print(f"{len(recipes)} recipes (attnconv train NAME): cpu/* train on the embedded sample, the")
    print(f"others on the full CIFAR-10: --data PATH (e.g. {CIFAR_ZIP}; experiments/* also")
    print("take ATTNCONV_CIFAR_ZIP=PATH)")
    for name, line in recipes.items():
        print(f"  {name:<{width}}  {line}")


def run(args: argparse.Namespace) -> int:
    from attnconv.catalog import find_recipe

    if args.list:
        print_recipes()
        return 0
    if not args.config:
        raise ValueError("name a recipe or a YAML config (attnconv train --list names them)")
    folder = find_recipe(args.config)  # a wrong name or path: said before torch is imported
    if args.data and "/" in args.data and not Path(args.data).expanduser().exists():
        raise FileNotFoundError(f"--data {args.data}: no such file or folder")

    from attnconv.loading.checkpoint import CheckpointError
    from attnconv.train.config import load_config
    from attnconv.train.intact import hint
    from attnconv.train.run import train
    from attnconv.train.stopping import Interrupted, NonFiniteLoss

    if folder.is_dir():  # a run folder, say ("no such config file" said it was not there)
        run = folder / "config.yaml"
        hint = f"`attnconv train {run} --out {folder} --resume`"
        raise IsADirectoryError(
            f"{args.config} is a folder, not a config file"
            + (f" (a run folder: continue it with {hint})" if _holds_run(folder) else "")
        )
    overrides = [f"data.dataset={args.data}"] * bool(args.data) + list(args.overrides)
    cfg = load_config(folder, overrides)
    if args.out:
        cfg.out_dir = args.out
    if cfg.out_dir is None:
        cfg.out_dir = str(Path("runs") / folder.stem)
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
    if args.resume_from_intact:
        _to_intact(out)
    try:
        last = train(
            cfg,
            resume=args.resume or args.resume_from_intact,
            stop_at_step=args.stop_at_step,
            overwrite=args.overwrite,
            device=args.device,
        )
    except Interrupted as e:
        return 128 + e.signum if e.signum else 0
    except CheckpointError as e:
        more = hint(out / "checkpoints") if args.resume and not args.resume_from_intact else ""
        if more:
            raise CheckpointError(f"{e}{more}") from None
        raise
    except NonFiniteLoss as e:
        print(f"attnconv train: error: {e}", file=sys.stderr)
        return 3
    if int(os.environ.get("RANK", "0")) == 0:
        acc = (
            f"; eval accuracy {100 * last['eval_acc']:.2f}% on {last['eval_images']:,} "
            f"{cfg.data.eval_split} images"
            if last
            else ""
        )
        print(f"run folder: {cfg.out_dir}{acc}")
    return 0
