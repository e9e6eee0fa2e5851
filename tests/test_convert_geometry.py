"""The pure parts of Theorem 1: geometry, kernel <-> W^(h), Lemma 1's shift sum vs F.conv."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st

from attnconv.convert.geometry import (
    conv_geometry,
    heads_to_kernel,
    kernel_to_heads,
    low_rank_heads,
    shift_conv_reference,
)
from convert_strategies import conv_and_input

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same'")


def _as2d(x: torch.Tensor) -> torch.Tensor:
    return x.unsqueeze(2) if x.dim() == 3 else x


@given(conv_and_input())
def test_shift_sum_equals_conv(case):
    conv, x = case
    g = conv_geometry(conv)
    heads = kernel_to_heads(conv.weight.detach(), conv.groups)
    y = shift_conv_reference(_as2d(x), g, heads, conv.bias)
    ref = _as2d(conv(x))
    assert y.shape == ref.shape
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)


@given(conv_and_input())
def test_geometry_matches_pytorch(case):
    conv, x = case
    g = conv_geometry(conv)
    assert list(g.pad) == list(conv._reversed_padding_repeated_twice) + [0, 0] * (g.ndim == 1)
    out = _as2d(conv(x)).shape[-2:]
    assert g.output_size(*_as2d(x).shape[-2:]) == tuple(out)
    assert g.centers().shape == (g.num_heads, 2)
    assert len(set(map(tuple, g.centers().tolist()))) == g.num_heads  # f is a bijection


@given(conv_and_input())
def test_kernel_heads_round_trip(case):
    conv, _ = case
    g = conv_geometry(conv)
    w = conv.weight.detach()
    heads = kernel_to_heads(w, conv.groups)
    assert heads.shape == (g.num_heads, conv.out_channels, conv.in_channels)
    assert torch.equal(heads_to_kernel(heads, g.kernel, conv.groups, g.ndim), w)


def test_heads_to_kernel_rejects_non_block_diagonal():
    heads = torch.randn(4, 4, 4)
    with pytest.raises(ValueError, match="block-diagonal"):
        heads_to_kernel(heads, (2, 2), groups=2)


@given(st.integers(1, 5), st.integers(1, 6), st.integers(1, 6), st.integers(1, 7))
def test_low_rank_is_truncated_svd(nh, cout, cin, rank):
    torch.manual_seed(nh * 100 + cout * 10 + cin)
    heads = torch.randn(nh, cout, cin, dtype=torch.float64)
    val, out, err = low_rank_heads(heads, rank)
    assert val.shape == (nh, rank, cin) and out.shape == (nh, cout, rank)
    approx = out @ val
    true_err = ((approx - heads).norm() / heads.norm()).item()
    assert err == pytest.approx(true_err, abs=1e-9)
    if rank >= min(cout, cin):
        assert err < 1e-12
    else:  # Eckart-Young: the error is the discarded singular values
        s = torch.linalg.svdvals(heads)
        assert err == pytest.approx((s[:, rank:].norm() / s.norm()).item(), rel=1e-9)


def test_conv_geometry_rejects_other_modules():
    with pytest.raises(TypeError, match="Conv1d or nn.Conv2d"):
        conv_geometry(nn.ConvTranspose2d(2, 2, 3))
    with pytest.raises(TypeError, match="Linear"):
        conv_geometry(nn.Linear(2, 2))


def test_output_size_too_small_input():
    g = conv_geometry(nn.Conv2d(1, 1, 5))
    with pytest.raises(ValueError, match="smaller than the"):
        g.output_size(3, 3)
