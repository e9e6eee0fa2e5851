"""The Triton window kernel's precision over random small cases, through Triton's interpreter (no
GPU): for each case, the kernel's distance to the float64 equations against its plain equations'
(window_attention_reference in float32, or in bfloat16 autocast), output and every gradient
(q, k, v, rel_row, rel_col), by tests/test_triton_local.py's own measure (``window_errors``:
the norm of the error, both paths from the same rounded q, k, v and output gradient). Prints
each case's ratios and the cases past 2x, the suite's bound.

``--axis``: the axis kernel's precision cases instead (tests/test_triton_axis.py's
PRECISION_CASES and measure, ``axis_errors``: v shared by the heads), each error of both paths
and their ratio, in float32, bfloat16 and float16.

``--spread B,Nh,H,W,dk,dv,k --seeds N``: one float32 window case over N seeds of its inputs,
each ratio's median, min and max: whether a case past 2x is the kernel or the seed.

    python benchmarks/triton_precision_sweep.py --cases 30
    python benchmarks/triton_precision_sweep.py --axis
    python benchmarks/triton_precision_sweep.py --spread 1,2,2,1,16,8,3 --seeds 8
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402

from test_triton_axis import PRECISION_CASES, axis_errors  # noqa: E402  (the tests' own)
from test_triton_local import window_errors  # noqa: E402

NAMES = ("y", "q", "k", "v", "rel_row", "rel_col")
AXIS_NAMES = ("y", "q", "k", "v", "q_axis")


def ratios(dtype, b, nh, h, w, dk, dv, ks, seed) -> list[float]:
    """The kernel's error over the plain path's, per output and gradient (1.0 where both are 0)."""
    errs = window_errors(dtype, b, nh, h, w, dk, dv, ks, torch.Generator().manual_seed(seed))
    return [(a + 1e-300) / (p + 1e-300) for a, p in zip(errs["triton"], errs["plain"])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cases", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1, help="draws the cases")
    ap.add_argument("--axis", action="store_true", help="the axis kernel's test cases")
    ap.add_argument("--spread", default=None, help="B,Nh,H,W,dk,dv,k: one case over --seeds")
    ap.add_argument("--seeds", type=int, default=8)
    args = ap.parse_args()
    if args.spread:
        case = tuple(int(x) for x in args.spread.split(","))
        runs = [ratios(torch.float32, *case, seed) for seed in range(args.seeds)]
        print(f"float32 B,Nh,H,W,dk,dv,k={case} over {args.seeds} seeds: median [min, max]")
        for n, rs in zip(NAMES, zip(*runs)):
            rs = sorted(rs)
            print(
                f"  {n:8} {rs[len(rs) // 2]:.2f} [{rs[0]:.2f}, {rs[-1]:.2f}]  past 2x: "
                f"{sum(r > 2 for r in rs)} of {len(rs)}"
            )
        return
    if args.axis:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for case in PRECISION_CASES:
                e = axis_errors(dtype, *case)
                print(
                    f"{str(dtype)[6:]:8} B,Nh,H,W,dk,dv,p={case}  "
                    + "  ".join(
                        f"{n} {a:.3g}/{b:.3g}={a / b:.2f}"
                        for n, a, b in zip(AXIS_NAMES, e["triton"], e["plain"])
                    ),
                    flush=True,
                )
        return
    rng, past = random.Random(args.seed), []
    for _ in range(args.cases):
        dtype = rng.choice([torch.float32, torch.bfloat16])
        b, nh, h = rng.randint(1, 2), rng.randint(1, 2), rng.choice([1, 1, 2, 5, 7])
        w, dk, dv = rng.choice([1, 3, 5, 9, 12]), rng.choice([8, 16]), rng.choice([8, 16])
        case = (b, nh, h, w, dk, dv, rng.choice([3, 5]), rng.randint(0, 999))
        r = ratios(dtype, *case)
        line = f"{str(dtype)[6:]:8} B,Nh,H,W,dk,dv,k,seed={case}  " + " ".join(
            f"{n} {x:.2f}" for n, x in zip(NAMES, r)
        )
        print(line, flush=True)
        if max(r) > 2:
            past.append(line)
    worst = "(none)" if not past else "\n  ".join(past)
    print(f"past 2x the plain path's error: {len(past)} of {args.cases}\n  {worst}")


if __name__ == "__main__":
    main()
