"""Issue 15, item 4: second derivatives of every public layer, in float64 (gradgradcheck).

The plain paths (``backend="reference"``) are differentiable any number of times; the local window
kernel's fast path has an exact double backward (its backward under ``create_graph`` is the
plain path's gradient); PyTorch's fused attention kernel has none, and a double backward
through it raises our one-line HigherOrderGradError instead of PyTorch's raw error."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.autograd import gradgradcheck

from attnconv.layers.first_order import HigherOrderGradError
from attnconv.layers.kernels.window import local_attention
from attnconv.layers.local import LocalSelfAttention2d
from attnconv.layers.mha import MultiHeadAttention
from public_layers import public_layers


def _check(layer: nn.Module, x: torch.Tensor) -> bool:
    """gradgradcheck, and the gradient built for differentiation (create_graph) equals the plain
    one (gradgradcheck alone would accept a consistently wrong differentiable gradient)."""
    layer = layer.double().eval()
    gy = torch.randn_like(layer(x))
    (g0,) = torch.autograd.grad(layer(x), x, gy)
    (g1,) = torch.autograd.grad(layer(x), x, gy, create_graph=True)
    torch.testing.assert_close(g1, g0, rtol=1e-10, atol=1e-12)
    return gradgradcheck(lambda t: layer(t), (x,), eps=1e-6, atol=1e-5, rtol=1e-4)


REF = public_layers("reference")


@pytest.mark.parametrize("name, layer, x", REF, ids=[r[0] for r in REF])
def test_plain_paths_have_exact_second_derivatives(name, layer, x):
    torch.manual_seed(0)
    assert _check(layer, x)


FAST = public_layers(None)


# the window kernel's double backward costs 3-5 s a layer: those cases are marked slow
WINDOW = ("local", "stem")
FAST_PARAMS = [
    pytest.param(*r, id=r[0], marks=[pytest.mark.slow] * r[0].startswith(WINDOW)) for r in FAST
]


@pytest.mark.parametrize("name, layer, x", FAST_PARAMS)
def test_fast_paths_are_exact_or_say_they_are_first_order(name, layer, x):
    """Never a wrong value and never a raw PyTorch error: exact, or our one-line message."""
    torch.manual_seed(0)
    try:
        assert _check(layer, x)
    except HigherOrderGradError as e:
        assert "backend='reference'" in str(e) and "\n" not in str(e)
        assert name.startswith(("mhsa2d", "mha", "converted")), name  # the fused kernel only
    if name.startswith(("local", "stem")):  # the window kernel's fast path is exact
        assert _check(layer, x)


@pytest.mark.parametrize("padding", ["mask", "zeros"])
@pytest.mark.parametrize("rel, content", [(False, True), (True, True), (True, False)])
def test_local_kernel_fast_path_double_backward(padding, rel, content):
    """gradgradcheck on the kernel itself (every input: q, k, v, the relative tables)."""
    torch.manual_seed(1)

    def t(*shape):
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)

    q, v = t(1, 2, 2, 3, 4), t(1, 2, 2, 3, 4)
    k = t(1, 2, 2, 3, 4) if content else None
    rr, rc = (t(3, 1), t(3, 1)) if rel else (None, None)
    ins = [a for a in (q, k, v, rr, rc) if a is not None]

    def f(*a):
        it = iter(a)
        qq, kk = next(it), next(it) if content else None
        vv = next(it)
        r1, r2 = (next(it), next(it)) if rel else (None, None)
        return local_attention(qq, kk, vv, kernel_size=3, rel_row=r1, rel_col=r2, padding=padding)

    assert gradgradcheck(f, ins)
    gy = torch.randn_like(f(*ins))
    plain = torch.autograd.grad(f(*ins), ins, gy)
    for a, b in zip(torch.autograd.grad(f(*ins), ins, gy, create_graph=True), plain):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_gradient_penalty_fast_equals_reference():
    """The issue's case: d(||dL/dx||^2)/dx of LocalSelfAttention2d, fast vs plain path."""
    torch.manual_seed(0)
    fast = LocalSelfAttention2d(4, 8, 2, kernel_size=3).double()
    ref = LocalSelfAttention2d(4, 8, 2, kernel_size=3, backend="reference").double()
    ref.load_state_dict(fast.state_dict())
    x0 = torch.randn(2, 4, 5, 5, dtype=torch.float64)
    out = []
    for layer in (fast, ref):
        x = x0.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(layer(x).sum(), x, create_graph=True)
        (gg,) = torch.autograd.grad(g.pow(2).sum(), x)
        out.append(gg)
    assert out[1].abs().max() > 1e-3  # a real second derivative, not a zero
    torch.testing.assert_close(out[0], out[1], rtol=1e-10, atol=1e-12)


def test_fused_double_backward_is_our_one_line_error():
    layer = MultiHeadAttention(8, 2).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    with pytest.raises(
        HigherOrderGradError, match=r"has no second derivative .*backend='reference'"
    ):
        torch.autograd.grad(layer(x).sum(), x, create_graph=True)
    (g,) = torch.autograd.grad(layer(x).sum(), x)  # first order: unchanged
    assert g.shape == x.shape
