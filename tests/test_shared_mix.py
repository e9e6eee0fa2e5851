"""The shared kernel's mixed-precision product (kernels.position._SharedMix): y = P v with P
shared by the batch, equal to the plain einsum in values and gradients (random shapes, values
shared by the heads or not), gradcheck in float64, and under bf16 values its dP kept in float32."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnconv.layers.kernels.position import _SharedMix

F64 = torch.float64


def _plain(probs, vs):
    return torch.einsum("hqk,bkhd->bqhd", probs, vs)


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 4),
    nh=st.integers(1, 4),
    t=st.integers(1, 20),
    d=st.integers(1, 6),
    heads_share=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_equals_plain_einsum_values_and_gradients(b, nh, t, d, heads_share, seed):
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(nh, t, t, generator=g).softmax(-1)
    v = torch.randn(b, t, 1 if heads_share else nh, d, generator=g)
    dy = torch.randn(b, t, nh, d, generator=g)
    outs = []
    for f, dt in ((_SharedMix.apply, torch.float32), (_plain, torch.float32), (_plain, F64)):
        p, v0 = probs.to(dt).requires_grad_(), v.to(dt).requires_grad_()
        vs = v0.expand(b, t, nh, d)  # stride 0 over heads when they share values
        y = f(p, vs)
        outs.append((y, *torch.autograd.grad(y, (p, v0), dy.to(dt))))
    # float32 roundoff, not the order of the sums, separates the two: each against float64,
    # the kernel within 2x of the plain einsum's error (a fixed atol flaked at 1.4e-6)
    for a, e, ref in zip(*outs):
        err, plain = (a.double() - ref).abs().max(), (e.double() - ref).abs().max()
        assert err <= 2 * plain + 2e-7, (err, plain)


def test_gradcheck_float64():
    torch.manual_seed(0)
    probs = torch.rand(3, 7, 7, dtype=F64).softmax(-1).requires_grad_()
    vs = torch.randn(2, 7, 3, 4, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(_SharedMix.apply, (probs, vs))
    shared_values = torch.randn(2, 7, 1, 4, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda p, v: _SharedMix.apply(p, v.expand(2, 7, 3, 4)), (probs, shared_values)
    )


def test_bf16_values_dp_in_float32_dv_in_bf16():
    """bf16 values, float32 P: dP in float32 and exactly the float32 sum over the batch of the
    bf16 inputs (no bf16 rounding of the sum); the output and dv in bf16, as the plain path's."""
    torch.manual_seed(0)
    probs = torch.rand(2, 9, 9).softmax(-1).requires_grad_()
    vs = torch.randn(32, 9, 2, 4).bfloat16().requires_grad_()
    dy = torch.randn(32, 9, 2, 4).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = _SharedMix.apply(probs, vs)
    dp, dv = torch.autograd.grad(y, (probs, vs), dy)
    assert (y.dtype, dp.dtype, dv.dtype) == (torch.bfloat16, torch.float32, torch.bfloat16)
    exact = torch.einsum("bqhd,bkhd->hqk", dy.double(), vs.double())
    torch.testing.assert_close(dp.double(), exact, rtol=1e-5, atol=1e-5)
    rounded = torch.einsum("bqhd,bkhd->hqk", dy, vs).double()  # the sum rounded to bf16 once
    assert (dp.double() - exact).abs().max() < (rounded - exact).abs().max() / 100
