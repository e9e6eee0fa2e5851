"""The hard fast kernels of converted grouped / depthwise convs (convert/grouped.py) equal the
plain per-head loop beside them and the convolution: values and gradients on random shapes
(stride 2, 5x5 kernels, groups, depthwise, channel multipliers, dilation), gradcheck in
float64, clamped borders, and the zoo-like benchmark networks (exact, same parameters)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st

from attnconv.convert import conv_to_attention, convert_model
from attnconv.convert.grouped import (
    GroupedHeadProjection,
    depthwise_mix,
    grouped_flat_mix,
    grouped_head_mix,
    grouped_head_mix_reference,
)
from attnconv.convert.head_conv import kept_indices


@st.composite
def grouped_conv(draw):
    """A random grouped / depthwise Conv2d (float64) and an input."""
    groups = draw(st.integers(1, 5))
    cin_g = draw(st.sampled_from([1, 1, 2, 3]))  # 1 with cout_g 1: depthwise
    cout_g = draw(st.sampled_from([1, 1, 2]))
    k = (draw(st.sampled_from([1, 2, 3, 5])), draw(st.sampled_from([1, 3, 5])))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dilation = (draw(st.integers(1, 2)), 1)
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    mode = draw(st.sampled_from(["zeros", "zeros", "replicate"]))
    conv = nn.Conv2d(
        groups * cin_g,
        groups * cout_g,
        k,
        stride,
        padding,
        dilation,
        groups,
        bias=draw(st.booleans()),
        padding_mode=mode,
    ).double()
    span = [d * (kk - 1) + 1 for d, kk in zip(dilation, k)]
    h = max(1, span[0] - 2 * padding[0], padding[0] + 1) + draw(st.integers(0, 5))
    w = max(1, span[1] - 2 * padding[1], padding[1] + 1) + draw(st.integers(0, 5))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(draw(st.integers(1, 2)), groups * cin_g, h, w, generator=gen).double()
    return conv, x


def _heads(a, x, clamp: bool = False):
    """(xp, rows, cols, proj) of a converted layer's hard path for input x."""
    g, layer = a.geometry, a.attention
    xp = g.pad_input(x)
    oh, ow = g.output_size(*x.shape[-2:])
    shifts = torch.round(layer.positional_encoding.centers.detach()).long().tolist()
    extra = 3 if clamp else 0  # push head 0 outside the image: its targets are clamped
    rows = [
        kept_indices(g.anchor[0], oh, g.stride[0], xp.shape[-2], dr - (extra if i == 0 else 0))
        for i, (dr, _) in enumerate(shifts)
    ]
    cols = [kept_indices(g.anchor[1], ow, g.stride[1], xp.shape[-1], dc) for _, dc in shifts]
    return xp, rows, cols, layer.out_proj


def _values_and_grads(fn, xp, proj, g):
    xp = xp.detach().requires_grad_(True)
    y = fn(xp)
    params = [proj.kernel] + ([proj.bias] if proj.bias is not None else [])
    grads = torch.autograd.grad((y * g).sum(), [xp, *params])
    return y, grads


@given(grouped_conv(), st.booleans())
def test_fast_kernels_equal_the_plain_loop_and_the_conv(case, clamp):
    conv, x = case
    a = conv_to_attention(conv)
    assert isinstance(a.attention.out_proj, GroupedHeadProjection) or conv.groups == 1
    if conv.groups == 1:
        return
    xp, rows, cols, proj = _heads(a, x, clamp)
    ref = grouped_head_mix_reference(xp, rows, cols, proj)
    if not clamp:
        torch.testing.assert_close(ref, conv(x))
    g = torch.randn_like(ref)
    y0, g0 = _values_and_grads(
        lambda t: grouped_head_mix_reference(t, rows, cols, proj), xp, proj, g
    )
    y1, g1 = _values_and_grads(lambda t: grouped_head_mix(t, rows, cols, proj), xp, proj, g)
    torch.testing.assert_close(y1, y0)
    for a1, a0 in zip(g1, g0):
        torch.testing.assert_close(a1, a0)
    with torch.no_grad():
        torch.testing.assert_close(grouped_head_mix(xp, rows, cols, proj), y0)
        if not clamp:  # the module's own hard path, in float64 and through channels_last
            torch.testing.assert_close(a(x), conv(x))
            xc = x.contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(a(xc), conv(x))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["depthwise", "grouped"])
@pytest.mark.parametrize("stride", [1, 2])
def test_kernels_pass_gradcheck(kind, stride):
    torch.manual_seed(0)
    c, groups = (4, 4) if kind == "depthwise" else (6, 2)
    conv = nn.Conv2d(c, c, 5 if kind == "depthwise" else 3, stride, 1, groups=groups).double()
    a = conv_to_attention(conv)
    xp, rows, cols, proj = _heads(a, torch.randn(2, c, 7, 6, dtype=torch.float64))
    if kind == "depthwise":
        fn = lambda t, w: depthwise_mix(t, rows, cols, w)  # noqa: E731
        w = proj.kernel[:, :, 0].detach().clone()
    else:
        fn = lambda t, w: grouped_flat_mix(t, rows, cols, w, groups)  # noqa: E731
        w = proj.kernel.detach().clone()
    inputs = (xp.detach().requires_grad_(True), w.requires_grad_(True))
    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


@given(
    st.integers(0, 12), st.integers(1, 6), st.integers(1, 3), st.integers(1, 12), st.integers(-6, 6)
)
def test_kept_targets_are_the_layers_hard_indices(anchor, n, stride, size, shift):
    """_kept equals clamp(q + shift) at the kept queries q = anchor + o * stride."""
    idx = kept_indices(anchor, n, stride, size, shift)
    want = [min(max(anchor + o * stride + shift, 0), size - 1) for o in range(n)]
    got = list(range(size + 1000)[idx]) if isinstance(idx, slice) else idx
    assert got == want


def test_kept_targets_match_the_positional_encoding():
    torch.manual_seed(0)
    a = conv_to_attention(nn.Conv2d(3, 3, 5, 2, 1, groups=3))
    pe = a.attention.positional_encoding
    with torch.no_grad():
        pe.centers.add_(torch.randn_like(pe.centers) * 3)  # moved centres: some clamped
    hp, wp = 11, 9
    rows, cols = pe.hard_indices(hp, wp)
    for h, (dr, dc) in enumerate(torch.round(pe.centers.detach()).long().tolist()):
        r = kept_indices(2, 4, 2, hp, dr)
        c = kept_indices(2, 3, 2, wp, dc)
        assert list(range(hp)[r] if isinstance(r, slice) else r) == rows[h, 2:9:2].tolist()
        assert list(range(wp)[c] if isinstance(c, slice) else c) == cols[h, 2:7:2].tolist()


def test_forward_never_builds_the_dense_matrix(monkeypatch):
    """A grouped Wout stores its blocks only; the hard path never asks for the dense one."""
    a = conv_to_attention(nn.Conv2d(64, 64, 5, 2, 2, groups=64))

    def dense(self):
        raise AssertionError("dense Wout built")

    monkeypatch.setattr(GroupedHeadProjection, "weight", property(dense))
    with torch.no_grad():
        a(torch.randn(1, 64, 12, 12))


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.slow
@pytest.mark.parametrize("quick", [True, False])
def test_zoo_like_networks_convert_exactly_at_their_size(quick):
    """Exact in float64; in float32 as close to the float64 original as the original is (these
    deep random networks have a float32 floor of ~1e-6..1e-5 of their own)."""
    from attnconv.bench.zoo_nets import zoo_networks

    torch.manual_seed(0)
    x = torch.randn(2, 3, 64, 64) if quick else torch.randn(1, 3, 96, 80)
    for name, net in zoo_networks(quick).items():
        conv = convert_model(net).eval()
        n0, n1 = (sum(p.numel() for p in m.parameters()) for m in (net, conv))
        assert n1 <= (1.03 if quick else 1.003) * n0, name  # + 3 numbers per head
        with torch.no_grad():
            ref = copy.deepcopy(net).double()(x.double())
            assert _rel(copy.deepcopy(conv).double()(x.double()), ref) <= 1e-12, name
            floor = _rel(net(x).double(), ref)
            assert _rel(conv(x).double(), ref) <= 2 * floor + 1e-6, name
