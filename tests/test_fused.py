"""The fused C++ kernel of content attention with axis logits and attention dropout
(layers/kernels/fused.py) against its plain equations (the dense logits, softmax,
functional.dropped_links' mask): values and gradients at random shapes in float64, gradcheck,
float32 and bfloat16 autocast against a float64 reference as tight as the plain path's, and the
dropout hash against a pure-Python restatement."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnconv.layers.functional import drop_threshold, dropped_links
from attnconv.layers.kernels import fused
from attnconv.layers.kernels.fused import axis_attention_fused, axis_attention_reference

pytestmark = pytest.mark.skipif(not fused.available(), reason="the C++ extension did not build")


def _inputs(b, nh, h, w, dk, dv, dtype, shared=False, batch_axis=False, gen=None):
    t = h * w
    q, k = (torch.randn(b, nh, t, dk, dtype=dtype, generator=gen) for _ in "qk")
    v = torch.randn(b, 1 if shared else nh, t, dv, dtype=dtype, generator=gen)
    qa = torch.randn(1 if batch_axis else b, nh, t, h + w, dtype=dtype, generator=gen) * 3
    return [x.requires_grad_() for x in (q, k, v, qa)]


def _run(f, q, k, v, qa, h, w, p, per_image, seed, scale=0.37):
    v_all = v.expand(q.shape[0], q.shape[1], *v.shape[2:])  # shared values: stride 0 on heads
    return f(q, k, v_all, qa, h, w, scale, p, per_image, seed=seed)


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 3),
    nh=st.integers(1, 3),
    h=st.integers(1, 7),
    w=st.integers(1, 7),
    dk=st.sampled_from([1, 2, 5, 9, 16, 17]),
    dv=st.sampled_from([1, 2, 5, 9, 16, 17]),
    p=st.sampled_from([0.0, 0.1, 0.5]),
    per_image=st.booleans(),
    shared=st.booleans(),
    batch_axis=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_fused_equals_plain_equations(b, nh, h, w, dk, dv, p, per_image, shared, batch_axis, seed):
    """float64: values and the gradients of q, k, v (shared or not) and the axis logits."""
    gen = torch.Generator().manual_seed(seed % 1000)
    xs = _inputs(b, nh, h, w, dk, dv, torch.float64, shared, batch_axis, gen)
    y = _run(axis_attention_fused, *xs, h, w, p, per_image, seed)
    ref = _run(axis_attention_reference, *xs, h, w, p, per_image, seed)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn(y.shape, dtype=y.dtype, generator=gen)
    for a, r in zip(torch.autograd.grad(y, xs, g), torch.autograd.grad(ref, xs, g)):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("h, w, dk, dv", [(17, 17, 8, 15), (20, 20, 16, 8), (17, 18, 24, 17)])
def test_fused_equals_plain_equations_over_query_blocks(h, w, dk, dv):
    """float64 over T > 256 tokens: 2-3 query blocks, the key and value gradients summed over
    them in their column-major accumulators (fused_axis.cpp), with dropout."""
    gen = torch.Generator().manual_seed(h * w + dk)
    xs = _inputs(2, 2, h, w, dk, dv, torch.float64, gen=gen)
    y = _run(axis_attention_fused, *xs, h, w, 0.2, True, 5)
    ref = _run(axis_attention_reference, *xs, h, w, 0.2, True, 5)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn(y.shape, dtype=y.dtype, generator=gen)
    for a, r in zip(torch.autograd.grad(y, xs, g), torch.autograd.grad(ref, xs, g)):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("p, per_image", [(0.0, True), (0.3, True), (0.3, False)])
def test_fused_gradcheck_float64(p, per_image):
    xs = _inputs(2, 2, 3, 4, 5, 3, torch.float64, shared=True)
    f = lambda *a: _run(axis_attention_fused, *a, 3, 4, p, per_image, seed=7)  # noqa: E731
    assert torch.autograd.gradcheck(f, xs)


@pytest.mark.parametrize("autocast", [False, True])
def test_fused_precision_as_tight_as_plain(autocast):
    """float32 inputs (and bfloat16 autocast around the call): the fused kernel's distance to the
    float64 equations is within 2x the plain float32 equations' (values and gradients), at the
    content model's geometry (16 x 16 tokens, large axis logits)."""
    h = w = 16
    xs = _inputs(2, 3, h, w, 32, 16, torch.float64, shared=True)
    exact = _run(axis_attention_reference, *xs, h, w, 0.1, True, seed=11)
    g = torch.randn_like(exact)
    exact_g = torch.autograd.grad(exact, xs, g)
    xs32 = [x.detach().float().requires_grad_() for x in xs]
    outs = {}
    for name, f in (("fused", axis_attention_fused), ("plain", axis_attention_reference)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast and name == "fused"):
            y = _run(f, *xs32, h, w, 0.1, True, seed=11)
        grads = torch.autograd.grad(y, xs32, g.float())
        outs[name] = [(y.double() - exact).abs().max().item()] + [
            (a.double() - e).abs().max().item() for a, e in zip(grads, exact_g)
        ]
    for got, plain in zip(outs["fused"], outs["plain"]):
        assert got <= 2 * plain + 1e-6, (outs["fused"], outs["plain"])


def _h32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x735A2D97) & 0xFFFFFFFF
    return x ^ (x >> 15)


def test_dropped_links_hash_restated_in_python():
    """Every link of the mask, from a pure-Python restatement of the documented hash (the one the
    C++ kernel redraws): row = (b Nh + h) T + i, dropped when h32(key(row) ^ j) < p 2^32."""
    nh, t, b, p, seed = 2, 6, 3, 0.4, 123456789
    mask = dropped_links(nh, t, b, p, "cpu", seed=seed).view(-1, t)
    for row in range(b * nh * t):
        key = _h32(_h32((row & 0xFFFFFFFF) ^ seed) ^ (row >> 32))
        want = [_h32(key ^ j) < drop_threshold(p) for j in range(t)]
        assert mask[row].tolist() == want


def test_dropped_links_rate_and_independence():
    d = dropped_links(9, 256, 4, 0.1, "cpu", seed=3).float()
    assert abs(d.mean().item() - 0.1) < 2e-3
    assert abs((d[0, 0] * d[0, 1]).mean().item() - 0.01) < 2e-3  # heads independent
    assert abs((d[0] * d[1]).mean().item() - 0.01) < 2e-3  # images independent


def test_fused_bad_axis_logits_one_line():
    q, k, v, qa = _inputs(1, 2, 3, 4, 5, 3, torch.float32)
    with pytest.raises(ValueError, match="q_axis"):
        axis_attention_fused(q, k, v, qa[..., :-1], 3, 4, 0.5)


def test_model_layer_runs_fused_and_matches_dense():
    """The content layer's default training kernel on CPU is the fused one; under one seed it
    equals the dense kernel (backend="blocked") in float64, values and gradients."""
    from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d

    lay = (
        MultiHeadSelfAttention2d(
            8, 8, 2, positional="relative_learned", dropout=0.2, dropout_mask="sample"
        )
        .double()
        .train()
    )
    x = torch.randn(2, 8, 5, 6, dtype=torch.float64, requires_grad=True)
    assert lay.kernel(x) == "fused"
    res = []
    for backend in (None, "blocked"):
        lay.backend = backend
        torch.manual_seed(5)
        y = lay(x)
        res.append((y, *torch.autograd.grad(y.square().sum(), [x, *lay.parameters()])))
    for a, b in zip(*res):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@settings(deadline=None, max_examples=15)
@given(
    positional=st.sampled_from(["relative_learned", "quadratic"]),
    b=st.integers(1, 3),
    heads=st.integers(1, 3),
    h=st.integers(1, 7),
    w=st.integers(1, 7),
    seed=st.integers(0, 2**16),
)
def test_inference_forward_fused_equals_reference(positional, b, heads, h, w, seed):
    """In inference (eval, inference_mode) the plan runs the fused kernel at 16x16 on the
    learned relative content layer (plan._fused_wins); forced at any shape it equals
    backend="reference" in float64."""
    from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d

    torch.manual_seed(seed)
    lay = MultiHeadSelfAttention2d(6, 6, heads, positional=positional, max_size=16).double().eval()
    x = torch.randn(b, 6, h, w, dtype=torch.float64)
    outs = []
    for backend in ("fused", "reference"):
        lay.backend = backend
        with torch.inference_mode():
            if backend == "fused":
                assert lay.kernel(x) == "fused"
            outs.append(lay(x))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)
    lay.backend = None
    with torch.inference_mode():
        assert lay.kernel(torch.randn(1, 6, 16, 16, dtype=torch.float64)) == (
            "fused" if positional == "relative_learned" else "shared_bias"
        )
