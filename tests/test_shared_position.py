"""Separable position-only attention on (H, W, B, C) tokens (kernels/shared_position.py), the paper
models' training path: every kernel against the dense equation with the same dropped links
(values and gradients, random shapes), gradcheck in float64, the layer's ``forward_tokens``
against its plain NCHW reference path, and precision in float32 / bf16 autocast against float64
within 2x of the plain path's error."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnconv
from attnconv.layers.functional import dropped_links
from attnconv.layers.kernels.shared_position import (
    head_sum_linear,
    plain_attention,
    position_attention,
)
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from same_step import assert_same_training_step

F64 = torch.float64


def _operators(nh, h, w, dtype=F64, alpha=1.0):
    r = torch.softmax(alpha * torch.randn(nh, h, h, dtype=dtype), -1).requires_grad_()
    c = torch.softmax(alpha * torch.randn(nh, w, w, dtype=dtype), -1).requires_grad_()
    return r, c


@settings(max_examples=25, deadline=None)
@given(
    nh=st.integers(1, 3),
    h=st.integers(1, 6),
    w=st.integers(1, 6),
    b=st.integers(1, 3),
    ch=st.integers(1, 4),
    per_head=st.booleans(),
    mask=st.sampled_from([None, "batch", "sample"]),
    p=st.sampled_from([0.1, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_position_attention_equals_dense_equation(nh, h, w, b, ch, per_head, mask, p, seed):
    torch.manual_seed(seed)
    r, c = _operators(nh, h, w)
    x = torch.randn(nh if per_head else 1, h, w, b, ch, dtype=F64, requires_grad=True)
    drop = (
        None
        if mask is None
        else dropped_links(nh, h * w, b if mask == "sample" else None, p, "cpu")
    )
    scale = 1.0 if drop is None else 1.0 / (1.0 - p)
    fast = position_attention(r, c, x, drop) * scale
    plain = plain_attention(r, c, x, drop, p)
    torch.testing.assert_close(fast, plain)
    g = torch.randn_like(plain)
    ga = torch.autograd.grad(fast, (r, c, x), g)
    gb = torch.autograd.grad(plain, (r, c, x), g)
    for a, e in zip(ga, gb):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("mask", [None, "batch", "sample"])
@pytest.mark.parametrize("per_head", [False, True])
def test_position_attention_gradcheck(mask, per_head):
    torch.manual_seed(0)
    r, c = _operators(2, 3, 4)
    x = torch.randn(2 if per_head else 1, 3, 4, 2, 3, dtype=F64, requires_grad=True)
    drop = (
        None if mask is None else dropped_links(2, 12, 2 if mask == "sample" else None, 0.3, "cpu")
    )
    assert torch.autograd.gradcheck(lambda *a: position_attention(*a, drop), (r, c, x))


def test_dropped_links_rate_and_shapes():
    torch.manual_seed(0)
    d = dropped_links(9, 256, None, 0.1, "cpu")
    assert d.shape == (9, 256, 256) and d.dtype == torch.bool
    assert abs(d.float().mean().item() - 0.1) < 0.005
    assert dropped_links(2, 5, 3, 0.5, "cpu").shape == (3, 2, 5, 5)  # (B, Nh, T, T)


def test_head_sum_linear_equals_concat_linear_and_gradcheck():
    torch.manual_seed(0)
    heads = torch.randn(3, 10, 4, dtype=F64, requires_grad=True)
    weight = torch.randn(5, 12, dtype=F64, requires_grad=True)
    bias = torch.randn(5, dtype=F64, requires_grad=True)
    concat = heads.permute(1, 0, 2).reshape(10, 12)  # concat_h of eq. 1
    torch.testing.assert_close(
        head_sum_linear(heads, weight, bias), torch.nn.functional.linear(concat, weight, bias)
    )
    assert torch.autograd.gradcheck(head_sum_linear, (heads, weight, bias))
    assert torch.autograd.gradcheck(lambda a, w: head_sum_linear(a, w, None), (heads, weight))


def _pair(positional, c, nh, value, p, mask, dtype=F64):
    kw = dict(positional=positional, content=False, dropout=p, dropout_mask=mask, value=value)
    fast = MultiHeadSelfAttention2d(c, c, nh, **kw).to(dtype).train()
    ref = MultiHeadSelfAttention2d(c, c, nh, backend="reference", **kw).to(dtype).train()
    ref.load_state_dict(fast.state_dict())
    return fast, ref


@settings(max_examples=12, deadline=None)
@given(
    positional=st.sampled_from(["quadratic", "relative_learned"]),
    b=st.integers(1, 3),
    h=st.integers(1, 6),
    w=st.integers(1, 6),
    nh=st.integers(1, 3),
    value=st.sampled_from(["linear", "identity"]),
    p=st.sampled_from([0.0, 0.1, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_forward_tokens_equals_plain_nchw_path(positional, b, h, w, nh, value, p, seed):
    """Same dropped links (one mask for the batch, the reference code's), values and the
    gradients of the input and of every parameter."""
    c = 2 * nh
    fast, ref = _pair(positional, c, nh, value, p, "batch")
    x = torch.randn(h, w, b, c, dtype=F64)
    assert_same_training_step(
        [
            (fast, fast.forward_tokens),
            (ref, lambda t: ref(t.permute(2, 3, 0, 1)).permute(2, 3, 0, 1)),
        ],
        x,
        seed,
    )


def test_forward_tokens_per_image_mask_is_dropout_of_the_plain_probabilities():
    """dropout_mask="sample": the kept links are those of dropped_links drawn per image."""
    torch.manual_seed(0)
    fast, _ = _pair("quadratic", 4, 2, "linear", 0.3, "sample")
    x = torch.randn(3, 4, 2, 4, dtype=F64)
    torch.manual_seed(5)
    y = fast.forward_tokens(x)
    torch.manual_seed(5)
    drop = dropped_links(2, 12, 2, 0.3, "cpu")
    row, col = fast.positional_encoding.axis_logits(3, 4, F64)
    v = torch.nn.functional.linear(x, fast.value_proj.weight, fast.value_proj.bias)
    v = v.view(3, 4, 2, 2, 2).permute(3, 0, 1, 2, 4)
    heads = plain_attention(row.softmax(-1), col.softmax(-1), v, drop, 0.3)  # (Nh, H, W, B, D)
    concat = heads.permute(1, 2, 3, 0, 4).reshape(3, 4, 2, 4)
    torch.testing.assert_close(y, fast.out_proj(concat))


def _step(m, tokens: bool, dtype, x, g, bf16: bool, params: bool = False) -> list:
    """Output and input gradient (and, with ``params``, every parameter's) of layer ``m`` on
    tokens x (H, W, B, C) in ``dtype``, through forward_tokens or the NCHW forward, under bf16
    autocast if asked (never for float64), dropout drawn from seed 1; all in float64."""
    xi = x.to(dtype).requires_grad_()
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16 and dtype != F64):
        y = m.forward_tokens(xi) if tokens else m(xi.permute(2, 3, 0, 1)).permute(2, 3, 0, 1)
    grads = torch.autograd.grad(y, [xi, *m.parameters()] if params else [xi], g.to(y.dtype))
    return [y.double()] + [t.double() for t in grads]


@pytest.mark.parametrize("mask", ["batch", "sample"])
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize(
    "positional, alpha", [("quadratic", 0.5), ("quadratic", 20.0), ("relative_learned", None)]
)
def test_precision_within_twice_the_plain_path(positional, alpha, bf16, mask):
    """Output and input gradient against float64, dropout 0.1 (same links): the tokens path's
    error within 2x of the plain dense path's, in float32 and under bf16 autocast."""
    torch.manual_seed(0)
    opts = {"init_alpha": alpha} if alpha else {}
    kw = dict(
        positional=positional,
        content=False,
        dropout=0.1,
        value="identity",
        dropout_mask=mask,
        **opts,
    )
    fast = MultiHeadSelfAttention2d(32, 32, 9, **kw).train()
    plain = MultiHeadSelfAttention2d(32, 32, 9, backend="reference", **kw).train()
    plain.load_state_dict(fast.state_dict())
    truth = MultiHeadSelfAttention2d(32, 32, 9, backend="reference", **kw).double().train()
    truth.load_state_dict(fast.state_dict())
    x, g = torch.randn(16, 16, 4, 32), torch.randn(16, 16, 4, 32)
    y64, g64 = _step(truth, False, F64, x, g, bf16)
    yf, gf = _step(fast, True, torch.float32, x, g, bf16)
    yp, gp = _step(plain, False, torch.float32, x, g, bf16)
    for a, e, t in ((yf, yp, y64), (gf, gp, g64)):
        err_fast = ((a - t).abs().max() / t.abs().max()).item()
        err_plain = ((e - t).abs().max() / t.abs().max()).item()
        assert err_fast <= 2 * err_plain + 1e-7, (err_fast, err_plain)


@pytest.mark.parametrize("name", ["sa_quadratic", "sa_learned"])
def test_paper_model_trains_the_same_as_its_reference_path(name):
    """The whole model in training mode (hidden and attention dropout, same seed): the tokens
    path's logits and parameter gradients equal backend="reference"'s (float64)."""
    kw = dict(hidden_size=16, num_layers=2, num_heads=3, ff_size=16, downsample=4)
    torch.manual_seed(0)
    fast = attnconv.create_model(name, **kw).double().train()
    ref = attnconv.create_model(name, backend="reference", **kw).double().train()
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(3, 3, 32, 32, dtype=F64)
    out = []
    for m in (fast, ref):
        torch.manual_seed(7)
        y = m(x)
        out.append((y, torch.autograd.grad(y.square().sum(), list(m.parameters()))))
    torch.testing.assert_close(out[0][0], out[1][0])
    for a, e in zip(out[0][1], out[1][1]):
        torch.testing.assert_close(a, e)
