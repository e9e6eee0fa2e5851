"""What flushing subnormal floats to zero (``torch.set_flush_denormal``) gives a training step on
this CPU: each paper model, attnconv and the reference code's algorithm (bench/models.py's
cases, the paper's dropout), or a training config's model, timed with subnormals kept (torch's
default) and flushed, the two settings alternated step by step in one process (medians after one
warm-up each).

    python benchmarks/denormal_ab.py [--scale paper|cpu] [--batch 8] [--models M [M ...]] \
        [--config CFG [CFG ...]] [--threads 1] [--rounds 6]
    python benchmarks/denormal_ab.py --checkpoint RUN/checkpoints [--per-class 30]
    python benchmarks/denormal_ab.py --checkpoint RUN/checkpoints --analyze 100

``--checkpoint``: the evaluation of a trained model (``attnconv eval``'s loop) on the first
``--per-class`` test images of each class of its dataset instead, with the accuracy and loss
of both settings; with ``--analyze N``, ``attnconv analyze``'s figures of it from N test images
(what ``analyze`` and ``explore`` compute; the figures written to a temporary folder).

Why: the quadratic encoding's softmax(-alpha ||delta - Delta||^2) (Cordonnier et al., eq. 9)
gives far-off keys probabilities below float32's smallest normal (1.2e-38); some CPUs (Intel's)
take a slow path on every arithmetic operation that reads or writes such a subnormal, AMD's
Zen cores mostly do not. Flushing changes only values below 1.2e-38 (float32) to zero.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from attnconv.bench.anchors import interleaved_medians
from attnconv.bench.models import SA_MODELS, make_step, training_step
from attnconv.cpuinfo import cpu_name
from attnconv.device import flush_subnormals

SETTINGS = (("kept", False), ("flushed", True))


def flushing(step, flush: bool):
    """``step`` run with subnormals flushed (``flush``) or kept on every thread (what
    ``attnconv train`` sets); torch's default restored after."""

    def run() -> None:
        flush_subnormals(flush)
        try:
            step()
        finally:
            flush_subnormals(False)

    return run


def config_step(path: str):
    """(name, step) of one training step of a config's model at its batch and precision."""
    from attnconv.models import create_model
    from attnconv.train.config import load_config

    cfg = load_config(path)
    torch.manual_seed(0)
    net = create_model(cfg.model.name, num_classes=10, **cfg.model.kwargs).train()
    name = f"{path} (B={cfg.train.batch_size}, {'bf16' if cfg.train.bf16 else 'fp32'})"
    return name, training_step(net, cfg.train.batch_size, cfg.train.bf16)


def checkpoint_eval(path: str, per_class: int):
    """(name, evaluation, results) of a checkpoint on its dataset's test images: each call
    of the evaluation appends its (loss, accuracy) to results."""
    from attnconv.data import CIFAR10_MEAN, CIFAR10_STD, Loader, load_dataset
    from attnconv.loading import load_model
    from attnconv.train.distributed import DistInfo
    from attnconv.train.evaluation import evaluate

    model, info = load_model(path)
    data = (info.get("config") or {}).get("data", {})
    ds = load_dataset(data["dataset"], "test", max_per_class=per_class)
    stats = info.get("data", {})
    mean, std = stats.get("mean", CIFAR10_MEAN), stats.get("std", CIFAR10_STD)
    loader = Loader(ds, 100, shuffle=False, mean=mean, std=std)
    results: list[tuple[float, float]] = []
    cpu = DistInfo(device=torch.device("cpu"))
    run = Path(info["path"])  # named by its run folder and step, not the machine's path
    name = f"evaluation of {run.parent.parent.name}/{run.name} ({len(ds)} test images)"
    return name, lambda: results.append(evaluate(model, loader, cpu)), results


def checkpoint_analysis(path: str, images: int):
    """(name, analysis) of a checkpoint: ``attnconv analyze``'s figures from ``images`` test
    images of its dataset, into a temporary folder."""
    import tempfile

    from attnconv.analysis.inputs import load_for_analysis
    from attnconv.analysis.report import analyze_model

    model, info, imgs, labels, mean, std = load_for_analysis(path, None, images, device="cpu")
    out = tempfile.mkdtemp(prefix="denormal_ab-")
    run = Path(info["path"])

    def analysis() -> None:
        with torch.no_grad():
            analyze_model(model, imgs, out, mean=mean, std=std, labels=labels)

    return f"analysis of {run.parent.parent.name}/{run.name} ({images} test images)", analysis


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", choices=("paper", "cpu"), default="paper")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--models", nargs="+", choices=SA_MODELS, default=list(SA_MODELS))
    p.add_argument("--config", nargs="+", default=[], help="training configs instead of models")
    p.add_argument("--checkpoint", help="a trained model's evaluation instead")
    p.add_argument("--per-class", type=int, default=30, help="--checkpoint's test images")
    p.add_argument("--analyze", type=int, metavar="N", help="--checkpoint: its analysis instead")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit("denormal_ab: --rounds must be >= 1")
    if args.analyze is not None and (not args.checkpoint or args.analyze < 1):
        raise SystemExit("denormal_ab: --analyze N takes --checkpoint and N >= 1")
    if not torch.set_flush_denormal(False):
        raise SystemExit("denormal_ab: this CPU cannot flush subnormals (no SSE3 on x86)")
    torch.set_num_threads(args.threads)
    results = None
    if args.checkpoint and args.analyze:
        cases = [checkpoint_analysis(args.checkpoint, args.analyze)]
    elif args.checkpoint:
        name, evaluation, results = checkpoint_eval(args.checkpoint, args.per_class)
        cases = [(name, evaluation)]
    elif args.config:
        cases = [config_step(c) for c in args.config]
    else:
        cases = [
            (
                f"{args.scale} {m} {impl} fp32 B={args.batch}",
                make_step(m, args.scale, args.batch, impl),
            )
            for m in args.models
            for impl in ("reference", "attnconv")
        ]
    print(
        f"{args.threads} thread(s), {args.rounds} rounds, {cpu_name()}, torch {torch.__version__}"
    )
    case = "case" if args.checkpoint else "training step"
    print(f"| {case} | kept s | flushed s | kept / flushed |")
    print("|---|---|---|---|")
    for name, step in cases:
        med = interleaved_medians({k: flushing(step, f) for k, f in SETTINGS}, args.rounds)
        kept, flushed = med["kept"], med["flushed"]
        print(f"| {name} | {kept:.4f} | {flushed:.4f} | {kept / flushed:.2f} |", flush=True)
    if results:  # each setting's (loss, accuracy), in the order run: equal or not
        seen = {setting: results[i::2] for i, (setting, _) in enumerate(SETTINGS)}
        for setting, got in seen.items():
            print(f"{setting}: loss, accuracy {sorted(set(got))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
