"""Two kernels of one attention layer timed interleaved in one process (a plan threshold's check):
MultiHeadSelfAttention2d(C, C, heads, positional, content) at each B x size, ``backend`` A then B
each round, medians over the rounds after the first (warm-up).

    python benchmarks/kernel_ab.py --backends blocked fused --cases 32x16 16x20 12x24 8x32 2x64 \
        [--positional relative_learned] [--inference] [--threads 1] [--rounds 8]

``--cases BxS``: batch B at S x S pixels. ``--inference``: the forward alone in eval mode under
``torch.inference_mode``; else forward + backward. Prints a table with A's time / B's time.
"""

from __future__ import annotations

import argparse

import torch

from attnconv.bench.anchors import interleaved_medians
from attnconv.layers.kernels.plan import BACKENDS
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d


def case(spec: str) -> tuple[int, int]:
    b, sep, s = spec.partition("x")
    if not (sep and b.isdigit() and s.isdigit() and int(b) > 0 and int(s) > 0):
        raise argparse.ArgumentTypeError(f"a case is BxS (batch x size), got {spec!r}")
    return int(b), int(s)


def time_case(args: argparse.Namespace, b: int, s: int) -> list[float]:
    """Both backends' median times (bench/anchors.py's round-robin after one warm-up each)."""
    torch.manual_seed(0)
    m = MultiHeadSelfAttention2d(
        args.channels,
        args.channels,
        args.heads,
        max_size=s,
        positional=args.positional,
        content=True,
    )
    x = torch.randn(b, args.channels, s, s, requires_grad=not args.inference)
    m.train(not args.inference)

    def step(backend: str):
        def run():
            m.backend = backend
            if args.inference:
                with torch.inference_mode():
                    m(x)
            else:
                m(x).sum().backward()

        return run

    med = interleaved_medians({be: step(be) for be in args.backends}, args.rounds - 1)
    return [med[be] for be in args.backends]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", nargs=2, required=True, choices=BACKENDS, metavar="BACKEND")
    p.add_argument("--cases", nargs="+", type=case, required=True, metavar="BxS")
    p.add_argument("--positional", default="relative_learned")
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--inference", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args(argv)
    if args.rounds < 2:
        raise SystemExit("kernel_ab: --rounds must be >= 2 (the first is a warm-up)")
    torch.set_num_threads(args.threads)
    a, b_ = args.backends
    mode = "inference forward" if args.inference else "forward + backward"
    print(
        f"| {args.positional} + content, C={args.channels}, {args.heads} heads, {mode}, "
        f"{args.threads} thread(s) | {a} s | {b_} s | {a}/{b_} |"
    )
    print("|---|---|---|---|")
    for b, s in args.cases:
        ta, tb = time_case(args, b, s)
        print(f"| B={b}, {s}x{s} | {ta:.4f} | {tb:.4f} | {ta / tb:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
