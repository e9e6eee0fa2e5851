"""`attnconv convert SOURCE [--data SPEC]`: every convolution of a model -> self-attention
(Cordonnier et al. 2020, Theorem 1), checked layer by layer on real images and end to end."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from attnconv.catalog import check_model_name

from .options import add_device, check_early, check_output_file, check_parent_folders

HELP = "convert every convolution of a model (checkpoint or model name) into self-attention"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source",
        help="checkpoint (run folder, checkpoint folder, .safetensors), a pretrained name "
        "(attnconv.list_pretrained()) or a registry model name (random weights, or --checkpoint)",
    )
    p.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="pretrained weights for the model name "
        "SOURCE: a timm state dict or a Hugging Face ViT/DeiT folder",
    )
    p.add_argument(
        "--data",
        help="dataset for accuracy before/after: cifar10 | sample | PATH "
        "(e.g. the full CIFAR-10 JPEG zip); default: per-layer check only, on "
        "the embedded real sample",
    )
    p.add_argument("--split", default="test", help="split of --data to use (default: test)")
    p.add_argument("--max-per-class", type=int, default=None, help="evaluate on a subset")
    p.add_argument(
        "--num-images",
        type=int,
        default=64,
        help="real images for the per-layer check (default 64)",
    )
    p.add_argument(
        "--batch-size", type=int, default=250, help="images per batch of the accuracy check (250)"
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="finite precision: Lemma 2 soft layers (default: hard)",
    )
    p.add_argument(
        "--head-dim",
        type=int,
        default=None,
        help="rank-limited heads (default: exact, head_dim = in_channels)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="PATH",
        help="also the report as JSON: written to PATH, or printed without one",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="save the converted model as a checkpoint folder "
        "(safetensors + JSON) that eval / analyze / convert load",
    )
    p.add_argument(
        "--keep-unsupported",
        action="store_true",
        help="leave convolutions the conversion cannot reproduce as they are (listed) "
        "instead of stopping",
    )
    add_device(p)


def _load(source: str, checkpoint: str | None = None):
    """(model in float32, info, its name for the report); a float64 / float16 checkpoint is
    cast, said in one line; non-finite weights are refused by the loaders."""
    from attnconv.loading.weights_check import as_float32

    model, info, name = _load_as_stored(source, checkpoint)
    model, note = as_float32(model, name)
    if note:
        print(f"convert: {note}")
    return model, info, name


def _load_as_stored(source: str, checkpoint: str | None = None):
    import torch

    from attnconv.loading import create_model, load_model, model_kwargs
    from attnconv.models import list_models

    if checkpoint:  # pretrained weights for a registry name
        from attnconv.analysis.inputs import pretrained_normalization

        model = create_model(source, checkpoint=checkpoint)
        mean, std = pretrained_normalization(checkpoint)
        info = {
            "model": source,
            "model_kwargs": model_kwargs(model),
            "data": {"mean": mean, "std": std},
        }
        return model, info, f"{source} ({checkpoint})"
    if Path(source).exists():
        model, info = load_model(source)
        return model, info, f"{info['model']} ({info.get('path', source)})"
    if source in list_models():
        torch.manual_seed(0)
        return create_model(source), {"model": source}, f"{source} (random weights, seed 0)"
    if os.sep not in source and not source.startswith("."):  # a name, not a path
        create_model(source)  # raises "unknown model ... did you mean"
    raise FileNotFoundError(f"{source}: no such checkpoint")


def _check_out(out: str, report: str | None = None) -> None:
    """--out is a new or empty folder, or the output of an earlier convert (replaced whole):
    never a run, a training checkpoint, a user's folder nor the current one (or one above it),
    which saving would delete; nor the folder of the --json ``report``, which it would drop."""
    from attnconv.train.checkpoint import META, STATE, WEIGHTS

    path, here = Path(out), Path.cwd()
    if path.suffix == ".safetensors":
        raise ValueError(f"--out {out}: the converted model is saved as a folder; name a folder")
    if path.resolve() in (here, *here.parents):
        raise ValueError(f"--out {out} is the current folder or one above it; name a new folder")
    check_parent_folders("--out", out)
    if report and report != "-" and path.resolve() in (r := Path(report).resolve(), *r.parents):
        raise ValueError(
            f"--json {report} is inside --out {out}, which saving replaces whole; write the "
            "report elsewhere"
        )
    if not path.exists():
        return
    if not path.is_dir():
        raise FileExistsError(f"--out {out} is an existing file")
    names = {c.name for c in path.iterdir()}
    if not names:
        return
    if names <= {META, WEIGHTS, STATE} and META in names:
        try:
            earlier = "converted" in json.loads((path / META).read_text())
        except (OSError, ValueError):
            earlier = False
        if earlier:
            return
    raise FileExistsError(
        f"--out {out} exists and is not an earlier `attnconv convert` output (saving would "
        "delete what it holds); name a new or empty folder"
    )


def run(args: argparse.Namespace) -> int:
    if "." in args.source and not args.checkpoint:  # a path, or a pretrained MODEL.TAG
        from attnconv.catalog import resolve_checkpoint

        args.source = resolve_checkpoint(args.source)  # before torch is imported
    elif not Path(args.source).exists() and os.sep not in args.source:  # a registry name
        check_model_name(args.source)
    check_early(args, ("num_images", "batch_size", "threads", "head_dim", "max_per_class"))
    if args.alpha is not None and not args.alpha > 0:  # Lemma 2's soft layer: alpha > 0
        raise ValueError(f"--alpha must be > 0 (or left out: exact hard heads), got {args.alpha}")
    check_output_file("--json", args.json)  # before any work
    if args.out:
        _check_out(args.out, args.json)  # before any work, never refused at the end
    import warnings

    import torch

    from attnconv.convert import convert_model, unconverted_layers
    from attnconv.convert.report import compare_predictions, layer_report
    from attnconv.data import CIFAR10_MEAN, CIFAR10_STD, Loader, load_dataset
    from attnconv.device import resolve_device
    from attnconv.progress import track

    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, info, label = _load(args.source, args.checkpoint)
    model.eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        converted = convert_model(
            model,
            alpha=args.alpha,
            head_dim=args.head_dim,
            on_unsupported="keep" if args.keep_unsupported else "error",
            progress=True,
        ).eval()
    model, converted = model.to(device), converted.to(device)  # converted on the CPU, run here
    kept = unconverted_layers(converted)
    data_info = info.get("data") or {}
    mean, std = data_info.get("mean", CIFAR10_MEAN), data_info.get("std", CIFAR10_STD)
    spec = args.data or "sample"
    ds = load_dataset(spec, args.split, max_per_class=args.max_per_class)
    x = next(
        Loader(ds, min(args.num_images, len(ds)), shuffle=False, mean=mean, std=std).batches(0)
    )[0].to(device)
    rows = layer_report(model, converted, x)
    if not rows and not kept:
        raise ValueError(f"{label}: the model has no Conv1d/Conv2d layer to convert")
    mode = "hard (alpha -> inf)" if args.alpha is None else f"soft, alpha={args.alpha:g}"
    heads = "exact heads" if args.head_dim is None else f"head_dim={args.head_dim}"
    print(f"{label}: {len(rows)} convolutions -> self-attention ({mode}, {heads})")
    for w in caught:
        if "kept as they are" not in str(w.message):
            print(f"warning: {w.message}")
    for path, cls, why in kept:
        print(f"kept as it is: {path} ({cls}): {why}")
    name_w = max(len("layer"), *(len(r["name"]) for r in rows))
    print(f"{'layer':<{name_w}}  kernel  stride  heads  head_dim  max|diff|  max|out|")
    for r in rows:
        k, s = "x".join(map(str, r["kernel"])), "x".join(map(str, r["stride"]))
        print(
            f"{r['name']:<{name_w}}  {k:<6}  {s:<6}  {r['heads']:<5}  {r['head_dim']:<8}  "
            f"{r['max_abs_diff']:<9.2e}  {r['max_abs_out']:.3g}"
        )
    report = {
        "source": label,
        "alpha": args.alpha,
        "head_dim": args.head_dim,
        "layers": rows,
        "layer_check_images": f"{len(x)} images of {spec}:{args.split}",
        "unconverted": [{"layer": p, "class": c, "reason": r} for p, c, r in kept],
    }
    with torch.no_grad():
        d = (model(x) - converted(x)).abs().max().item()
        same = (model(x).argmax(-1) == converted(x).argmax(-1)).sum().item()
    print(
        f"end to end on {len(x)} real images ({spec}:{args.split}): max |logit diff| {d:.2e}, "
        f"same prediction {same}/{len(x)}"
    )
    report["end_to_end"] = {"images": len(x), "max_abs_logit_diff": d, "same_prediction": same}
    if args.data:
        loader = Loader(ds, args.batch_size, shuffle=False, mean=mean, std=std)
        batches = ((x.to(device), y.to(device)) for x, y in loader.batches(0))
        res = compare_predictions(
            model,
            converted,
            track(batches, f"{spec}:{args.split}", total=len(loader), unit="batch"),
        )
        print(
            f"{spec}:{args.split}, {res['images']} images: accuracy "
            f"{100 * res['accuracy_before']:.2f}% before, {100 * res['accuracy_after']:.2f}% "
            f"after; predictions differ on {res['predictions_differ']} images; max |logit "
            f"diff| {res['max_abs_logit_diff']:.2e}; time {res['seconds_before']:.1f} s -> "
            f"{res['seconds_after']:.1f} s"
        )
        report["test_set"] = res
    if args.json == "-":
        print(json.dumps(report, indent=1))
    elif args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.out:
        from attnconv.train.checkpoint import save_checkpoint

        conversion = {
            "alpha": args.alpha,
            "head_dim": args.head_dim,
            "on_unsupported": "keep" if kept else "error",
            "source": label,
        }
        path = save_checkpoint(
            args.out,
            converted.cpu(),
            info["model"],
            info.get("model_kwargs", {}),
            config=info.get("config"),
            extra={"converted": conversion, "data": {"dataset": spec, **data_info}},
        )
        print(f"saved the converted model to {path}")
    return 0
