"""``tiny_cnn``: a two-layer CNN for fast tests of the data / training / checkpoint machinery."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import check_images
from .registry import register_model


class TinyCNN(nn.Module):
    """conv3x3 -> norm -> ReLU -> conv3x3/2 -> norm -> ReLU -> mean pool -> linear. NCHW."""

    num_prefix_tokens = 0

    def __init__(
        self,
        in_chans: int = 3,
        num_classes: int = 10,
        width: int = 16,
        norm: str = "group",
        img_size: int = 32,
    ):
        super().__init__()
        if norm not in ("group", "batch", "none"):
            raise ValueError(f"norm must be 'group', 'batch' or 'none', got {norm!r}")

        def _norm(c: int) -> nn.Module:
            return {
                "group": lambda: nn.GroupNorm(4, c),
                "batch": lambda: nn.BatchNorm2d(c),
                "none": nn.Identity,
            }[norm]()

        self.conv1 = nn.Conv2d(in_chans, width, 3, padding=1)
        self.norm1 = _norm(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.norm2 = _norm(2 * width)
        self.head = nn.Linear(2 * width, num_classes)
        self.attention_grid = (img_size // 2, img_size // 2)  # no attention: the feature grid

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        check_images(x, self.conv1.in_channels, "tiny_cnn", self)
        x = F.relu(self.norm1(self.conv1(x)))  # (B, w, H, W)
        return F.relu(self.norm2(self.conv2(x)))  # (B, 2w, H/2, W/2)

    def forward_head(self, feats: torch.Tensor) -> torch.Tensor:
        return self.head(feats.mean(dim=(2, 3)))  # (B, classes)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        logits = self.forward_head(self.forward_features(x))
        return (logits, []) if return_attention else logits


@register_model
def tiny_cnn(num_classes: int = 10, **kwargs) -> TinyCNN:
    return TinyCNN(num_classes=num_classes, **kwargs)
