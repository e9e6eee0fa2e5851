"""What every positional encoding gives the attention layer (Cordonnier et al. sec. 2), and the
pixel geometry the encodings share.

delta = key position - query position, in pixels, (row, col). Tables are indexed by
delta + max_size - 1.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .terms import NoTerm, Term


def check_size(h: int, w: int, max_size: int, what: str) -> None:
    if h > max_size or w > max_size:
        raise ValueError(
            f"input {h}x{w} is larger than the learned {what} table (max_size={max_size}); "
            f"build the layer with max_size >= {max(h, w)}"
        )


def relative_index(n: int, device=None) -> torch.Tensor:
    """(n, n) long: [q, k] -> k - q + n - 1, the row of a (2n-1)-entry table of offsets."""
    r = torch.arange(n, device=device)
    return r[None, :] - r[:, None] + n - 1


def pixel_coords(h: int, w: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """(h*w, 2) (row, col) of every pixel in row-major order, centred on the image middle
    (offsets are unchanged; centring keeps the folded quadratic logits small)."""
    i = torch.arange(h, device=device, dtype=dtype) - (h - 1) / 2
    j = torch.arange(w, device=device, dtype=dtype) - (w - 1) / 2
    return torch.stack(torch.meshgrid(i, j, indexing="ij"), dim=-1).reshape(h * w, 2)


class PositionalEncoding(nn.Module):
    """A positional encoding tells the attention layer its logits as one typed term
    (``term(h, w, content=...)``, terms.py), from which the layer's plan picks the kernel
    (kernels/plan.py), never by the encoding's name; ``dense_bias(q, k, h, w, dtype)`` is the
    plain equations' (B|1, Nh, T, T) bias, or None. Besides:

    - ``reads_q``: its logits read the queries/keys (the layer builds Wq, Wk for it);
    - ``adds_to_input``: absolute P (T, C) added to the input of Wq/Wk: ``self(h, w)``;
    - ``learned_size``: side of its learned tables (None: any image size);
    - ``hard``: one-hot heads (quadratic).
    """

    name = "none"
    reads_q = False
    adds_to_input = False
    learned_size: int | None = None
    hard = False

    def check(self, content: bool) -> None:
        """ValueError if the encoding cannot serve a layer with(out) ``content``."""

    def check_widths(self, *, in_channels: int, qk_dim: int) -> None:
        """ValueError if a typed encoding was built for other widths than the layer's."""

    def term(self, h: int, w: int, *, content: bool) -> Term:
        return NoTerm(owner=self, h=h, w=w)

    def dense_bias(self, q, k, h: int, w: int, dtype) -> torch.Tensor | None:
        return None
