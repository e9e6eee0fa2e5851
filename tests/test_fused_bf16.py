"""The fused C++ content kernel with bfloat16 operands (bf16 autocast): q, k, v stay bfloat16
into its five products, the axis logits, softmax, mask and sums float32. Against float64 on the
same rounded inputs it is as tight as the plain equations under autocast (values and every
gradient), with one query block and with several, with and without dropout, values shared by
the heads cast once; and the content layer under autocast hands the kernel bfloat16."""

from __future__ import annotations

import pytest
import torch

from attnconv.layers.kernels import fused
from attnconv.layers.kernels.fused import axis_attention_fused, axis_attention_reference

pytestmark = pytest.mark.skipif(not fused.available(), reason="the C++ extension did not build")


@pytest.fixture
def seen(monkeypatch):
    """The (q, k, v, qa) of each call the extension's forward gets, recorded; the calls run."""
    calls = []
    ext = fused.extension()

    class Spy:
        def forward(self, *args):
            calls.append(args[:4])
            return ext.forward(*args)

        def backward(self, *args):
            return ext.backward(*args)

    monkeypatch.setattr(fused, "extension", lambda: Spy())
    return calls


def _errors(f, xs, h, w, p, g, exact, exact_g, autocast):
    """Max |error| against float64 of the output and each input's gradient."""
    leaves = [x.detach().clone().requires_grad_() for x in xs]
    b, nh = leaves[0].shape[:2]
    v = leaves[2].expand(b, nh, *leaves[2].shape[2:])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = f(leaves[0], leaves[1], v, leaves[3], h, w, 0.37, p, True, seed=11)
    grads = torch.autograd.grad(y, leaves, g.to(y.dtype))
    return [(y.double() - exact).abs().max().item()] + [
        (a.double() - e).abs().max().item() for a, e in zip(grads, exact_g)
    ]


@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize(
    "h, w, shared_v",
    [(16, 16, False), (16, 16, True), (20, 20, True), (3, 50, False)],  # 1, 1, 3, 2 query blocks
)
def test_bf16_operands_as_tight_as_plain_autocast(h, w, shared_v, p):
    gen = torch.Generator().manual_seed(h * w + int(shared_v))
    b, nh, dk, dv, t = 2, 3, 32, 16, h * w
    q, k = (torch.randn(b, nh, t, dk, generator=gen).bfloat16() for _ in "qk")
    # shared: one float32 value tensor every head reads (value="identity"), else bfloat16 values
    v = torch.randn(b, 1 if shared_v else nh, t, dv, generator=gen)
    v = v if shared_v else v.bfloat16()
    qa = torch.randn(b, nh, t, h + w, generator=gen) * 3  # the axis logits: float32
    xs = [q, k, v, qa]
    exact_in = [x.double().requires_grad_() for x in xs]
    ve = exact_in[2].expand(b, nh, t, dv)
    exact = axis_attention_reference(*exact_in[:2], ve, exact_in[3], h, w, 0.37, p, True, seed=11)
    g = torch.randn(exact.shape, dtype=torch.float64, generator=gen)
    exact_g = torch.autograd.grad(exact, exact_in, g)
    got = _errors(axis_attention_fused, xs, h, w, p, g, exact, exact_g, autocast=False)
    plain = _errors(axis_attention_reference, xs, h, w, p, g, exact, exact_g, autocast=True)
    assert all(e > 0 for e in plain), plain  # the plain path rounds: a bound, not zero
    for a, r in zip(got, plain):
        assert a <= 2 * r, (got, plain)


def test_bf16_values_shared_by_the_heads_are_cast_once(seen):
    """The kernel gets a float32 value tensor the heads share as one bfloat16 copy, expanded at
    stride 0; its gradient, the sum over the heads, stays float32 and agrees with float64."""
    b, nh, h, w, d = 2, 4, 3, 5, 8
    q, k = (torch.randn(b, nh, h * w, d).bfloat16().requires_grad_() for _ in "qk")
    x = torch.randn(b, 1, h * w, d, requires_grad=True)
    qa = torch.randn(b, nh, h * w, h + w, requires_grad=True)
    y = axis_attention_fused(q, k, x.expand(b, nh, h * w, d), qa, h, w, 0.3)
    (gx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert [(q.dtype, v.dtype, v.stride(1)) for q, _, v, _ in seen] == [
        (torch.bfloat16,) * 2 + (0,)
    ]
    # the same gradient from the kernel's per-head float32 gradients summed in float64
    xb = x.detach().bfloat16().double().requires_grad_()
    ref = axis_attention_reference(
        q.detach().double(),
        k.detach().double(),
        xb.expand(b, nh, h * w, d),
        qa.detach().double(),
        h,
        w,
        0.3,
    )
    (gref,) = torch.autograd.grad(ref, xb, torch.ones_like(ref))
    assert gx.dtype == torch.float32
    torch.testing.assert_close(gx.double(), gref, rtol=0.05, atol=0.05)


def test_the_content_layer_under_autocast_hands_the_kernel_bf16(seen):
    from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d

    torch.manual_seed(0)
    for value in ("linear", "identity"):
        lay = MultiHeadSelfAttention2d(
            8, 8, 2, positional="relative_learned", dropout=0.1, value=value
        ).train()
        x = torch.randn(2, 8, 6, 7, requires_grad=True)
        assert lay.kernel(x) == "fused"
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lay(x)
        y.float().square().sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()
    bf = torch.bfloat16
    assert [tuple(t.dtype for t in call) for call in seen] == [(bf, bf, bf, torch.float32)] * 2
