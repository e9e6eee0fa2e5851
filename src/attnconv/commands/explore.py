"""`attnconv explore CHECKPOINT --out page.html`: the interactive attention explorer page."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from .options import add_device, check_early, check_output_file

log = logging.getLogger(__name__)
HELP = "write a self-contained HTML page to explore every head's attention by clicking pixels"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .analyze import add_model_arguments

    add_model_arguments(p)  # CHECKPOINT, or --model NAME --checkpoint PATH; --data
    p.add_argument("--out", required=True, help="the .html file to write")
    p.add_argument("--split", default="test", help="split of --data to use (default: test)")
    p.add_argument("--images", type=int, default=4, help="test images shown (default 4)")
    p.add_argument(
        "--num-images",
        "--average",
        dest="average",
        type=int,
        default=25,
        help="images averaged in the average view (default 25; 0 = off; --average: the older "
        "spelling; analyze's --num-images)",
    )
    p.add_argument(
        "--max-queries",
        type=int,
        default=256,
        help="query tokens stored per layer; larger grids keep every k-th token (default 256)",
    )
    p.add_argument("--batch-size", type=int, default=25, help="images per forward pass (25)")
    add_device(p)


def run(args: argparse.Namespace) -> int:
    from .analyze import model_source

    path, name = model_source(args)  # a wrong path or name: said before torch is imported
    check_early(args, ("images", "max_queries", "batch_size"), ("average",))
    if Path(args.out).suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"--out must name an .html file, got {args.out}")
    check_output_file("--out", args.out)  # a folder (or one under a file): before any work
    import torch

    from attnconv.analysis.explorer import explore_model
    from attnconv.analysis.inputs import load_for_analysis
    from attnconv.device import resolve_device

    resolve_device(args.device)  # an unusable --device before any work
    log.info(f"explore: loading {path} and {max(args.images, args.average)} test images")
    model, info, images, labels, mean, std = load_for_analysis(
        path,
        args.data,
        max(args.images, args.average),
        args.split,
        device=args.device,
        model_name=name,
    )
    with torch.no_grad():
        out = explore_model(
            model,
            images[: args.images],
            args.out,
            average_images=images[: args.average] if args.average else None,
            labels=labels[: args.images],
            mean=mean,
            std=std,
            title=(
                f"attention explorer: {info.get('model')} "
                f"({Path(info.get('path', '')).name}, {args.split} split)"
            ),
            max_queries=args.max_queries,
            batch_size=args.batch_size,
        )
    size, shown = out.stat().st_size / 1e6, min(args.images, len(images))
    # what the page holds: the split may have fewer images than asked for
    average = min(args.average, len(images))
    print(f"wrote {out} ({size:.1f} MB, {shown} images, average of {average})")
    return 0
