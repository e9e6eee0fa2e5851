"""Content attention inference against what a user writes instead, on CPU: the layer as the
plan runs it vs dense ``F.scaled_dot_product_attention`` with the positional logits as a float
bias (bench/anchors.py's ``dense_sdpa``), timed interleaved in one process (medians after one
warm-up each), at each batch and precision.

    python benchmarks/content_vs_dense.py [--positional quadratic] [--channels 432] \
        [--size 32] [--batches 8 32] [--threads 1] [--rounds 8] [--train]

Issue 45's CPU check: quadratic + content inference at C432 (9 heads of 48), 32x32, batch 8,
one thread, at least as fast as the dense anchor on every CPU.
"""

from __future__ import annotations

import argparse

import torch

from attnconv.bench.anchors import interleaved_medians, make_step
from attnconv.cpuinfo import cpu_name


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--positional", default="quadratic")
    p.add_argument("--channels", type=int, default=432)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--train", action="store_true", help="forward + backward instead")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    mode = "training step" if args.train else "inference forward"
    print(
        f"{args.positional} + content, C={args.channels}, {args.size}x{args.size}, {mode}, "
        f"{args.threads} thread(s), {args.rounds} rounds, {cpu_name()}, "
        f"torch {torch.__version__}"
    )
    print("| B | precision | attnconv s | dense SDPA + bias s | dense / attnconv |")
    print("|---|---|---|---|---|")
    for b in args.batches:
        for dtype in ("fp32", "bf16"):
            steps = {
                kind: make_step(
                    kind, args.positional, args.train, dtype, b, args.channels, args.size
                )
                for kind in ("attnconv", "dense")
            }
            t = interleaved_medians(steps, args.rounds)
            ratio = t["dense"] / t["attnconv"]
            print(f"| {b} | {dtype} | {t['attnconv']:.4g} | {t['dense']:.4g} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
