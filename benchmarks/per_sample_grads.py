"""Per-sample gradients of a Table 1 model: ``torch.func`` (vmap over grad, where every layer runs
its plain equations) against what a user would write instead, a loop of one-image backward
passes on the fast kernels. The experiments' geometry (hidden 64, 6 layers, 9 heads, feed-forward
128, 2x2 space-to-depth) on CIFAR-sized random images, eval mode (no dropout), float32, one
thread; the two interleaved, medians of ``--repeats``, and their largest difference:

    python benchmarks/per_sample_grads.py --model sa_quadratic --batch 16
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

import attnconv

GEOMETRY = dict(hidden_size=64, num_layers=6, num_heads=9, ff_size=128, downsample=2)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="sa_quadratic")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = attnconv.create_model(args.model, **GEOMETRY).eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(args.batch, 3, 32, 32)
    y = torch.randint(0, 10, (args.batch,))

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))

    def looped():
        out = {k: [] for k in params}
        for i in range(args.batch):
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
            for k, q in model.named_parameters():
                out[k].append(q.grad)
        return {k: torch.stack(v) for k, v in out.items()}

    times = {"vmap(grad)": [], "loop": []}
    fns = {"vmap(grad)": lambda: per_sample(params, x, y), "loop": looped}
    results = {name: fn() for name, fn in fns.items()}  # warm-up, and the values compared
    for _ in range(args.repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    diff = max(float((results["vmap(grad)"][k] - results["loop"][k]).abs().max()) for k in params)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.model}, batch {args.batch}, {args.threads} thread(s), {args.repeats} repeats")
    for name, t in med.items():
        print(f"  {name:11s} {t * 1e3:8.1f} ms  ({args.batch / t:6.1f} images/s)")
    print(f"  loop / vmap(grad): {med['loop'] / med['vmap(grad)']:.2f}x; max |diff| {diff:.1e}")


if __name__ == "__main__":
    main()
