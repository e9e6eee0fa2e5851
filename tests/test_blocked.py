"""The query-blocked exact kernel for content + row/column positional attention (blocked.py).

It must equal its plain equation and the layer's dense reference (float64: values and
gradients, random shapes and block sizes), pass gradcheck, and be as exact as the dense path in
float32 and under bfloat16 autocast (errors against float64 at most 2x the dense path's, as in
tests/test_precision.py).
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck

from attnconv.layers.first_order import HigherOrderGradError
from attnconv.layers.kernels import fused
from attnconv.layers.kernels.blocked import axis_attention, axis_attention_reference
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d

F64 = torch.float64


def _inputs(b, qb, nh, h, w, dk, dv, seed, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    t = h * w
    q, k = (torch.randn(b, nh, t, dk, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(b, nh, t, dv, generator=g, dtype=dtype)
    q_axis = 3 * torch.randn(qb, nh, t, h + w, generator=g, dtype=dtype)
    return [x.requires_grad_() for x in (q, k, v, q_axis)]


@settings(deadline=None, max_examples=40)
@given(
    b=st.integers(1, 3),
    shared=st.booleans(),
    nh=st.integers(1, 3),
    h=st.integers(1, 6),
    w=st.integers(1, 6),
    dk=st.integers(1, 5),
    dv=st.integers(1, 5),
    block=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_kernel_equals_its_plain_equation(b, shared, nh, h, w, dk, dv, block, seed):
    """Values and the gradients of q, k, v and the axis logits (batch B, or 1 shared by the
    batch), for any number of query blocks (a block of 1 query up to the whole image)."""
    args = _inputs(b, 1 if shared else b, nh, h, w, dk, dv, seed)
    y = axis_attention(*args, h, w, 0.7, block=block)
    y_ref = axis_attention_reference(*args, h, w, 0.7)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(y)
    grads = torch.autograd.grad((y * g).sum(), args)
    grads_ref = torch.autograd.grad((y_ref * g).sum(), args)
    for a, r in zip(grads, grads_ref):
        torch.testing.assert_close(a, r, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("shared", [False, True])
def test_kernel_gradcheck(shared):
    args = _inputs(2, 1 if shared else 2, 2, 2, 3, 3, 2, seed=1)  # 2 queries a block: 3 blocks
    assert gradcheck(lambda *a: axis_attention(*a, 2, 3, 0.5, block=2), args)


def test_kernel_has_first_derivative_only():
    args = _inputs(1, 1, 1, 2, 2, 2, 2, seed=2)
    with pytest.raises(HigherOrderGradError):
        (dq,) = torch.autograd.grad(
            axis_attention(*args, 2, 2, 1.0).sum(), args[0], create_graph=True
        )
        dq.sum().backward()


def test_layer_routes_to_blocked_kernel_from_16x16_on_cpu():
    """From 16x16 on CPU: in training the fused C++ kernel where it is built (the blocked one
    otherwise), in inference too at 16x16 but the blocked kernel above FUSED_INFERENCE_MAX_T;
    dropout never the blocked one; fixed (quadratic) logits in inference the shared bias
    (measured faster, plan._fused_wins)."""
    layer = MultiHeadSelfAttention2d(8, 8, 2, positional="relative_learned", content=True)
    big = "fused" if fused.available() else "blocked"
    for hw, on in ((8, False), (16, True)):
        x = torch.randn(1, 8, hw, hw)
        with torch.no_grad():
            assert (layer.kernel(x, 0.0) == big) == on
        assert (layer.kernel(x, 0.0) == big) == on
        assert layer.kernel(x, 0.1) != "blocked"
    layer.backend = "fold"
    assert layer.kernel(x, 0.0) not in ("blocked", "fused")
    layer.backend = None  # the plan's choice
    with torch.no_grad():
        assert layer.kernel(torch.randn(1, 8, 32, 32), 0.0) == "blocked"
    quad = MultiHeadSelfAttention2d(8, 8, 2, positional="quadratic", content=True)
    with torch.no_grad():
        assert quad.kernel(x, 0.0) == "shared_bias"
    assert quad.kernel(x, 0.0) == big


def test_kernel_rejects_bad_axis_logits():
    q, k, v, q_axis = _inputs(1, 1, 1, 2, 3, 2, 2, seed=3)
    with pytest.raises(ValueError, match="q_axis"):
        axis_attention(q, k, v, q_axis[..., :4], 2, 3, 1.0)


def _pair(positional: str, c: int, heads: int, seed: int, alpha: float | None = None):
    torch.manual_seed(seed)
    fast = MultiHeadSelfAttention2d(c, c, heads, positional=positional, content=True, max_size=64)
    if alpha is not None:
        with torch.no_grad():
            fast.positional_encoding.set_alpha(alpha)
            fast.positional_encoding.centers.uniform_(-4.0, 4.0)
    plain = copy.deepcopy(fast)
    plain.backend = "reference"
    return fast, plain


@settings(deadline=None, max_examples=20)
@given(
    positional=st.sampled_from(["quadratic", "relative_learned"]),
    b=st.integers(1, 2),
    heads=st.integers(1, 3),
    h=st.integers(1, 6),
    w=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_layer_blocked_path_equals_reference(positional, b, heads, h, w, seed):
    """The layer's blocked kernel (forced on: by default it starts at 16^2) equals
    backend="reference" in float64, output and every gradient."""
    fast, plain = (m.double() for m in _pair(positional, 6, heads, seed))
    fast.backend = "blocked"
    x = torch.randn(b, 6, h, w, dtype=F64, requires_grad=True)
    assert fast.kernel(x, 0.0) == "blocked"
    outs = []
    for layer in (fast, plain):
        y = layer(x)
        g = torch.ones_like(y).cumsum(1)
        outs.append((y, torch.autograd.grad((y * g).sum(), [x, *layer.parameters()])))
    (y, grads), (y_ref, grads_ref) = outs
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-11)
    for a, r in zip(grads, grads_ref):
        torch.testing.assert_close(a, r, rtol=1e-8, atol=1e-10)


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).abs().max() / ref.abs().max()).item()


def _forward_backward(layer, x, g, autocast=False):
    """Output and the gradients of <y, g> w.r.t. the input and every parameter."""
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = layer(x)
    return y, torch.autograd.grad((y.to(g.dtype) * g).sum(), [x, *layer.parameters()])


# the centres'/spreads' gradients are a few scalars, each a sum of T^2 cancelling terms: a floor
# on the dense path's error (as in tests/test_precision.py)
FLOOR = {"float32": 2e-6, "bf16": 2e-2}


@pytest.mark.parametrize(
    "positional,alpha", [("relative_learned", None), ("quadratic", 0.5), ("quadratic", 1e4)]
)
@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("backend", ["blocked", None])  # None: the plan's (fused where built)
def test_blocked_is_as_exact_as_dense(positional, alpha, autocast, backend):
    """fp32 and bf16-autocast output and gradient errors against float64 within 2x the dense
    path's (32^2, 4 heads), for the blocked kernel and the kernel the plan trains with."""
    fast, plain = _pair(positional, 16, 4, seed=0, alpha=alpha)
    fast.backend = backend
    x, g = torch.randn(1, 16, 32, 32), torch.randn(1, 16, 32, 32)
    y64, g64 = _forward_backward(copy.deepcopy(plain).double(), x.double(), g.double())
    yf, gf = _forward_backward(fast, x, g, autocast)
    yp, gp = _forward_backward(plain, x, g, autocast)
    e_fast, e_plain = _rel(yf.detach(), y64), _rel(yp.detach(), y64)
    assert e_plain < (2e-2 if autocast else 1e-5) and e_fast <= 2 * e_plain, (e_fast, e_plain)
    names = [n for n, _ in fast.named_parameters()]
    for name, a, p, r in zip(["x", *names], gf, gp, g64):
        if alpha == 1e4 and name != "x" and "value" not in name and "out" not in name:
            continue  # one-hot heads: the logits' gradients underflow in float64 (test_precision)
        if name == "key_proj.bias":  # q . b_k is the same for every key: its gradient is 0
            continue
        floor = FLOOR["bf16" if autocast else "float32"] if "positional" in name else 0.0
        e_a, e_p = _rel(a, r), _rel(p, r)
        assert e_a <= 2 * max(e_p, floor), (name, e_a, e_p)
