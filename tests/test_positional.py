"""Positional encodings: sinusoid rotation property, quadratic encoding (Lemma 2's premise, the
hard limit, numerics), gradcheck of every variant in float64."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnconv.layers.encodings import QuadraticEncoding
from attnconv.layers.encodings.sinusoidal import sinusoid_1d, sinusoid_2d, sinusoid_rotation_1d
from attnconv.layers.kernels.separable import separable_probs
from attnconv.layers.mhsa2d import POSITIONALS, MultiHeadSelfAttention2d


def test_sinusoid_values_follow_vaswani():
    pe = sinusoid_1d(torch.arange(5, dtype=torch.float64), 6)
    for pos in range(5):
        for i in range(3):
            w = 10000 ** (-2 * i / 6)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(pos * w))
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos * w))


@given(dim=st.integers(1, 16).map(lambda n: 2 * n), k=st.integers(-50, 50))
def test_sinusoid_rotation_property(dim, k):
    """PE(pos + k) = R(k) PE(pos): a rotation by w_i k on each (sin, cos) pair."""
    pos = torch.arange(-20, 40, dtype=torch.float64)
    rot = sinusoid_rotation_1d(k, dim)
    torch.testing.assert_close(sinusoid_1d(pos + k, dim), sinusoid_1d(pos, dim) @ rot.T)
    torch.testing.assert_close(rot @ rot.T, torch.eye(dim, dtype=torch.float64))  # orthogonal


@given(c=st.integers(2, 12).map(lambda n: 2 * n), dr=st.integers(-4, 4), dc=st.integers(-4, 4))
def test_sinusoid_2d_rotation_property(c, dr, dc):
    """2D: PE(i + dr, j + dc) = blockdiag(R_row(dr), R_col(dc)) PE(i, j) (rows: channels[:C/2])."""
    if (c // 2) % 2:
        c += 2  # each half needs whole (sin, cos) pairs
    h, w = 12, 12
    pe = sinusoid_2d(h, w, c).double().view(h, w, c)
    rot = torch.block_diag(sinusoid_rotation_1d(dr, c // 2), sinusoid_rotation_1d(dc, c // 2))
    i0, j0 = 4, 4
    torch.testing.assert_close(pe[i0 + dr, j0 + dc], rot @ pe[i0, j0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(7, 7), (5, 9), (6, 4)])
def test_large_alpha_puts_mass_on_shifted_pixel(shape):
    """Lemma 2's premise: with large alpha, head h attends to pixel q + round(Delta_h)."""
    h, w = shape
    torch.manual_seed(0)
    enc = QuadraticEncoding(9, init_centers_std=1.0)
    with torch.no_grad():
        enc.centers.copy_(torch.tensor([[a, b] for a in (-1, 0, 1) for b in (-1, 0, 1)]) + 0.2)
        enc.set_alpha(50.0)
    probs = separable_probs(*enc.axis_logits(h, w)).view(9, h, w, h, w)
    dense = torch.softmax(enc.dense_logits(h, w), -1).view(9, h, w, h, w)
    torch.testing.assert_close(probs, dense)
    shifts = torch.round(enc.centers.detach()).long()
    for head in range(9):
        for i in range(1, h - 1):  # queries whose target is inside the image
            for j in range(1, w - 1):
                ti, tj = i + shifts[head, 0].item(), j + shifts[head, 1].item()
                assert probs[head, i, j, ti, tj] > 0.99


def test_hard_mode_is_the_large_alpha_limit_including_borders():
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(3, 8, 4, positional="quadratic", content=False, hard=True)
    with torch.no_grad():
        layer.positional_encoding.centers.copy_(
            torch.tensor([[0.0, 0.0], [1.2, -0.7], [-3.4, 9.0], [40.0, -40.0]])
        )
    x = torch.randn(2, 3, 5, 6)
    y_hard = layer(x)
    layer.positional_encoding.hard = False
    layer.positional_encoding.set_alpha(1e4)
    torch.testing.assert_close(layer(x), y_hard, rtol=1e-5, atol=1e-5)
    layer.backend = "reference"
    torch.testing.assert_close(layer(x), y_hard, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("positional", ["quadratic", "quadratic_generalized"])
@pytest.mark.parametrize("content", [False, True])
@pytest.mark.parametrize("backend", [None, "reference"])
def test_extreme_precision_and_far_centres_stay_finite(dtype, positional, content, backend):
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(
        4, 8, 4, positional=positional, content=content, backend=backend
    )
    enc = layer.positional_encoding
    with torch.no_grad():
        enc.centers.copy_(torch.tensor([[0.0, 1.0], [300.0, -500.0], [1e4, 1e4], [-2.4, 1.6]]))
        if positional == "quadratic":
            enc.set_alpha(1e4)
        else:
            enc.spread.copy_(torch.eye(2) * 140.0)  # Sigma^-1 ~ 2e4 I
    ref = layer.double()(torch.randn(2, 4, 12, 10, dtype=torch.float64))
    layer = layer.to(dtype)
    x = torch.randn(2, 4, 12, 10, dtype=dtype, requires_grad=True)
    y, attn = layer(x, return_attention=True)
    y.float().square().sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(attn).all() and torch.isfinite(x.grad).all()
    for name, p in layer.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name
    assert ref.shape == y.shape


def test_bfloat16_quadratic_close_to_float64():
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(4, 8, 4, positional="quadratic", content=False)
    with torch.no_grad():
        layer.positional_encoding.centers.copy_(
            torch.tensor([[0.0, 1.0], [30.0, -50.0], [1e3, 1e3], [-2.5, 1.5]])
        )
    x = torch.randn(2, 4, 12, 10)
    ref = layer.double()(x.double())
    y = layer.to(torch.bfloat16)(x.to(torch.bfloat16)).double()
    assert ((y - ref).abs().max() / ref.abs().max()).item() < 3e-2


@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("content", [True, False])
def test_gradcheck_float64(positional, content):
    """Input and parameter gradients of both paths against finite differences."""
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(
        2, 3, 3, head_dim=2, positional=positional, content=content, max_size=4
    ).double()
    names = [n for n, p in layer.named_parameters() if p.requires_grad]
    x = torch.randn(1, 2, 3, 2, dtype=torch.float64, requires_grad=True)
    params = tuple(layer.get_parameter(n).detach().clone().requires_grad_() for n in names)

    def f(x, *ps):
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x,))

    for backend in (None, "reference"):
        layer.backend = backend
        assert torch.autograd.gradcheck(f, (x, *params), fast_mode=True)
