"""Single converted convolutions against the originals (issue 46's per-layer goal: within 3x).

    python benchmarks/convert_layers.py [--retain] [--repeats N]

Each case: ``conv_to_attention(conv)`` (hard heads) against ``conv``, inference, one thread,
median of ``--repeats`` timed calls each after 3 warm-up calls, the two interleaved; the max
absolute output difference beside it. ``--retain`` re-runs the script with glibc told to keep
freed memory (bench/common.py's ``retain`` policy): without it, every large output is a fresh
mmap whose page faults dominate both sides' times here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from attnconv.bench.common import MALLOC_POLICIES
from attnconv.convert import conv_to_attention

CASES = [
    ("7x7 depthwise, C768, 14x14, B8", dict(c=768, k=7, groups=768), (8, 14)),
    ("5x5 depthwise, C256, 28x28, B8", dict(c=256, k=5, groups=256), (8, 28)),
    ("3x3 grouped (8), C128, 28x28, B8", dict(c=128, k=3, groups=8), (8, 28)),
    ("3x3 dense, C64, 32x32, B8", dict(c=64, k=3), (8, 32)),
    ("3x3 dense stride 2, C64->128, 32x32, B8", dict(c=64, k=3, stride=2, cout=128), (8, 32)),
    ("3x3 dense, C16, 8x8, B1", dict(c=16, k=3), (1, 8)),
    ("3x3 dilation 2, C32, 16x16, B4", dict(c=32, k=3, dilation=2), (4, 16)),
]


def build(c: int, k: int, groups: int = 1, stride: int = 1, dilation: int = 1, cout=None):
    return torch.nn.Conv2d(
        c,
        cout or c,
        k,
        stride=stride,
        padding=dilation * (k // 2),
        dilation=dilation,
        groups=groups,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--retain", action="store_true", help="glibc keeps freed memory (re-exec)")
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    policy = MALLOC_POLICIES["retain"]
    if args.retain and any(os.environ.get(k) != v for k, v in policy.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **policy})
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(
        f"| layer | conv ms | converted ms | ratio | max abs diff |  (malloc: "
        f"{'retain' if args.retain else 'glibc'})\n|---|---|---|---|---|"
    )
    for name, kw, (b, hw) in CASES:
        conv = build(**kw)
        att = conv_to_attention(conv).eval()
        x = torch.randn(b, kw["c"], hw, hw)
        with torch.no_grad():
            diff = (att(x) - conv(x)).abs().max().item()
            for f in (conv, att, conv, att, conv, att):  # warm-up
                f(x)
            ts = {"conv": [], "att": []}
            for _ in range(args.repeats):
                for key, f in (("conv", conv), ("att", att)):
                    t0 = time.perf_counter()
                    f(x)
                    ts[key].append(time.perf_counter() - t0)
        c, a = statistics.median(ts["conv"]) * 1e3, statistics.median(ts["att"]) * 1e3
        print(f"| {name} | {c:.3f} | {a:.3f} | {a / c:.2f}x | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
