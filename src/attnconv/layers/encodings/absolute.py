"""The absolute positional encoding of Cordonnier, Loukas, Jaggi (ICLR 2020), eq. 7, and none.

P (T, C) is added to the input of the query/key projections: learned row/column tables, or 2D
sinusoids (half the channels encode the row, half the column). ``NoEncoding`` gives no positional
term. The relative encodings (eq. 8, sec. 4.3) are in relative.py, the quadratic ones (eq. 9) in
gaussian.py; the attention math lives in kernels/.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .base import PositionalEncoding, check_size
from .sinusoidal import sinusoid_2d
from .terms import AxisTerm, NoTerm


class NoEncoding(PositionalEncoding):
    """``positional="none"``: no positional term (position-only: uniform attention, a
    separable one of zero row and column logits).

    Args:
        num_heads: Nh (the shape of the zero logits).
    """

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads

    def term(self, h: int, w: int, *, content: bool) -> AxisTerm | NoTerm:
        if content:
            return NoTerm(owner=self, h=h, w=w)
        return AxisTerm(owner=self, h=h, w=w)

    def axis_logits(self, h: int, w: int, dtype=None):
        dt, nh = dtype or torch.float32, self.num_heads
        return torch.zeros(nh, h, h, dtype=dt), torch.zeros(nh, w, w, dtype=dt)


class AbsolutePositionalEncoding2d(PositionalEncoding):
    """P (h*w, C) of eq. 7: learned row/column tables or fixed 2D sinusoids.

    Args:
        channels: C, the width of P (the layer's input channels): half encode the row, half
            the column.
        learned: learned tables (else fixed 2D sinusoids).
        max_size: side of the learned tables (images up to max_size x max_size).
    """

    adds_to_input = True

    def __init__(self, channels: int, *, learned: bool, max_size: int = 64):
        super().__init__()
        self.channels, self.learned, self.max_size = channels, learned, max_size
        self.name = "absolute_learned" if learned else "absolute_sinusoidal"
        self.learned_size = max_size if learned else None
        c_row = channels // 2
        if learned:
            self.row = nn.Parameter(torch.randn(max_size, c_row) * 0.02)
            self.col = nn.Parameter(torch.randn(max_size, channels - c_row) * 0.02)
        # no state: follows .to(device) so the fixed sinusoids are made where the layer lives
        self.register_buffer("device_anchor", torch.empty(0), persistent=False)

    def check_widths(self, *, in_channels: int, qk_dim: int) -> None:
        if self.channels != in_channels:
            raise ValueError(
                f"the absolute encoding has {self.channels} channels, the layer's input "
                f"{in_channels} (P is added to the input)"
            )

    def forward(self, h: int, w: int) -> torch.Tensor:
        if not self.learned:
            return sinusoid_2d(h, w, self.channels, device=self.device_anchor.device)
        check_size(h, w, self.max_size, "absolute positional")
        c_row = self.row.shape[1]
        return torch.cat(
            [
                self.row[:h, None, :].expand(h, w, c_row),
                self.col[None, :w, :].expand(h, w, self.channels - c_row),
            ],
            dim=-1,
        ).reshape(h * w, self.channels)
