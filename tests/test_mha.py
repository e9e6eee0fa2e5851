"""MultiHeadAttention (sequence layer) and the 1D sinusoidal positional encoding."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st

from attnconv.layers.mha import (
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    sinusoidal_encoding,
)


def _copy_to_torch(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """A torch.nn.MultiheadAttention with the same weights (independent reference)."""
    same = mha.kdim == mha.embed_dim and mha.vdim == mha.embed_dim
    ref = nn.MultiheadAttention(
        mha.embed_dim, mha.num_heads, kdim=mha.kdim, vdim=mha.vdim, batch_first=True
    ).to(mha.q_proj.weight.dtype)
    with torch.no_grad():
        if same:
            ref.in_proj_weight.copy_(
                torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight])
            )
        else:
            ref.q_proj_weight.copy_(mha.q_proj.weight)
            ref.k_proj_weight.copy_(mha.k_proj.weight)
            ref.v_proj_weight.copy_(mha.v_proj.weight)
        ref.in_proj_bias.copy_(torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
        ref.out_proj.weight.copy_(mha.out_proj.weight)
        ref.out_proj.bias.copy_(mha.out_proj.bias)
    return ref


@pytest.mark.parametrize("cross", [False, True])
def test_matches_torch_multihead_attention(cross):
    torch.manual_seed(0)
    B, Tq, Tk, C, h = 3, 5, 7, 16, 4
    kw = dict(kdim=12, vdim=10) if cross else {}
    mha = MultiHeadAttention(C, h, **kw).double()
    ref = _copy_to_torch(mha)
    q = torch.randn(B, Tq, C, dtype=torch.float64)
    k = torch.randn(B, Tk if cross else Tq, mha.kdim, dtype=torch.float64)
    v = torch.randn(B, k.shape[1], mha.vdim, dtype=torch.float64)
    if not cross:
        k = v = q
    pad = torch.zeros(B, k.shape[1], dtype=torch.bool)
    pad[1, -2:] = True
    y, attn = mha(q, k, v, key_padding_mask=pad, return_attention=True)
    y_ref, attn_ref = ref(q, k, v, key_padding_mask=pad, average_attn_weights=False)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(attn, attn_ref)
    assert attn.shape == (B, h, Tq, k.shape[1])
    assert torch.all(attn[1, :, :, -2:] == 0)
    # the fused path gives the same values
    torch.testing.assert_close(mha(q, k, v, key_padding_mask=pad), y_ref)


def test_causal_matches_torch_and_is_causal():
    torch.manual_seed(1)
    B, T, C, h = 2, 6, 8, 2
    mha = MultiHeadAttention(C, h).double()
    ref = _copy_to_torch(mha)
    x = torch.randn(B, T, C, dtype=torch.float64)
    y, attn = mha(x, causal=True, return_attention=True)
    tri = torch.ones(T, T, dtype=torch.bool).triu(1)  # torch: True = not allowed
    y_ref = ref(x, x, x, attn_mask=tri, need_weights=False)[0]
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(mha(x, causal=True), y_ref)
    assert torch.all(attn.masked_select(tri) == 0)
    # changing a later token does not change earlier outputs
    x2 = x.clone()
    x2[:, -1] += 1.0
    torch.testing.assert_close(mha(x2, causal=True)[:, :-1], y[:, :-1])


@given(
    B=st.integers(1, 3),
    Tq=st.integers(1, 9),
    Tk=st.integers(1, 9),
    heads=st.integers(1, 4),
    hd=st.integers(1, 6),
    causal=st.booleans(),
    padded=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fast_equals_reference(B, Tq, Tk, heads, hd, causal, padded, seed):
    torch.manual_seed(seed)
    C = heads * hd
    fast = MultiHeadAttention(C, heads, kdim=C + 1, vdim=C + 2)
    ref = MultiHeadAttention(C, heads, kdim=C + 1, vdim=C + 2, backend="reference")
    ref.load_state_dict(fast.state_dict())
    q = torch.randn(B, Tq, C, requires_grad=True)
    k = torch.randn(B, Tk, C + 1, requires_grad=True)
    v = torch.randn(B, Tk, C + 2, requires_grad=True)
    pad = None
    if padded:
        pad = torch.rand(B, Tk) < 0.3
        pad[:, 0] = False  # keep one key per row (fully masked rows are tested separately)
    outs, grads = [], []
    for m in (fast, ref):
        y = m(q, k, v, key_padding_mask=pad, causal=causal)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        outs.append(y.detach())
        grads.append([t.grad.clone() for t in (q, k, v)] + [p.grad.clone() for p in m.parameters()])
        for t in (q, k, v):
            t.grad = None
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-5)
    for a, b in zip(grads[0], grads[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", [None, "reference"])
def test_gradcheck_float64(backend):
    torch.manual_seed(2)
    mha = MultiHeadAttention(6, 2, kdim=4, backend=backend).double()
    q = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    pad = torch.tensor([[False, False, True, False], [False, False, False, False]])
    assert torch.autograd.gradcheck(
        lambda q, k: mha(q, k, key_padding_mask=pad, causal=True), (q, k)
    )


def test_fully_padded_row_gives_zeros_not_nan():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 4, 8)
    pad = torch.zeros(2, 4, dtype=torch.bool)
    pad[1] = True
    for backend in (None, "reference"):
        mha.backend = backend
        y = mha(x, key_padding_mask=pad)
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y[1], mha.out_proj.bias.expand(4, 8))


def test_dropout_only_in_training():
    torch.manual_seed(3)
    mha = MultiHeadAttention(8, 2, dropout=0.5)
    x = torch.randn(2, 5, 8)
    mha.eval()
    torch.testing.assert_close(mha(x), mha(x))
    mha.train()
    assert not torch.allclose(mha(x), mha(x))


def test_bad_input_messages():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="backend must be None or one of"):
        MultiHeadAttention(8, 2, backend="fast")
    with pytest.raises(TypeError, match="MultiHeadAttention: impl= is gone, .*backend='reference'"):
        MultiHeadAttention(8, 2, impl="reference")
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"query must be \(B, T, 8\)"):
        mha(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match=r"query must be \(B, T, 8\)"):
        mha(torch.randn(5, 8))
    with pytest.raises(ValueError, match="key_padding_mask must be"):
        mha(torch.randn(2, 5, 8), key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool"):
        mha(torch.randn(2, 5, 8), key_padding_mask=torch.zeros(2, 5))
    with pytest.raises(TypeError, match="torch.Tensor"):
        mha([1, 2, 3])


def test_sinusoidal_values_match_formula():
    pe = sinusoidal_encoding(torch.arange(50, dtype=torch.float64), 16)
    pos, i = 37, 3
    w = 1.0 / 10000 ** (2 * i / 16)
    assert math.isclose(pe[pos, 2 * i].item(), math.sin(pos * w), rel_tol=1e-12)
    assert math.isclose(pe[pos, 2 * i + 1].item(), math.cos(pos * w), rel_tol=1e-12)


@given(dim=st.sampled_from([2, 4, 8, 32, 128]), k=st.integers(-50, 50), pos=st.integers(0, 200))
def test_sinusoidal_rotation_property(dim, k, pos):
    """PE(pos + k) = R(k) PE(pos): a fixed offset is a rotation, pair by pair."""
    spe = SinusoidalPositionalEncoding(dim, max_len=8)
    R = spe.rotation(k)
    p = sinusoidal_encoding(torch.tensor([pos, pos + k], dtype=torch.float64), dim)
    torch.testing.assert_close(R @ p[0], p[1], rtol=0, atol=1e-9)
    torch.testing.assert_close(R.T @ R, torch.eye(dim, dtype=torch.float64))  # orthogonal
    # the dot product PE(a).PE(b) depends only on b - a
    q = sinusoidal_encoding(torch.tensor([pos + 3, pos + 3 + k], dtype=torch.float64), dim)
    assert math.isclose(p[0] @ p[1], q[0] @ q[1], abs_tol=1e-9)


def test_sinusoidal_module_adds_table_and_checks_input():
    spe = SinusoidalPositionalEncoding(8, max_len=10)
    x = torch.zeros(2, 6, 8)
    torch.testing.assert_close(spe(x)[1], spe.encoding(6))
    with pytest.raises(ValueError, match="exceeds max_len 10"):
        spe(torch.zeros(1, 11, 8))
    with pytest.raises(ValueError, match=r"expected \(B, T, 8\)"):
        spe(torch.zeros(1, 3, 6))
    with pytest.raises(ValueError, match="even dim"):
        SinusoidalPositionalEncoding(7)
