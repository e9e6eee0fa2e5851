"""Lemma 1's sum over hard heads as one convolution (convert/head_conv.py) against the plain
per-head loop (sum_h SA_h(X) W^(h) + b, SA_h(X) a strided slice of the padded image): values and
the gradients of the input, the heads' matrices and the bias, in float64 at random geometries
(kernel, stride, dilation, groups, heads sharing a tap), and converted layers end to end."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnconv.convert import conv_to_attention
from attnconv.convert.head_conv import head_conv


def _per_head(xp, rows, cols, heads, bias, groups):
    y = None
    for h in range(heads.shape[0]):
        xs = xp[:, :, rows[h], cols[h]]
        t = F.conv2d(xs, heads[h][:, :, None, None], groups=groups)
        y = t if y is None else y + t
    return y if bias is None else y + bias[None, :, None, None]


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 2),
    groups=st.sampled_from([1, 2, 4]),
    cin_g=st.integers(1, 3),
    cout_g=st.integers(1, 3),
    nh=st.integers(1, 6),
    stride=st.integers(1, 3),
    dil=st.integers(1, 3),
    hp=st.integers(0, 5),
    wp=st.integers(0, 5),
    bias=st.booleans(),
    pads=st.lists(st.integers(0, 2), min_size=4, max_size=4),
    seed=st.integers(0, 10_000),
)
def test_head_conv_equals_the_per_head_sum(
    b, groups, cin_g, cout_g, nh, stride, dil, hp, wp, bias, pads, seed
):
    """The padded image given whole, or as its inside with (top, left) for the conv to pad
    (the zeros padding of a converted conv: before, after, or both sides of the image)."""
    g = torch.Generator().manual_seed(seed)
    hp, wp = hp + 2 * dil + 1, wp + 2 * dil + 1  # the padded image holds the 3x3 dilated grid
    left, right, top, bottom = pads
    bottom, right = min(bottom, hp - 1 - top), min(right, wp - 1 - left)  # a non-empty image
    cin, cout = groups * cin_g, groups * cout_g
    inner = (b, cin, hp - top - bottom, wp - left - right)
    x = torch.randn(inner, dtype=torch.float64, generator=g, requires_grad=True)
    xp = F.pad(x, (left, right, top, bottom))
    heads = torch.randn(nh, cout, cin_g, dtype=torch.float64, generator=g, requires_grad=True)
    bb = torch.randn(cout, dtype=torch.float64, generator=g, requires_grad=True) if bias else None
    # each head's tap on a dilated 3x3 grid (two heads may share one); its kept queries
    taps = torch.randint(0, 3, (nh, 2), generator=g) * dil
    n_r, n_c = (hp - 1 - 2 * dil) // stride + 1, (wp - 1 - 2 * dil) // stride + 1
    rows = [slice(int(r), int(r) + (n_r - 1) * stride + 1, stride) for r, _ in taps]
    cols = [slice(int(c), int(c) + (n_c - 1) * stride + 1, stride) for _, c in taps]
    y = head_conv(x, rows, cols, heads, bb, groups, pad=(top, left))
    ref = _per_head(xp, rows, cols, heads, bb, groups)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        head_conv(xp, rows, cols, heads, bb, groups), ref, rtol=1e-12, atol=1e-12
    )
    ins = [t for t in (x, heads, bb) if t is not None]
    gy = torch.randn(y.shape, dtype=y.dtype, generator=g)
    for a, r in zip(torch.autograd.grad(y, ins, gy), torch.autograd.grad(ref, ins, gy)):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)


def test_converted_depthwise_dense_and_dilated_layers_equal_their_convs():
    torch.manual_seed(0)
    for conv in (
        torch.nn.Conv2d(12, 12, 7, padding=3, groups=12),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1),
        torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2),
    ):
        conv = conv.double()
        att = conv_to_attention(conv)
        x = torch.randn(2, conv.in_channels, 13, 11, dtype=torch.float64, requires_grad=True)
        y, ref = att(x), conv(x)
        torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(att.forward_layer(x), ref, rtol=1e-10, atol=1e-10)
        gx = torch.autograd.grad(y.square().sum(), x)[0]
        torch.testing.assert_close(
            gx, torch.autograd.grad(ref.square().sum(), x)[0], rtol=1e-12, atol=1e-12
        )


def test_the_inference_plan_follows_every_change_of_the_weights():
    """No gradient asked: the conv's plan is kept, and rebuilt after an optimizer step, a
    load_state_dict, a dtype change or another input size (kept while every parameter equals
    its copy; writes through ``p.data``: tests/test_convert_edges.py)."""
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(6, 6, 3, padding=1, groups=3)
    att = conv_to_attention(conv)
    x = torch.randn(2, 6, 9, 9)
    with torch.no_grad():
        torch.testing.assert_close(att(x), conv(x), rtol=1e-5, atol=1e-6)
    opt = torch.optim.SGD(att.parameters(), lr=0.1)
    y = att(x)
    y.square().sum().backward()  # a training step through the same layer
    opt.step()
    with torch.no_grad():
        fresh = conv_to_attention(torch.nn.Conv2d(6, 6, 3, padding=1, groups=3))
        fresh.load_state_dict(att.state_dict())
        torch.testing.assert_close(att(x), fresh.forward_layer(x), rtol=1e-4, atol=1e-5)
        att.load_state_dict(conv_to_attention(conv).state_dict())  # back to the conv's weights
        torch.testing.assert_close(att(x), conv(x), rtol=1e-5, atol=1e-6)
        x2 = torch.randn(1, 6, 5, 7)
        torch.testing.assert_close(att(x2), conv(x2), rtol=1e-5, atol=1e-6)
        att64, conv64 = att.double(), conv.double()
        torch.testing.assert_close(att64(x.double()), conv64(x.double()), rtol=1e-12, atol=1e-12)


def test_converted_convs_under_bf16_autocast_as_tight_as_the_conv():
    """bf16 autocast: the converted module's distance to the float64 conv, output and input
    gradient, within 2x of the original conv's own under the same autocast (the one-conv path,
    and the per-head paths of a clamped border)."""
    torch.manual_seed(2)
    replicate = torch.nn.Conv2d(8, 8, 3, padding=1, groups=4, padding_mode="replicate")
    for conv in (
        torch.nn.Conv2d(12, 12, 7, padding=3, groups=12),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1),
        replicate,
    ):
        att = conv_to_attention(conv)
        x = torch.randn(2, conv.in_channels, 13, 11)
        x64 = x.double().requires_grad_()
        ref = conv.double()(x64)
        g = torch.randn_like(ref)
        gref = torch.autograd.grad(ref, x64, g)[0]
        conv.float()
        errs = {}
        for name, m in (("converted", att), ("conv", conv)):
            xf = x.clone().requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = m(xf)
            gx = torch.autograd.grad(y.float(), xf, g.float())[0]
            errs[name] = [(y.double() - ref).norm().item(), (gx.double() - gref).norm().item()]
        for got, plain in zip(errs["converted"], errs["conv"]):
            assert got <= 2 * plain, (conv, errs)
