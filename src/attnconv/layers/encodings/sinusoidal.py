"""Sinusoidal position encodings (Vaswani et al. 2017, sec. 3.5), written once for every layer
and model: the 1D table, its rotation property PE(pos + k) = R(k) PE(pos), and the 2D table of
Cordonnier et al. eq. 7, SASA's absolute variant and ViT (the row's sinusoid on the first half of
the channels, the column's on the rest).
"""

from __future__ import annotations

import torch


def sinusoid_1d(pos: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """Vaswani sinusoids: PE(pos, 2i) = sin(pos w_i), PE(pos, 2i+1) = cos(pos w_i),
    w_i = base^(-2i/dim). pos (N,) float -> (N, dim). Odd dim drops the last cosine."""
    n_pairs = (dim + 1) // 2
    i = torch.arange(n_pairs, dtype=torch.float64, device=pos.device)
    omega = base ** (-2.0 * i / max(dim, 1))  # (n_pairs,)
    ang = pos.to(torch.float64)[:, None] * omega[None, :]  # (N, n_pairs)
    pe = torch.stack([ang.sin(), ang.cos()], dim=-1).flatten(1)  # (N, 2*n_pairs) interleaved
    return pe[:, :dim].to(pos.dtype if pos.is_floating_point() else torch.float32)


def sinusoid_rotation_1d(offset: float, dim: int, base: float = 10000.0) -> torch.Tensor:
    """R(k) (dim, dim) with sinusoid_1d(pos + k) = sinusoid_1d(pos) @ R(k)^T: a rotation by
    w_i * k on each (sin, cos) pair (the last, lone sine of an odd dim is not closed under shifts,
    so dim must be even)."""
    if dim % 2:
        raise ValueError(f"the rotation property needs an even dim, got {dim}")
    i = torch.arange(dim // 2, dtype=torch.float64)
    ang = offset * base ** (-2.0 * i / dim)
    c, s = ang.cos(), ang.sin()
    blocks = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)  # (dim/2, 2, 2)
    return torch.block_diag(*blocks)


def sinusoid_2d(
    h: int, w: int, channels: int, base: float = 10000.0, device: torch.device | None = None
) -> torch.Tensor:
    """2D sinusoidal table (h*w, channels) float32, pixels in row-major order: the row's
    sinusoid on channels[:C//2], the column's on the rest."""
    c_row = channels // 2
    rows = sinusoid_1d(torch.arange(h, dtype=torch.float32, device=device), c_row, base)
    cols = sinusoid_1d(torch.arange(w, dtype=torch.float32, device=device), channels - c_row, base)
    return torch.cat(
        [rows[:, None, :].expand(h, w, c_row), cols[None, :, :].expand(h, w, channels - c_row)],
        dim=-1,
    ).reshape(h * w, channels)
