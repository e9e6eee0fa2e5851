"""Every public layer, small and in float64, for the tests that run each one (second
derivatives, torch.func transforms)."""

from __future__ import annotations

import torch
import torch.nn as nn

from attnconv.convert.modules import conv_to_attention
from attnconv.layers.encodings import POSITIONALS
from attnconv.layers.feedforward import FeedForward
from attnconv.layers.local import LocalSelfAttention2d
from attnconv.layers.mha import MultiHeadAttention, SinusoidalPositionalEncoding
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from attnconv.layers.stem import AttentionStem2d


def _image(c: int = 4, h: int = 3, w: int = 3) -> torch.Tensor:
    return torch.randn(1, c, h, w, dtype=torch.float64, requires_grad=True)


def public_layers(backend: str | None) -> list[tuple[str, nn.Module, torch.Tensor]]:
    """(name, module, input) for every public layer, small, float64 (``backend``: None, the
    plans' choice, or "reference")."""
    out = []
    for pos in POSITIONALS:
        for content in (True, False):
            if pos == "none" and not content:
                continue
            layer = MultiHeadSelfAttention2d(
                4, 4, 2, positional=pos, content=content, backend=backend, max_size=8
            )
            out.append((f"mhsa2d-{pos}-{'content' if content else 'position'}", layer, _image()))
    modes = [("relative", "qk+qr"), ("relative", "qr"), ("absolute", "qk+qr"), ("none", "qk")]
    for pos, logits in modes:
        layer = LocalSelfAttention2d(
            8, 8, 2, kernel_size=3, positional=pos, logits=logits, backend=backend
        )
        out.append((f"local-{pos}-{logits}", layer, _image(8)))
    out.append(
        (
            "local-zeros",
            LocalSelfAttention2d(8, 8, 2, 3, padding="zeros", backend=backend),
            _image(8),
        )
    )
    out.append(
        (
            "stem",
            AttentionStem2d(4, 4, 2, kernel_size=3, mixtures=2, pool=1, backend=backend),
            _image(),
        )
    )
    seq = torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True)
    out.append(("mha", MultiHeadAttention(8, 2, backend=backend), seq))
    out.append(("feedforward", FeedForward(8, 16), seq))
    out.append(("sinusoidal", SinusoidalPositionalEncoding(8), seq))
    out.append(
        (
            "converted-conv",
            conv_to_attention(nn.Conv2d(4, 3, 3, padding=1), backend=backend),
            _image(),
        )
    )
    return out
