"""The C++ local window kernel (kernels/fused_local.cpp) against the Python window kernel of
kernels/window.py (itself tested against the unfold reference in test_local.py): values, returned
probabilities and every gradient in float64 at random shapes, gradcheck, float32 and bf16
precision against float64, the layer's choice and the fallback without the extension."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck

from attnconv.layers.kernels import fused
from attnconv.layers.kernels.window import local_attention
from attnconv.layers.local import LocalSelfAttention2d

pytestmark = pytest.mark.skipif(not fused.available(), reason="the C++ extension did not build")


def _inputs(b, nh, dk, dv, h, w, ks, keys, rel, dtype, seed, nm=0):
    """q, k, v, rel_row, rel_col, mix; nm > 0: the stem's nm value maps and their mix."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, dtype=dtype, generator=gen).requires_grad_()

    q = r(b, nh, dk, h, w)
    v = r(b, nh, nm, dv, h, w) if nm else r(b, nh, dv, h, w)
    k = r(b, nh, dk, h, w) if keys else None
    rr, rc = (r(ks, dk // 2), r(ks, dk // 2)) if rel else (None, None)
    mix = r(ks * ks, nm) if nm else None
    return q, k, v, rr, rc, mix


def _run(inputs, ks, padding, use_fused):
    q, k, v, rr, rc, mix = inputs
    y, p = local_attention(
        q,
        k,
        v,
        kernel_size=ks,
        rel_row=rr,
        rel_col=rc,
        mix=mix,
        padding=padding,
        return_attention=True,
        backend="fused" if use_fused else "window",
    )
    wrt = [t for t in inputs if t is not None]
    g = torch.cos(torch.arange(y.numel(), dtype=y.dtype)).view_as(y)
    return y, p, torch.autograd.grad((y * g).sum(), wrt)


@settings(deadline=None, max_examples=40)
@given(
    b=st.integers(1, 2),
    nh=st.integers(1, 3),
    dk=st.sampled_from([2, 4, 6]),
    dv=st.integers(1, 5),
    h=st.integers(1, 9),
    w=st.integers(1, 9),
    ks=st.integers(1, 9),
    mode=st.sampled_from(["qk+qr", "qk", "qr"]),
    padding=st.sampled_from(["mask", "zeros"]),
    nm=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_fused_equals_window_float64(b, nh, dk, dv, h, w, ks, mode, padding, nm, seed):
    """Every logit form (content and relative, content only, relative only), both borders, even
    and odd windows, windows larger than the image, plain values and the stem's mixed ones."""
    inputs = _inputs(b, nh, dk, dv, h, w, ks, "qk" in mode, "qr" in mode, torch.float64, seed, nm)
    y1, p1, g1 = _run(inputs, ks, padding, False)
    y2, p2, g2 = _run(inputs, ks, padding, True)
    torch.testing.assert_close(y2, y1, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(p2, p1, rtol=1e-12, atol=1e-12)
    for a, r in zip(g2, g1):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("padding", ["mask", "zeros"])
@pytest.mark.parametrize("nm", [0, 2])
def test_fused_gradcheck_float64(padding, nm):
    inputs = _inputs(1, 2, 4, 3, 4, 5, 3, True, True, torch.float64, 0, nm)
    ins = [t for t in inputs if t is not None]

    def f(q, k, v, rr, rc, *mix):
        m = mix[0] if mix else None
        return local_attention(
            q, k, v, kernel_size=3, rel_row=rr, rel_col=rc, mix=m, padding=padding, backend="fused"
        )

    assert gradcheck(f, ins)


def _rel(a, ref):
    return ((a.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("autocast", [False, True])
def test_fused_precision_as_tight_as_window(autocast):
    """float32 and bf16 autocast through the SASA layer: output and gradient errors against
    float64 within 2x of the Python window kernel's."""
    torch.manual_seed(0)
    layer = LocalSelfAttention2d(16, 32, 4, 7)
    x, g = torch.randn(2, 16, 12, 10), torch.randn(2, 32, 12, 10)

    def run(module, inp, ac):
        inp = inp.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=ac):
            y = module(inp)
        return y, torch.autograd.grad((y.double() * g.double()).sum(), [inp, *module.parameters()])

    ref64 = LocalSelfAttention2d(16, 32, 4, 7).double()
    ref64.load_state_dict(layer.state_dict())
    ref64.backend = "window"
    y64, g64 = run(ref64, x.double(), False)
    out = {}
    for backend in ("window", "fused"):
        layer.backend = backend
        out[backend] = run(layer, x, autocast)
    (yw, gw), (yf, gf) = out["window"], out["fused"]
    assert _rel(yf.detach(), y64) <= 2 * _rel(yw.detach(), y64) + 1e-7
    for a, b_, r in zip(gf, gw, g64):
        assert _rel(a, r) <= 2 * _rel(b_, r) + 1e-7


def test_double_backward_through_fused_is_the_plain_gradient():
    """create_graph: the fused kernel's gradient is the plain path's, itself differentiable."""
    inputs = _inputs(1, 2, 4, 3, 5, 5, 3, True, True, torch.float64, 1)
    ins = [t for t in inputs if t is not None]
    out = []
    for use in (False, True):
        y = local_attention(
            *inputs[:3],
            kernel_size=3,
            rel_row=inputs[3],
            rel_col=inputs[4],
            backend="fused" if use else "window",
        )
        (gq,) = torch.autograd.grad(y.square().sum(), inputs[0], create_graph=True)
        out.append(torch.autograd.grad(gq.square().sum(), ins))
    for a, r in zip(*out):
        torch.testing.assert_close(a, r)


def test_layer_falls_back_to_the_window_kernel_without_the_extension():
    code = (
        "import torch; from attnconv.layers.local import LocalSelfAttention2d as L\n"
        "m = L(8, 8, 2, 3); print(m.kernel('cpu'))\n"
        "x = torch.randn(1, 8, 5, 5, requires_grad=True); m(x).sum().backward()\n"
    )
    env = {**os.environ, "ATTNCONV_NO_FUSED": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "window"


def test_no_extension_call_while_a_compiler_traces():
    """torch.export cannot trace into the extension: both kernel tables leave the fused kernels
    while it traces (content: the blocked kernel; local: the window); torch.compile calls them
    as custom ops (kernels/ops.py): the eager choice."""
    from attnconv.layers.kernels import plan
    from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d

    layer = MultiHeadSelfAttention2d(8, 8, 2, positional="relative_learned", content=True)
    case = plan.Case(layer.positional_encoding.term(16, 16, content=True), t=256)
    assert plan.choose(case) == "fused" and plan.choose(case._replace(p_drop=0.1)) == "fused"
    assert plan.choose(case._replace(tracing=True)) == "blocked"
    assert plan.choose(case._replace(tracing=True, p_drop=0.1)) == "dense_dropout"
    assert plan.choose(plan.LocalCase(), plan.LOCAL_TABLE) == "fused"
    assert plan.choose(plan.LocalCase(tracing=True), plan.LOCAL_TABLE) == "window"
    compiled = case._replace(tracing=True, compiled=True)
    assert (
        plan.choose(compiled) == "fused" and plan.choose(compiled._replace(p_drop=0.1)) == "fused"
    )
    assert plan.choose(plan.LocalCase(tracing=True, compiled=True), plan.LOCAL_TABLE) == "fused"


def test_stem_runs_the_fused_kernel_and_equals_the_window():
    """The attention stem (mixed values) picks the C++ kernel on CPU; its output and gradients
    equal the Python window kernel's (float64)."""
    from attnconv.layers.stem import AttentionStem2d

    torch.manual_seed(0)
    stem = AttentionStem2d(3, 8, 2, kernel_size=4, mixtures=3, pool=1).double()
    x = torch.randn(2, 3, 9, 7, dtype=torch.float64, requires_grad=True)
    assert stem.kernel("cpu") == "fused" and stem.kernel("cuda") == "window"
    y1 = stem(x)
    g1 = torch.autograd.grad(y1.square().sum(), [x, *stem.parameters()])
    stem.backend = "reference"
    y2 = stem(x)
    g2 = torch.autograd.grad(y2.square().sum(), [x, *stem.parameters()])
    torch.testing.assert_close(y1, y2)
    for a, r in zip(g1, g2):
        torch.testing.assert_close(a, r)


@pytest.mark.parametrize("autocast", [False, True])
def test_fused_mixed_values_precision_as_tight_as_window(autocast):
    """The stem's mixed values: float32 and bf16-autocast output and gradient errors against
    float64 within 2x of the Python window kernel's."""
    inputs = _inputs(2, 2, 8, 6, 10, 9, 4, True, False, torch.float64, 3, nm=3)
    ins = [t for t in inputs if t is not None]

    def run(tensors, use, ac):
        q, k, v, mix = tensors
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=ac):
            y = local_attention(
                q, k, v, kernel_size=4, mix=mix, backend="fused" if use else "window"
            )
        return y, torch.autograd.grad((y.double() ** 2).sum(), tensors)

    y64, g64 = run(ins, False, False)
    low = [t.detach().float().requires_grad_() for t in ins]
    yw, gw = run(low, False, autocast)
    yf, gf = run(low, True, autocast)
    assert _rel(yf.detach(), y64) <= 2 * _rel(yw.detach(), y64) + 1e-7
    for a, b_, r in zip(gf, gw, g64):
        assert _rel(a, r) <= 2 * _rel(b_, r) + 1e-7
