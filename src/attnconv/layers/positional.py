"""2D positional encodings of Cordonnier, Loukas, Jaggi (ICLR 2020), sec. 2 and 4.

- absolute (eq. 7): P (T, C) added to the input of the query/key projections, learned or 2D
  sinusoidal (half the channels encode the row, half the column);
- relative, Dai et al. (eq. 8): r_delta = concat(r_row(delta1), r_col(delta2)), fixed or learned,
  projected per head by What_k, with global biases u (content) and v (position) (relative.py);
- learned relative (sec. 4.3): row and column tables, read by the query or by per-head keys
  (relative.py);
- quadratic (eq. 9): -alpha_h ||delta - Delta_h||^2 with learned centres Delta (Nh, 2) and
  precision alpha (Nh,); generalized: -1/2 (delta - Delta)^T Sigma_h^-1 (delta - Delta)
  (gaussian.py).

Each gives the layer its logits as one typed term (terms.py). Every module here is small: the
attention math lives in kernels/ and quadratic.py.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .encoding_base import (  # noqa: F401  (the encodings' shared names, re-exported)
    PositionalEncoding,
    check_size,
    pixel_coords,
    relative_index,
)
from .gaussian import (  # noqa: F401
    GeneralizedQuadraticEncoding,
    QuadraticEncoding,
    gaussian_offset_logits,
    shifted_axis,
)
from .precision import hi  # noqa: F401
from .sinusoidal import sinusoid_1d, sinusoid_2d
from .terms import AxisTerm, NoTerm, axis_onehot, expand_fold  # noqa: F401
from .upgrade import upgrade_state_dict  # noqa: F401


class NoEncoding(PositionalEncoding):
    """``positional="none"``: no positional term (position-only: uniform attention, a
    separable one of zero row and column logits)."""

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads

    def term(self, h: int, w: int, *, content: bool) -> AxisTerm | NoTerm:
        if content:
            return NoTerm(dense=self.dense(h, w))
        return AxisTerm(dense=self.dense(h, w), h=h, w=w,
                        axes=lambda dtype=None: self.axis_logits(h, w, dtype))  # fmt: skip

    def axis_logits(self, h: int, w: int, dtype=None):
        dt, nh = dtype or torch.float32, self.num_heads
        return torch.zeros(nh, h, h, dtype=dt), torch.zeros(nh, w, w, dtype=dt)


class AbsolutePositionalEncoding2d(PositionalEncoding):
    """P (h*w, C) of eq. 7: learned row/column tables or fixed 2D sinusoids."""

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


class RelativeTables2d(nn.Module):
    """r_row(delta1) (dim_row) and r_col(delta2) (dim_col) for delta in [-(n-1), n-1]:
    learned tables of 2*max_size-1 rows, or fixed sinusoids of the offset."""

    def __init__(self, dim_row: int, dim_col: int, *, learned: bool, max_size: int = 64):
        super().__init__()
        self.dim_row, self.dim_col = dim_row, dim_col
        self.learned, self.max_size = learned, max_size
        if learned:
            self.rel_row = nn.Parameter(torch.randn(2 * max_size - 1, dim_row))
            self.rel_col = nn.Parameter(torch.randn(2 * max_size - 1, dim_col))
        # no state: follows .to(device) so the fixed sinusoids are made where the layer lives
        self.register_buffer("device_anchor", torch.empty(0), persistent=False)

    def forward(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(2h-1, dim_row), (2w-1, dim_col); entry d + n - 1 holds offset d."""
        if not self.learned:
            dev = self.device_anchor.device
            dr = torch.arange(-(h - 1), h, dtype=torch.float32, device=dev)
            dc = torch.arange(-(w - 1), w, dtype=torch.float32, device=dev)
            return sinusoid_1d(dr, self.dim_row), sinusoid_1d(dc, self.dim_col)
        check_size(h, w, self.max_size, "relative positional")
        m = self.max_size
        return self.rel_row[m - h : m + h - 1], self.rel_col[m - w : m + w - 1]
