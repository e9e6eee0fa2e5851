"""Small networks with the patterns of model-zoo CNNs (written here: no zoo dependency): a
TensorFlow-"SAME" conv subclass (EfficientNet ports), weight-standardized convs with a gain
(BiT / NFNet), depthwise-separable and inverted-residual blocks with squeeze-excitation
(MobileNet / EfficientNet), grouped bottlenecks (ResNeXt / RegNet), dilation, a ConvNeXt-style
7x7 depthwise block, and Conv1d channel attention (ECA)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Conv2dSame(nn.Conv2d):
    """TensorFlow 'SAME': padding computed from the input size in forward."""

    def __init__(self, cin, cout, k, stride=1, dilation=1, groups=1, bias=True):
        super().__init__(cin, cout, k, stride, 0, dilation, groups, bias)

    def forward(self, x):
        ih, iw = x.shape[-2:]
        pads = [
            max((math.ceil(i / s) - 1) * s + (k - 1) * d + 1 - i, 0)
            for i, k, s, d in zip((ih, iw), self.kernel_size, self.stride, self.dilation)
        ]
        ph, pw = pads
        x = F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class ScaledStdConv2d(nn.Conv2d):
    """Scaled weight standardization with a learned gain (NFNet), optional TF-'SAME' padding."""

    def __init__(self, cin, cout, k, stride=1, padding=0, groups=1, eps=1e-6, same=False):
        super().__init__(cin, cout, k, stride, 0 if same else padding, 1, groups, True)
        self.gain = nn.Parameter(torch.rand(cout, 1, 1, 1) + 0.5)
        self.scale = self.weight[0].numel() ** -0.5
        self.eps, self.same = eps, same

    def forward(self, x):
        if self.same:
            ih, iw = x.shape[-2:]
            ph, pw = (
                max((math.ceil(i / s) - 1) * s + k - i, 0)
                for i, k, s in zip((ih, iw), self.kernel_size, self.stride)
            )
            x = F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
        w = F.batch_norm(
            self.weight.reshape(1, self.out_channels, -1),
            None,
            None,
            weight=(self.gain * self.scale).view(-1),
            training=True,
            momentum=0.0,
            eps=self.eps,
        ).reshape_as(self.weight)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class StdConv2d(nn.Conv2d):
    """BiT's weight standardization, std computed by torch.std_mean (an older formula)."""

    def forward(self, x):
        std, mean = torch.std_mean(self.weight, dim=[1, 2, 3], keepdim=True, unbiased=False)
        w = (self.weight - mean) / (std + 1e-8)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class SqueezeExcite(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.expand(F.relu(self.reduce(s))))


class ECA(nn.Module):
    """Efficient channel attention: a Conv1d over the pooled channels."""

    def __init__(self, k=3):
        super().__init__()
        self.conv = nn.Conv1d(1, 1, k, padding=k // 2, bias=False)

    def forward(self, x):
        s = self.conv(x.mean((2, 3))[:, None, :])  # (B, 1, C)
        return x * torch.sigmoid(s[:, 0, :, None, None])


class InvertedResidual(nn.Module):
    """MobileNetV2/EfficientNet: expand 1x1, depthwise kxk (TF-SAME when ``same``), SE, project."""

    def __init__(self, c, expand=4, k=3, stride=1, same=False):
        super().__init__()
        e = c * expand
        self.expand = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), nn.SiLU())
        dw = (
            Conv2dSame(e, e, k, stride, groups=e, bias=False)
            if same
            else nn.Conv2d(e, e, k, stride, k // 2, groups=e, bias=False)
        )
        self.dw = nn.Sequential(dw, nn.BatchNorm2d(e), nn.SiLU())
        self.se = SqueezeExcite(e)
        self.project = nn.Sequential(nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))
        self.residual = stride == 1

    def forward(self, x):
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.residual else y


class GroupedBottleneck(nn.Module):
    """ResNeXt/RegNet: 1x1, grouped 3x3 (dilated), 1x1, ECA."""

    def __init__(self, c, groups=4, dilation=2):
        super().__init__()
        self.a = nn.Conv2d(c, c, 1)
        self.b = nn.Conv2d(c, c, 3, padding=dilation, dilation=dilation, groups=groups)
        self.c = nn.Conv2d(c, c, 1)
        self.eca = ECA()

    def forward(self, x):
        return F.relu(x + self.eca(self.c(F.relu(self.b(F.relu(self.a(x)))))))


class ConvNeXtBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.pw1, self.pw2 = nn.Conv2d(c, 4 * c, 1), nn.Conv2d(4 * c, c, 1)
        self.norm = nn.GroupNorm(1, c)

    def forward(self, x):
        return x + self.pw2(F.gelu(self.pw1(self.norm(self.dw(x)))))


class ZooNet(nn.Module):
    """Every pattern above in one network: NCHW images -> 10 logits."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.stem = ScaledStdConv2d(3, c, 3, stride=2, same=True)
        self.std = StdConv2d(c, c, 3, padding=1)
        self.mb = nn.Sequential(InvertedResidual(c, same=True), InvertedResidual(c, k=5, stride=2))
        self.dws = nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1, groups=c), nn.Conv2d(c, c, 1)
        )  # depthwise-separable
        self.grouped = GroupedBottleneck(c)
        self.convnext = ConvNeXtBlock(c)
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        x = self.convnext(self.grouped(self.dws(self.mb(F.relu(self.std(self.stem(x)))))))
        return self.head(x.mean((2, 3)))
