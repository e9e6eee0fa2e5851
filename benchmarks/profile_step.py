"""Where one training step of a paper model spends its CPU time: torch.profiler's table of one
step (forward, backward, SGD) after two warm-up steps, by operator and input shape.

    python benchmarks/profile_step.py [--model sa_learned_content] [--batch 8] [--bf16] \
        [--threads 1] [--rows 14]
    python benchmarks/profile_step.py --products 256x400x256 256x256x400
    python benchmarks/profile_step.py --layouts 1024x64x8 1024x64x64 [--heads 8]

``--products MxKxN ...`` times instead an (M, K) @ (K, N) matrix product in float32 and in
bf16 (torch.mm into a preallocated output, medians of 7 rounds of 20), e.g. the fused content
kernel's per-head products at the paper's 16x16 tokens and 400-wide heads.

``--layouts MxKxN ...`` times, in float32, the product the fused content kernel accumulates its
key and value gradients with, out (M, N) += a^T b over a query block (a: the block's (K, M)
probabilities or dS, b: its (K, N) queries or output gradient), into an out stored row-major and
into one stored column-major (a transposed view), in microseconds; ``--heads N`` batches N heads'
products in one baddbmm_, as the Python query-blocked kernels (blocked.py) run them.

The model at its paper configuration (hidden 400 for the Cordonnier models), random 32x32
images, subnormals flushed as `attnconv train` runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch
from torch.profiler import ProfilerActivity, profile

import attnconv


def products(shapes: list[str]) -> None:
    print(f"{torch.get_num_threads()} thread(s)\n| M x K x N | fp32 GFLOP/s | bf16 GFLOP/s |")
    print("|---|---|---|")
    for shape in shapes:
        m, k, n = (int(v) for v in shape.split("x"))
        rates = []
        for dt in (torch.float32, torch.bfloat16):
            a, b = torch.randn(m, k, dtype=dt), torch.randn(k, n, dtype=dt)
            out = torch.empty(m, n, dtype=dt)
            rates.append(2 * m * k * n / _median_s(partial(torch.mm, a, b, out=out)) / 1e9)
        print(f"| {shape} | {rates[0]:.0f} | {rates[1]:.0f} |")


def _median_s(f, rounds: int = 8, calls: int = 20) -> float:
    times = []
    for _ in range(rounds):  # the first round a warm-up
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times[1:])


def layouts(shapes: list[str], heads: int = 1) -> None:
    batch = (heads,) if heads > 1 else ()
    acc = "baddbmm_" if batch else "addmm_"  # the fused kernel's product, or blocked.py's
    what = f"{heads} head(s), {acc}"
    print(f"{torch.get_num_threads()} thread(s), float32, out (M, N) += a^T b, {what}")
    print("| M x K x N | row-major out us | column-major out us | row / column |")
    print("|---|---|---|---|")
    for shape in shapes:
        m, k, n = (int(v) for v in shape.split("x"))
        a, b = torch.randn(*batch, k, m), torch.randn(*batch, k, n)
        rows, cols = torch.zeros(*batch, m, n), torch.zeros(*batch, n, m).transpose(-2, -1)
        t_row = _median_s(partial(getattr(rows, acc), a.transpose(-2, -1), b))
        t_col = _median_s(partial(getattr(cols, acc), a.transpose(-2, -1), b))
        print(f"| {shape} | {t_row * 1e6:.0f} | {t_col * 1e6:.0f} | {t_row / t_col:.2f} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="sa_learned_content")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast, as the paper configs train")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", type=int, default=14)
    p.add_argument("--products", nargs="+", metavar="MxKxN")
    p.add_argument("--layouts", nargs="+", metavar="MxKxN")
    p.add_argument("--heads", type=int, default=1, help="--layouts: heads batched in one product")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.products:
        return products(a.products)
    if a.layouts:
        return layouts(a.layouts, a.heads)
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    model = attnconv.create_model(a.model).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(a.batch, 3, 32, 32), torch.randint(0, 10, (a.batch,))

    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=a.bf16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    step()
    step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    table = prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cpu_time_total",
        row_limit=a.rows,
        max_name_column_width=24,
        max_shapes_column_width=70,
    )
    print(
        f"{a.model}, batch {a.batch}, {'bf16 autocast' if a.bf16 else 'float32'}, "
        f"{a.threads} thread(s)\n{table}"
    )


if __name__ == "__main__":
    main()
