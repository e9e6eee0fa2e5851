"""`attnconv analyze CHECKPOINT --data DATA --out DIR`: the papers' figures for a checkpoint.

Pretrained timm / Hugging Face weights: `attnconv analyze --model NAME --checkpoint PATH --out DIR`
(``add_model_arguments`` / ``model_source``, shared with `attnconv explore`).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from .options import add_device, check_early, check_output_folder

log = logging.getLogger(__name__)
HELP = "figures of what the attention heads learned (PNGs + index.md/index.html)"


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """CHECKPOINT (attnconv), or --model NAME --checkpoint PATH (timm / Hugging Face / attnconv)."""
    p.add_argument(
        "source",
        nargs="?",
        metavar="CHECKPOINT",
        help="checkpoint folder, run folder (its checkpoints/latest) or a pretrained name "
        "(attnconv.list_pretrained(); a bare MODEL: its default tag)",
    )
    p.add_argument(
        "--model", help="registry name for --checkpoint weights, e.g. vit_base_patch16_224"
    )
    p.add_argument(
        "--checkpoint",
        dest="weights",
        metavar="PATH",
        help="weights for --model: a timm state dict (.safetensors / torch zip), a Hugging Face "
        "ViT/DeiT folder (config.json + weights) or an attnconv checkpoint",
    )
    p.add_argument(
        "--data",
        help="test data: a folder/.zip (split/class/img), CIFAR batches, 'sample' or 'cifar10' "
        "(default: the dataset the checkpoint was trained on; with --model: 'sample'; images "
        "are resized to the model's input size)",
    )


def model_source(args: argparse.Namespace) -> tuple[str, str | None]:
    """(checkpoint path, registry name or None) from CHECKPOINT / --model / --checkpoint."""
    if args.source and args.weights:
        raise ValueError("give the checkpoint once: CHECKPOINT or --checkpoint PATH, not both")
    path = args.source or args.weights
    if not path:
        raise ValueError("no checkpoint: give CHECKPOINT, or --model NAME --checkpoint PATH")
    if args.weights and not args.model:
        raise ValueError("--checkpoint needs --model NAME (e.g. vit_base_patch16_224)")
    if args.model:
        from attnconv.catalog import check_model_name

        check_model_name(args.model)  # before torch is imported
    if not args.model:  # a pretrained name: its checked folder (before torch is imported)
        from attnconv.catalog import resolve_checkpoint

        path = resolve_checkpoint(path, bare=True)
    p = Path(path)
    if not args.model and p.is_dir() and (p / "config.json").is_file():
        raise ValueError(
            f"{path}: a Hugging Face / timm folder; name its model: "
            f"--model NAME --checkpoint {path} (e.g. NAME = vit_base_patch16_224)"
        )
    return path, args.model


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--split", default="test", help="split of --data to use (default: test)")
    p.add_argument("--out", required=True, help="output folder for the figures")
    p.add_argument("--num-images", type=int, default=100, help="images to average over (100)")
    p.add_argument("--image", type=int, default=0, help="index of the single image shown (0)")
    p.add_argument(
        "--query",
        type=int,
        nargs=2,
        metavar=("ROW", "COL"),
        help="query pixel of the image (default: the centre)",
    )
    p.add_argument(
        "--zoom", type=int, default=7, help="side of the zoomed key window (default 7; 0 = none)"
    )
    p.add_argument(
        "--centers-log",
        help="per-epoch centre log (default: centers.jsonl of the checkpoint's run folder)",
    )
    p.add_argument("--batch-size", type=int, default=25, help="images per forward pass (25)")
    add_device(p)


def analyze_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    *,
    data: str | None = None,
    num_images: int = 100,
    split: str = "test",
    query=None,
    image: int = 0,
    zoom: int = 7,
    centers_log: str | Path | None = None,
    batch_size: int = 25,
    device: str | None = None,
    model_name: str | None = None,
) -> dict:
    """The figures of ``checkpoint`` into ``out`` (what ``attnconv analyze`` and the demo run);
    returns the report. ``model_name``: pretrained weights for that registry model."""
    import torch

    from attnconv.analysis.centers import find_center_log, read_center_log
    from attnconv.analysis.inputs import load_for_analysis
    from attnconv.analysis.report import analyze_model
    from attnconv.device import resolve_device

    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    if zoom < 0:
        raise ValueError(f"--zoom must be >= 0, got {zoom}")
    center_log = Path(centers_log) if centers_log else find_center_log(checkpoint)
    if centers_log and not center_log.is_file():
        raise FileNotFoundError(f"--centers-log {center_log}: no such file")
    if centers_log:  # a malformed log is refused before any figure is drawn
        read_center_log(center_log)
    resolve_device(device)  # an unusable --device before any work
    log.info(f"analyze: loading {checkpoint} and {num_images} test images")
    model, info, images, labels, mean, std = load_for_analysis(
        checkpoint, data, num_images, split, device=device, model_name=model_name
    )
    with torch.no_grad():
        return analyze_model(
            model,
            images,
            out,
            mean=mean,
            std=std,
            labels=labels,
            query=query,
            image_index=image,
            zoom=zoom or None,
            center_log=center_log,
            title=f"{info.get('model')} ({Path(info.get('path', checkpoint)).name}, {split} split)",
            batch_size=batch_size,
        )


def run(args: argparse.Namespace) -> int:
    path, name = model_source(args)
    check_early(args, ("num_images", "batch_size"), ("zoom", "image"))
    if args.centers_log and not Path(args.centers_log).is_file():
        raise FileNotFoundError(f"--centers-log {args.centers_log}: no such file")
    check_output_folder("--out", args.out)  # a file (or a folder under one): before any work
    report = analyze_checkpoint(
        path,
        args.out,
        data=args.data,
        num_images=args.num_images,
        split=args.split,
        query=args.query,
        image=args.image,
        zoom=args.zoom,
        centers_log=args.centers_log,
        batch_size=args.batch_size,
        device=args.device,
        model_name=name,
    )
    out = Path(args.out)
    print(f"wrote {len(report['figures'])} figures to {out} (index: {out / 'index.md'})")
    return 0
