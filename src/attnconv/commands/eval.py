"""`attnconv eval CHECKPOINT [--data SPEC]`: accuracy and loss of a checkpoint on a split."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from .options import add_device, check_early, check_output_file

log = logging.getLogger(__name__)
HELP = "evaluate a checkpoint (accuracy, loss) on a dataset split"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        help="run folder, checkpoint folder, its model.safetensors, or a pretrained name "
        "(attnconv.list_pretrained(); a bare MODEL: its default tag)",
    )
    p.add_argument("--data", help="cifar10 | cifar100 | sample | PATH (default: the training data)")
    p.add_argument("--root", help="folder holding the official CIFAR files (for --data cifar10)")
    p.add_argument(
        "--split",
        help="split to evaluate (default: the run's data.eval_split on its own data, else test)",
    )
    p.add_argument("--batch-size", type=int, default=500, help="images per batch (500)")
    p.add_argument("--max-per-class", type=int, default=None, help="evaluate on a subset")
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="PATH",
        help="the result as JSON: printed, or written to PATH (as convert --json)",
    )
    add_device(p)


def run(args: argparse.Namespace) -> int:
    from attnconv.catalog import resolve_checkpoint

    args.checkpoint = resolve_checkpoint(args.checkpoint, bare=True)  # a pretrained name: folder
    check_early(args, ("batch_size", "max_per_class"))
    check_output_file("--json", args.json)  # before any work
    import torch

    from attnconv.data import CIFAR10_MEAN, CIFAR10_STD, Loader, load_dataset
    from attnconv.data.datasets import stored_or_sample
    from attnconv.device import flush_as_trained, resolve_device
    from attnconv.loading import load_model
    from attnconv.loading.weights_check import as_float32
    from attnconv.train.distributed import DistInfo
    from attnconv.train.evaluation import evaluate

    device = resolve_device(args.device)
    log.info(f"eval: loading {args.checkpoint}")
    model, info = load_model(args.checkpoint)  # non-finite weights refused there
    model, note = as_float32(model, info["path"])  # a float64 / float16 checkpoint runs
    if note:
        print(f"eval: {note}")
    cfg_data = (info.get("config") or {}).get("data", {})
    # a converted model stores the data `attnconv convert` checked it on in info["data"]
    spec = args.data or cfg_data.get("dataset") or (info.get("data") or {}).get("dataset")
    if spec is None:
        raise ValueError("the checkpoint stores no dataset: pass --data")
    if not args.data:
        spec, note = stored_or_sample(spec)
        if note:
            print(f"eval: {note}")
    root = args.root or (cfg_data.get("root") if not args.data else None)
    # the split the run evaluated on, on its own data (its data.eval_split)
    split = args.split or (None if args.data else cfg_data.get("eval_split")) or "test"
    log.info(f"eval: {info['model']}; reading {spec}:{split}")
    ds = load_dataset(spec, split, root=root, max_per_class=args.max_per_class)
    data_info = info.get("data", {})
    classes = data_info.get("classes")
    if classes is not None and len(classes) != ds.num_classes:
        raise ValueError(
            f"{spec}: {ds.num_classes} classes, the checkpoint was trained on {len(classes)}"
        )
    n_out = (info.get("model_kwargs") or {}).get("num_classes")
    if classes is None and n_out is not None and n_out != ds.num_classes:
        raise ValueError(f"{spec}: {ds.num_classes} classes, the model predicts {n_out}")
    mean, std = data_info.get("mean", CIFAR10_MEAN), data_info.get("std", CIFAR10_STD)
    loader = Loader(ds, args.batch_size, shuffle=False, mean=mean, std=std)
    flush_as_trained(info, device)  # train.flush_subnormals (docs/training.md)
    torch.manual_seed(0)
    loss, acc = evaluate(model.to(device), loader, DistInfo(device=device))
    res = {
        "checkpoint": info["path"],
        "model": info["model"],
        "data": spec,
        "split": split,
        "images": len(ds),
        "accuracy": acc,
        "loss": loss,
    }
    if args.json == "-":
        print(json.dumps(res))
    else:
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(res, indent=1))
        print(
            f"{info['model']} ({info['path']}) on {spec}:{split}, {len(ds)} images: "
            f"accuracy {100 * acc:.2f}%, loss {loss:.4f}"
        )
    return 0
