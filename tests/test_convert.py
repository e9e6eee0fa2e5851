"""Theorem 1 as a tool: conv -> attention -> conv, exact over random conv configurations."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from attnconv.convert import (
    ConvAttention1d,
    ConvAttention2d,
    attention_to_conv,
    conv_to_attention,
    mhsa_to_conv,
)
from attnconv.convert import modules as convert_modules
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from convert_strategies import conv_and_input

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same'")


def assert_close_rel(y: torch.Tensor, ref: torch.Tensor, rel: float) -> None:
    """|y - ref| <= rel * (|ref| + max|ref|): relative to the output's scale."""
    assert y.shape == ref.shape and y.dtype == ref.dtype
    scale = ref.abs().max().clamp_min(1e-30)
    err = ((y - ref).abs() / (ref.abs() + scale)).max().item()
    assert err <= rel, f"relative error {err:.3g} > {rel}"


@given(conv_and_input(dtype=torch.float64))
def test_hard_conversion_equals_conv_float64(case):
    conv, x = case
    m = conv_to_attention(conv)
    assert isinstance(m, ConvAttention1d if isinstance(conv, nn.Conv1d) else ConvAttention2d)
    assert m.hard and m.attention.num_heads == conv.weight[0, 0].numel()  # K*K heads (K in 1D)
    assert_close_rel(m(x), conv(x), 1e-5)


@given(conv_and_input(dtype=torch.float32))
def test_hard_conversion_equals_conv_float32(case):
    conv, x = case
    with torch.no_grad():
        assert_close_rel(conv_to_attention(conv)(x), conv(x), 1e-4)


@given(conv_and_input(dtype=torch.float64), st.sampled_from([None, "reference"]))
@settings(max_examples=15)
def test_soft_conversion_at_large_alpha_equals_conv(case, backend):
    """Lemma 2: the softmax layer itself (no hard shortcut) at alpha = 1e4 is the conv."""
    conv, x = case
    m = conv_to_attention(conv, alpha=1e4, backend=backend)
    assert not m.hard
    with torch.no_grad():
        assert_close_rel(m(x), conv(x), 1e-5)


@pytest.mark.slow
@given(
    conv_and_input(dtype=torch.float64),
    st.integers(0, 2**31 - 1),
    st.booleans(),
    st.sampled_from([0, 10**9]),
)
@settings(max_examples=25)
def test_fast_shift_path_equals_layer_reference(case, seed, move, concat_max):
    """The hard fast path (kept queries only, shifts + channel mixes) equals the layer's own
    one-hot attention on every padded pixel followed by the crop, for any centres (also moved
    off the kernel grid, clamped at the border) and rank-limited heads; values and gradients."""
    old = convert_modules.CONCAT_MAX_CHANNELS  # both channel-mix strategies of the fast path
    convert_modules.CONCAT_MAX_CHANNELS = concat_max
    try:
        _check_fast_shift(case, seed, move)
    finally:
        convert_modules.CONCAT_MAX_CHANNELS = old


def _check_fast_shift(case, seed, move):
    conv, x = case
    gen = torch.Generator().manual_seed(seed)
    hd = None if seed % 3 else 1 + seed % 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = conv_to_attention(conv, head_dim=hd)
        ref = conv_to_attention(conv, head_dim=hd, backend="reference")
        gather = conv_to_attention(conv, head_dim=hd)  # the layer's fast hard path (a gather)
    if move:
        shift = torch.randn(fast.attention.num_heads, 2, generator=gen, dtype=x.dtype) * 3
        for m in (fast, ref, gather):
            with torch.no_grad():
                m.attention.positional_encoding.centers.add_(shift)
    g = torch.randn(conv(x).shape, generator=gen, dtype=x.dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = fast(xa), ref(xb)
    torch.testing.assert_close(ya, yb, rtol=1e-10, atol=1e-10)
    with torch.no_grad():
        torch.testing.assert_close(gather.forward_layer(x), yb, rtol=1e-10, atol=1e-10)
    (ya * g).sum().backward()
    (yb * g).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-10, atol=1e-10)
    for pa, pb in zip(fast.parameters(), ref.parameters()):
        if pb.grad is not None and pa.grad is not None:
            torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-10, atol=1e-10)
        else:
            assert pa.grad is None or pa.grad.abs().max() == 0


@given(conv_and_input(dtype=torch.float64, max_channels=2))
@settings(max_examples=10)
def test_gradients_match_conv(case):
    conv, x = case
    m = conv_to_attention(conv)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    g = torch.randn_like(conv(x))
    (conv(xa) * g).sum().backward()
    (m(xb) * g).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-10, atol=1e-10)


def test_gradcheck_soft_and_hard():
    torch.manual_seed(0)
    conv = nn.Conv2d(1, 2, (2, 3), padding=1, stride=(1, 2)).double()
    x = torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True)
    for alpha in (None, 0.7):
        m = conv_to_attention(conv, alpha=alpha)
        assert torch.autograd.gradcheck(m, (x,))
        # parameters: the soft layer's centres and alpha receive gradients too
        if alpha is not None:
            m(x).sum().backward()
            assert m.attention.positional_encoding.centers.grad.abs().sum() > 0


@given(conv_and_input(dtype=torch.float64))
def test_round_trip_gives_same_weights(case):
    conv, _ = case
    back = attention_to_conv(conv_to_attention(conv))
    assert type(back) is type(conv)
    for k in ("kernel_size", "stride", "padding", "dilation", "groups", "padding_mode"):
        assert getattr(back, k) == getattr(conv, k), k
    assert torch.equal(back.weight, conv.weight)
    assert (back.bias is None) == (conv.bias is None)
    if conv.bias is not None:
        assert torch.equal(back.bias, conv.bias)


def test_lemma2_error_decreases_with_alpha():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1).double()
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64)
    ref = conv(x)
    alphas = [0.5, 1, 2, 4, 8, 16, 32, 64, 128, 1e3, 1e4]
    with torch.no_grad():
        errs = [(conv_to_attention(conv, alpha=a)(x) - ref).abs().max().item() for a in alphas]
    floor = 1e-12 * ref.abs().max().item()
    for a, e0, e1 in zip(alphas[1:], errs, errs[1:]):
        assert e1 < e0 or e1 <= floor, f"error did not decrease at alpha={a}: {errs}"
    assert errs[0] > 0.1 * ref.abs().max().item()  # far from the conv at small alpha
    assert errs[-1] <= floor  # float precision at alpha = 1e4


def test_head_dim_channel_bound():
    torch.manual_seed(0)
    conv = nn.Conv2d(6, 4, 3, padding=1).double()
    x = torch.randn(2, 6, 7, 7, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exact: no warning
        m = conv_to_attention(conv, head_dim=4)  # min(Cin, Cout) = 4 >= rank of every W^(h)
    assert m.rank_error == 0.0 and m.attention.head_dim == 4
    assert_close_rel(m(x), conv(x), 1e-10)
    with pytest.warns(UserWarning, match="rank-limited"):
        m2 = conv_to_attention(conv, head_dim=2)
    assert 0 < m2.rank_error < 1
    # the output is exactly the conv with the best rank-2 kernel, whose error is reported
    heads = conv.weight.detach().permute(2, 3, 0, 1).reshape(9, 4, 6)
    u, s, vh = torch.linalg.svd(heads, full_matrices=False)
    w2 = (u[..., :2] * s[:, None, :2]) @ vh[:, :2]  # (9, 4, 6)
    assert m2.rank_error == pytest.approx(((w2 - heads).norm() / heads.norm()).item(), rel=1e-9)
    conv2 = nn.Conv2d(6, 4, 3, padding=1).double()
    with torch.no_grad():
        conv2.weight.copy_(w2.reshape(3, 3, 4, 6).permute(2, 3, 0, 1))
        conv2.bias.copy_(conv.bias)
    assert_close_rel(m2(x), conv2(x), 1e-10)
    back = attention_to_conv(m2)  # the reverse works on rank-limited layers too
    torch.testing.assert_close(back.weight, conv2.weight)


def test_mhsa_to_conv_is_replicate_padded_conv():
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(
        3, 5, 4, positional="quadratic", content=False, value="identity", hard=True
    ).double()
    with torch.no_grad():
        layer.positional_encoding.centers.copy_(torch.tensor([[0, 0], [-2, 1], [1, 3], [0.6, -1]]))
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64)
    conv = mhsa_to_conv(layer)
    assert conv.kernel_size == (5, 7) and conv.padding_mode == "replicate"
    assert_close_rel(conv(x), layer(x), 1e-12)


def test_return_attention_is_one_hot_over_padded_image():
    conv = nn.Conv2d(2, 3, 3, padding=1)
    x = torch.randn(2, 2, 5, 6)
    y, attn = conv_to_attention(conv)(x, return_attention=True)
    assert attn.shape == (1, 9, 7 * 8, 7 * 8)  # (1, Nh, Tp, Tp) over the padded 7x8 image
    assert torch.equal(attn.amax(-1), torch.ones(1, 9, 56)) and torch.equal(
        attn.sum(-1), attn.amax(-1)
    )
    torch.testing.assert_close(y, conv(x))
    y1, attn1 = conv_to_attention(nn.Conv1d(2, 3, 3))(torch.randn(2, 2, 7), return_attention=True)
    assert y1.shape == (2, 3, 5) and attn1.shape == (1, 3, 7, 7)


def test_bad_inputs():
    with pytest.raises(ValueError, match="lazy"):
        conv_to_attention(nn.LazyConv2d(3, 3))
    conv = nn.Conv2d(2, 2, 3)
    with pytest.raises(TypeError, match="nn.Conv1d or nn.Conv2d"):
        conv_to_attention(nn.Conv3d(1, 1, 3))
    with pytest.raises(ValueError, match="alpha must be > 0"):
        conv_to_attention(conv, alpha=-1.0)
    with pytest.raises(TypeError, match="alpha"):
        conv_to_attention(conv, alpha=float("inf"))
    with pytest.raises(ValueError, match="head_dim"):
        conv_to_attention(conv, head_dim=0)
    m = conv_to_attention(conv)
    with pytest.raises(ValueError, match="C=2"):
        m(torch.randn(1, 3, 8, 8))
    with pytest.raises(ValueError, match="smaller than the"):
        m(torch.randn(1, 2, 2, 2))
    with pytest.raises(ValueError, match="soft"):
        attention_to_conv(conv_to_attention(conv, alpha=2.0))
    with pytest.raises(TypeError, match="ConvAttention"):
        attention_to_conv(conv)
