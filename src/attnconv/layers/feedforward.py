"""The position-wise feed-forward block of the Transformer and ViT, written once.

Vaswani et al. 2017, eq. 2: FFN(x) = max(0, x W1 + b1) W2 + b2 (``activation="relu"``, dropout on
the hidden units). ViT (Dosovitskiy et al. 2021, eq. 3) uses GELU and dropout after both linear
layers (``activation="gelu", out_dropout=True``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class FeedForward(nn.Module):
    """(..., dim) -> (..., dim): fc2(drop(act(fc1(x)))), then drop again if ``out_dropout``."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        dropout: float = 0.0,
        *,
        activation: str = "relu",
        out_dropout: bool = False,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)
        self.act = ACTIVATIONS[activation]
        self.out_dropout = out_dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(self.drop(self.act(self.fc1(x))))  # (..., dim)
        return self.drop(y) if self.out_dropout else y
