"""A layer call on the GPU queues its kernels without waiting for the GPU: no host-device
synchronization inside the Triton kernels' forward and backward (torch's sync debug mode turns
one into an error). A CUDA tensor made from a Python list is such a synchronization (a copy
from pageable memory), once a call before ``triton_axis.device_values``. Needs CUDA
(benchmarks/gpu_session.sh runs it)."""

from __future__ import annotations

import pytest
import torch

from attnconv.layers.kernels import triton_axis

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and triton_axis.INSTALLED), reason="needs CUDA and triton"
)


@pytest.mark.parametrize("p", [0.0, 0.1])
def test_the_triton_kernels_never_wait_for_the_gpu(p):
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, nh, h, w, d = 2, 3, 6, 7, 16
    q, k, v = (
        torch.randn(b, nh, h * w, d, device="cuda", generator=gen, requires_grad=True)
        for _ in "qkv"
    )
    qa = torch.randn(b, nh, h * w, h + w, device="cuda", generator=gen, requires_grad=True)

    def call():
        y = triton_axis.axis_attention_triton(q, k, v, qa, h, w, d**-0.5, p, seed=5)
        return torch.autograd.grad(y.square().sum(), (q, k, v, qa))

    torch.cuda.synchronize()
    call()  # compiles, and the launch settles its rung
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        grads = call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(g.shape == x.shape for g, x in zip(grads, (q, k, v, qa)))


def test_device_values_are_the_values():
    """The fill per value gives what ``torch.tensor`` gives, exactly (int64 seeds past 2^32,
    float64 scales)."""
    for values, dtype in (([7, 2**40 + 3], torch.int64), ([0.37, 1 / 0.9], torch.float64)):
        got = triton_axis.device_values(values, dtype, torch.device("cuda"))
        assert torch.equal(got.cpu(), torch.tensor(values, dtype=dtype))
