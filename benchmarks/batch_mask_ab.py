"""A batch-shared attention-dropout mask: one dense GEMM, or the separable product minus a sparse.

With one mask for the whole batch (``attn_dropout_mask: batch``, the reference code's dropout),
``shared_position.position_attention`` builds P o keep as one dense (Nh*T, T) matrix and applies it
to every image's values in one GEMM. The alternative it passes over keeps the separable row and
column operators and subtracts the dropped links as a sparse product,
(P o keep) x = P x - (P o 1_D) x (``separable_minus_dropped``, ``F.embedding_bag``). This times
both, forward + backward (gradients to R, C and x), interleaved in one process, medians of the
rounds, at the paper models' shapes, and checks they agree.

    python benchmarks/batch_mask_ab.py --threads 1 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from attnconv.cpuinfo import cpu_name
from attnconv.layers.functional import dropped_links
from attnconv.layers.kernels.shared_position import position_attention, separable_minus_dropped

# position_attention takes the dense GEMM for a (Nh, T, T) mask; the other is its per-image path
PATHS = (("dense", position_attention), ("sparse", separable_minus_dropped))


def case(nh, side, b, ch, p, dtype):
    g = torch.Generator().manual_seed(0)
    r = torch.softmax(torch.randn(nh, side, side, generator=g), -1).to(dtype).requires_grad_()
    c = torch.softmax(torch.randn(nh, side, side, generator=g), -1).to(dtype).requires_grad_()
    x = torch.randn(1, side, side, b, ch, generator=g, dtype=dtype).requires_grad_()
    gy = torch.randn(nh, side, side, b, ch, generator=g, dtype=dtype)
    drop = dropped_links(nh, side * side, None, p, "cpu", seed=1)
    return r, c, x, gy, drop


def step(fn, r, c, x, gy, drop):
    for t in (r, c, x):
        t.grad = None
    y = fn(r, c, x, drop)
    y.backward(gy)
    return y.detach(), r.grad, c.grad, x.grad


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--p", type=float, default=0.1)
    ap.add_argument(
        "--cases",
        nargs="+",
        default=["9x16x8x400", "9x16x16x400", "9x16x100x400", "9x8x64x64", "9x8x8x64"],
        help="NhxSIDExBxC: heads, token grid side, batch, value width",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"{cpu_name()}, torch {torch.__version__}, {args.threads} thread(s), p={args.p}, "
        f"{args.rounds} interleaved rounds, forward + backward, float32"
    )
    print(
        "| Nh | grid | B | C | dense ms | separable - sparse ms | dense / sparse | max rel. diff |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for spec in args.cases:
        nh, side, b, ch = (int(v) for v in spec.split("x"))
        r, c, x, gy, drop = case(nh, side, b, ch, args.p, torch.float32)
        outs = {}
        for name, fn in PATHS:  # warm-up and the check
            outs[name] = step(fn, r, c, x, gy, drop)
        diff = max(  # relative to the largest entry of each output and gradient
            ((a - b_).abs().max() / a.abs().max()).item()
            for a, b_ in zip(outs["dense"], outs["sparse"])
        )
        times = {"dense": [], "sparse": []}
        for _ in range(args.rounds):
            for name, fn in PATHS:
                t0 = time.perf_counter()
                step(fn, r, c, x, gy, drop)
                times[name].append(time.perf_counter() - t0)
        md, ms = (statistics.median(times[k]) * 1e3 for k in ("dense", "sparse"))
        print(
            f"| {nh} | {side}x{side} | {b} | {ch} | {md:.1f} | {ms:.1f} | {md / ms:.2f} "
            f"| {diff:.1e} |"
        )


if __name__ == "__main__":
    main()
