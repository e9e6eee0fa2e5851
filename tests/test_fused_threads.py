"""The fused C++ kernels on several intra-op threads (the rest of the suite runs one): every
(image, head) task of a worker thread computes what the one-thread run computes, values and
gradients to the bit, with inputs that require grad (a worker carries the caller's grad mode,
kernels/parallel.h) and with attention dropout (the counter-hash mask reads no thread state)."""

from __future__ import annotations

import pytest
import torch

from attnconv.layers.kernels import fused
from attnconv.layers.kernels.fused import axis_attention_fused
from attnconv.layers.kernels.window import local_attention

pytestmark = pytest.mark.skipif(not fused.available(), reason="the C++ extension did not build")


def _grads(run, inputs):
    """(output, gradients of every input) of ``run(*inputs)`` under a fixed output gradient."""
    y = run(*inputs)
    g = torch.cos(torch.arange(y.numel(), dtype=y.dtype)).view_as(y)
    return [y, *torch.autograd.grad((y * g).sum(), inputs)]


def _on_threads(n, run, inputs):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return _grads(run, inputs)
    finally:
        torch.set_num_threads(before)


def _same(a, b):
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("p", [0.0, 0.2])
def test_content_kernel_on_two_threads_equals_one(p):
    gen = torch.Generator().manual_seed(0)
    b, nh, h, w, dk, dv = 3, 4, 6, 7, 8, 5
    t = h * w
    inputs = [
        torch.randn(*shape, generator=gen).requires_grad_()
        for shape in ((b, nh, t, dk), (b, nh, t, dk), (b, nh, t, dv), (b, nh, t, h + w))
    ]

    def run(q, k, v, qa):
        return axis_attention_fused(q, k, v, qa, h, w, 0.35, p, True, seed=7)

    _same(_on_threads(2, run, inputs), _on_threads(1, run, inputs))


def test_local_kernel_on_two_threads_equals_one():
    gen = torch.Generator().manual_seed(1)
    b, nh, dk, dv, h, w, ks = 3, 4, 4, 5, 9, 8, 5
    inputs = [
        torch.randn(*shape, generator=gen).requires_grad_()
        for shape in ((b, nh, dk, h, w), (b, nh, dk, h, w), (b, nh, dv, h, w), (ks, 2), (ks, 2))
    ]

    def run(q, k, v, rr, rc):
        return local_attention(q, k, v, kernel_size=ks, rel_row=rr, rel_col=rc, backend="fused")

    _same(_on_threads(2, run, inputs), _on_threads(1, run, inputs))


CHILD = """
import torch
from torch.utils.flop_counter import FlopCounterMode
from attnconv.layers.kernels.fused import axis_attention_fused
b, nh, h, w, d = 2, 4, 6, 6, 8
q, k, v = (torch.randn(b, nh, h * w, d, requires_grad=True) for _ in "qkv")
qa = torch.randn(b, nh, h * w, h + w, requires_grad=True)
counts = []
for n in (1, 2):
    torch.set_num_threads(n)
    with FlopCounterMode(display=False) as fc:
        axis_attention_fused(q, k, v, qa, h, w, 0.35, 0.1, True, seed=3).sum().backward()
    counts.append(fc.get_total_flops())
print(counts[0], counts[1])
"""


def test_a_python_dispatch_mode_sees_every_worker_without_deadlock():
    """FlopCounterMode (a Python dispatch mode, carried to the workers) around the kernel on two
    threads: it returns (the kernels release the GIL: a worker calls into Python while the caller
    waits) and counts the FLOPs the one-thread run counts. In a subprocess: a deadlock fails in
    120 s instead of hanging the suite."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-1500:]
    one, two = map(int, run.stdout.split())
    assert one == two > 0
