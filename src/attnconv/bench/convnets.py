"""Small CNNs of the depthwise-heavy families, for the conversion benchmark: a MobileNetV1-style
depthwise-separable network and a ConvNeXt-style stack of 7x7 depthwise blocks. NCHW images ->
logits; widths overridable."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def _dw_separable(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False),
        nn.BatchNorm2d(cin),
        nn.ReLU(),
        nn.Conv2d(cin, cout, 1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
    )


class DepthwiseSeparableNet(nn.Module):
    """MobileNetV1 layout: a 3x3 stem, then depthwise 3x3 + pointwise 1x1 pairs."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128, 128, 256, 256), classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 2, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        blocks, c = [], widths[0]
        for i, w in enumerate(widths[1:]):
            blocks.append(_dw_separable(c, w, 2 if i % 2 == 0 else 1))
            c = w
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class ConvNeXtBlock(nn.Module):
    """7x7 depthwise, channel LayerNorm (GroupNorm(1)), 1x1 expand x4, GELU, 1x1, residual."""

    def __init__(self, c: int):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.GroupNorm(1, c)
        self.pw1, self.pw2 = nn.Conv2d(c, 4 * c, 1), nn.Conv2d(4 * c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pw2(F.gelu(self.pw1(self.norm(self.dw(x)))))


class ConvNeXtStack(nn.Module):
    """A 4x4 patchify stem, then stages of ConvNeXt blocks with 2x2 downsampling between."""

    def __init__(self, widths: tuple[int, ...] = (48, 96), depth: int = 2, classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 4, 4)]
        for i, w in enumerate(widths):
            if i:
                layers.append(nn.Conv2d(widths[i - 1], w, 2, 2))
            layers += [ConvNeXtBlock(w) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))
