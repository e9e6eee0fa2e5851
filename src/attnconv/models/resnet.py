"""CIFAR ResNet18: the convolutional baseline of Cordonnier et al. (ICLR 2020), Table 1.

He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016), BasicBlock [2, 2, 2, 2],
with the CIFAR stem of the reference code: one 3x3 conv, stride 1, no max-pool (32x32 input,
stages at 32, 16, 8, 4 pixels). 11.17M parameters at 10 classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import build_config, check_images, check_stages
from .registry import register_model

__all__ = ["ResNetConfig", "ResNetCifar", "resnet18_cifar"]


@dataclass
class ResNetConfig:
    num_classes: int = 10
    in_chans: int = 3
    widths: tuple[int, ...] = (64, 128, 256, 512)
    depths: tuple[int, ...] = (2, 2, 2, 2)  # BasicBlocks per stage
    img_size: int = 32


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN + shortcut (1x1 conv + BN when the shape changes), ReLU."""

    def __init__(self, in_chans: int, out_chans: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_chans, out_chans, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_chans)
        self.conv2 = nn.Conv2d(out_chans, out_chans, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_chans)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_chans != out_chans:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_chans, out_chans, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_chans),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNetCifar(nn.Module):
    """ResNet with a 3x3 stride-1 stem for 32x32 images. NCHW in, logits out.

    It has no attention layers: ``forward(x, return_attention=True)`` returns (logits, []).
    ``attention_grid`` is the grid of the final feature map (4x4 at 32x32), the tokens a
    classifier head sees; ``num_prefix_tokens`` is 0.
    """

    num_prefix_tokens = 0

    def __init__(self, cfg: ResNetConfig) -> None:
        super().__init__()
        check_stages("resnet", cfg.widths, cfg.depths)  # a stage of 0 blocks: ValueError
        self.cfg = cfg
        self.conv1 = nn.Conv2d(cfg.in_chans, cfg.widths[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cfg.widths[0])
        stages, c = [], cfg.widths[0]
        for i, (w, d) in enumerate(zip(cfg.widths, cfg.depths)):
            blocks = [BasicBlock(c, w, stride=1 if i == 0 else 2)]
            blocks += [BasicBlock(w, w) for _ in range(d - 1)]
            stages.append(nn.Sequential(*blocks))
            c = w
        self.layers = nn.Sequential(*stages)
        self.num_features = c
        self.fc = nn.Linear(c, cfg.num_classes)
        s = cfg.img_size // 2 ** (len(cfg.widths) - 1)
        self.attention_grid = (s, s)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        check_images(x, self.cfg.in_chans, "resnet", self)
        x = F.relu(self.bn1(self.conv1(x)))  # (B, 64, H, W)
        return self.layers(x)  # (B, 512, H/8, W/8)

    def forward_head(self, feats: torch.Tensor) -> torch.Tensor:
        return self.fc(feats.mean(dim=(2, 3)))  # global average pool -> (B, classes)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        logits = self.forward_head(self.forward_features(x))
        return (logits, []) if return_attention else logits


@register_model
def resnet18_cifar(num_classes: int = 10, **overrides) -> ResNetCifar:
    """CIFAR ResNet18 (3x3 stem): 11.17M parameters at 10 classes (Table 1: 11.2M)."""
    return ResNetCifar(
        build_config(ResNetConfig, "resnet18_cifar", {"num_classes": num_classes}, overrides)
    )
