"""The Triton window kernel's precision over random small cases, through Triton's interpreter (no
GPU): for each case, the kernel's distance to the float64 equations against its plain equations'
(window_attention_reference in float32, or in bfloat16 autocast), output and every gradient
(q, k, v, rel_row, rel_col), as tests/test_triton_local.py measures it (the norm of the error,
both paths from the same rounded q, k, v and output gradient). Prints each case's ratios and the
cases past 2x, the suite's bound.

    python benchmarks/triton_precision_sweep.py --cases 30
"""

from __future__ import annotations

import argparse
import os
import random

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

from attnconv.layers.kernels.triton_local import (  # noqa: E402
    local_attention_triton,
    window_attention_reference,
)
from attnconv.layers.kernels.window import local_attention  # noqa: E402

NAMES = ("y", "q", "k", "v", "rel_row", "rel_col")


def ratios(dtype, b, nh, h, w, dk, dv, ks, seed) -> list[float]:
    """The kernel's error over the plain path's, per output and gradient (1.0 where both are 0)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=gen)

    q, v = rand(b, nh, dk, h, w), rand(b, nh, dv, h, w)  # the test's draws, in its order
    xs = [q, rand(b, nh, dk, h, w), v, rand(ks, dk // 2), rand(ks, dk - dk // 2)]
    if dtype != torch.float32:  # both paths start from the same rounded q, k, v
        xs = [x.to(dtype).double() for x in xs[:3]] + xs[3:]
    xs = [x.requires_grad_() for x in xs]
    exact = local_attention(
        *xs[:3], kernel_size=ks, rel_row=xs[3], rel_col=xs[4], padding="mask", impl="reference"
    )
    g = torch.randn(exact.shape, dtype=torch.float64, generator=gen).to(dtype).double()
    exact_g = torch.autograd.grad(exact, xs, g)
    errs = {}
    for name in ("triton", "plain"):
        x32 = [x.detach().float().requires_grad_() for x in xs]
        if name == "triton":  # the kernel's inputs as autocast gives them
            y = local_attention_triton(*(x.to(dtype) for x in x32[:3]), ks, x32[3], x32[4])
        else:
            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                y = window_attention_reference(*x32[:3], ks, x32[3], x32[4])
        grads = torch.autograd.grad(y, x32, g.to(y.dtype))
        errs[name] = [(y.double() - exact).norm().item()] + [
            (a.double() - e).norm().item() for a, e in zip(grads, exact_g)
        ]
    return [(a + 1e-300) / (p + 1e-300) for a, p in zip(errs["triton"], errs["plain"])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cases", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1, help="draws the cases")
    args = ap.parse_args()
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
