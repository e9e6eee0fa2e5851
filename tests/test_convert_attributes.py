"""A converted convolution keeps answering as the convolution it replaced (issue 27, item 6):
model code that reads its convolutions' attributes (``weight``, ``bias``, ``in_channels``,
``kernel_size``, ``stride``, ``padding``, ``dilation``, ``groups``) runs unchanged after
conversion and computes the same function (EdgeNeXt failed with AttributeError: 'weight')."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attnconv.convert import conv_to_attention
from attnconv.convert.model import convert_model

CONVS = [
    lambda: nn.Conv2d(4, 6, 3, padding=1),
    lambda: nn.Conv2d(4, 6, (3, 5), stride=2, padding=(1, 2), dilation=(1, 2), bias=False),
    lambda: nn.Conv2d(8, 8, 5, stride=2, padding=2, groups=8),  # depthwise 5x5, stride 2
    lambda: nn.Conv2d(8, 12, 3, padding=1, groups=4),
    lambda: nn.Conv1d(4, 6, 3, padding=1),
]


@pytest.mark.parametrize("make", CONVS)
def test_attributes_equal_the_original(make):
    torch.manual_seed(0)
    conv = make().double()
    att = conv_to_attention(conv)
    for name in (
        "in_channels",
        "out_channels",
        "kernel_size",
        "stride",
        "padding",
        "dilation",
        "groups",
        "padding_mode",
    ):
        assert getattr(att, name) == getattr(conv, name), name
    assert torch.equal(att.weight.detach(), conv.weight.detach())
    if conv.bias is None:
        assert att.bias is None
    else:
        assert torch.equal(att.bias.detach(), conv.bias.detach())


def test_weight_is_differentiable_in_the_heads():
    conv = nn.Conv2d(3, 4, 3, padding=1).double()
    att = conv_to_attention(conv)
    att.weight.sum().backward()
    grads = [p.grad for p in att.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


class ReadsItsConv(nn.Module):
    """Model code in the style of weight-standardized or re-parametrized blocks: the forward
    convolves with its conv's own weight and reads its geometry."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(8, 8, 5, padding=2, groups=8)

    def forward(self, x):
        c = self.conv
        w = c.weight - c.weight.mean(dim=(1, 2, 3), keepdim=True)  # weight standardization
        x = F.conv2d(x, w, c.bias, c.stride, c.padding, c.dilation, c.groups)
        assert x.shape[1] == self.dw.in_channels and self.dw.kernel_size == (5, 5)
        return self.dw(x)


def test_a_model_reading_its_convolutions_runs_after_conversion():
    torch.manual_seed(0)
    model = ReadsItsConv().double().eval()
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    want = model(x)
    converted = convert_model(model)
    from attnconv.convert import ConvAttention

    assert isinstance(converted.conv, ConvAttention)  # attention now (still an nn.Conv2d)
    got = converted(x)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)


def test_soft_layer_has_no_equivalent_kernel():
    att = conv_to_attention(nn.Conv2d(3, 4, 3, padding=1), alpha=5.0)
    assert att.in_channels == 3
    assert not hasattr(att, "weight")  # no equivalent kernel: code probing for one sees none


def test_a_converted_conv_is_an_instance_of_its_conv_class():
    """Code that checks types (timm's reparameterize_model asserts isinstance(conv, nn.Conv2d))
    accepts a converted conv, reads the conv attributes it expects, and convert_model does not
    convert a converted conv again."""
    from attnconv.convert import ConvAttention

    c2, c1 = conv_to_attention(nn.Conv2d(4, 6, 3, padding=1)), conv_to_attention(nn.Conv1d(4, 6, 3))
    assert isinstance(c2, nn.Conv2d) and not isinstance(c2, nn.Conv1d)
    assert isinstance(c1, nn.Conv1d) and not isinstance(c1, nn.Conv2d)
    assert isinstance(c1, ConvAttention) and isinstance(c2, ConvAttention)
    for m in (c1, c2):
        assert m.transposed is False and m.output_padding == (0,) * len(m.kernel_size)
        assert "weight" not in dict(m.named_parameters())  # no parameter of nn.Conv2d's own
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
    once = convert_model(net)
    twice = convert_model(once)
    assert type(twice[0]) is type(once[0])
    assert len(list(twice.modules())) == len(list(once.modules()))
    x = torch.randn(1, 3, 5, 5)
    torch.testing.assert_close(twice(x), net(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="already a converted convolution"):
        conv_to_attention(c2)
