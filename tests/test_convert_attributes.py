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
    for name in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation",
                 "groups", "padding_mode"):  # fmt: skip
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
    assert not isinstance(converted.conv, nn.Conv2d)  # it is attention now
    got = converted(x)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)


def test_soft_layer_has_no_equivalent_kernel():
    att = conv_to_attention(nn.Conv2d(3, 4, 3, padding=1), alpha=5.0)
    assert att.in_channels == 3
    assert not hasattr(att, "weight")  # no equivalent kernel: code probing for one sees none
