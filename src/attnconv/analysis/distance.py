"""Mean attention distance of every head against depth (Dosovitskiy et al. 2021, fig. 7 right).

For a query token q, d(q) = sum_k p(q, k) * ||pos(k) - pos(q)||, in image pixels (token centres
are ``pixels_per_token`` apart). Prefix keys (the class token) have no position: their mass is
dropped and each row renormalized over the image tokens. A head's mean attention distance is d(q)
averaged over every query token of every image whose row has spatial mass: a row with none (a
converted conv's query whose kernel tap lies wholly in the zero padding, or a row spent wholly on
the class token) has no distance and is left out, not counted as 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnconv.layers.attention_map import AttentionMap

from .maps import Grid, as_map


def token_positions(grid: Grid, pixels_per_token: Sequence[float] = (1.0, 1.0)) -> torch.Tensor:
    """(h*w, 2) pixel coordinates (row, col) of the token centres, row-major."""
    h, w = grid
    rows = (torch.arange(h, dtype=torch.float64) + 0.5) * float(pixels_per_token[0])
    cols = (torch.arange(w, dtype=torch.float64) + 0.5) * float(pixels_per_token[1])
    return torch.stack(torch.meshgrid(rows, cols, indexing="ij"), -1).reshape(-1, 2)


def pixel_distances(grid: Grid, pixels_per_token: Sequence[float] = (1.0, 1.0)) -> torch.Tensor:
    """(hw, hw) Euclidean distance in pixels between every pair of tokens."""
    pos = token_positions(grid, pixels_per_token)
    return torch.cdist(pos, pos)


class MeanDistance:
    """Running mean attention distance per head of one layer; ``result()`` -> (Nh,) pixels.

    ``pixels_per_token`` is the token size on the model grid ``grid``; a layer on a coarser grid
    (its ``AttentionMap.grid``) has proportionally larger tokens.

    Args:
        grid: the model grid (h, w), in tokens.
        pixels_per_token: a token's size (rows, cols) in image pixels on ``grid``.
    """

    def __init__(self, grid: Grid, pixels_per_token: Sequence[float] = (1.0, 1.0)):
        self.grid = grid
        self.ppt = (float(pixels_per_token[0]), float(pixels_per_token[1]))
        self.dist: torch.Tensor | None = None
        self.sum: torch.Tensor | None = None  # (Nh,) summed d(q) over non-empty rows
        self.rows: torch.Tensor | None = None  # (Nh,) number of non-empty rows summed
        self.count = 0

    def update(self, attn: AttentionMap, batch: int | None = None) -> None:
        """Add one batch's maps to the running mean.

        Args:
            attn: one layer's ``AttentionMap`` for a batch of images.
            batch: the images a shared (1, Nh, T, T) map (position-only attention) stands for;
                None: the map's own batch size.
        """
        attn = as_map(attn)
        if self.dist is None:
            lg = attn.grid
            ppt = (self.ppt[0] * self.grid[0] / lg[0], self.ppt[1] * self.grid[1] / lg[1])
            self.dist = pixel_distances(lg, ppt).float()
        n = batch if (batch is not None and attn.shape[0] == 1) else attn.shape[0]
        w = n / attn.shape[0]  # a shared (1, ...) map stands for n images
        s = torch.zeros(attn.num_heads, dtype=torch.float64)
        rows = torch.zeros(attn.num_heads, dtype=torch.float64)
        for i in range(attn.shape[0]):  # one image at a time: (p * dist) is as large as the maps
            p = attn.image(i).output_rows()[0].float()  # (Nh, hw, hw)
            mass = p.sum(-1)  # (Nh, hw) each row's spatial mass
            full = mass > 0  # rows with no spatial mass have no distance: left out
            d = (p * self.dist).sum(-1) / mass.clamp_min(1e-30)  # d(q) of the renormalized row
            s += (d * full).sum(-1).double()
            rows += full.sum(-1).double()
        self.sum = s * w if self.sum is None else self.sum + s * w
        self.rows = rows * w if self.rows is None else self.rows + rows * w
        self.count += n

    def result(self) -> torch.Tensor:
        """The mean over every image added so far.

        Returns:
            (Nh,) each head's mean attention distance over the rows with spatial mass, in
            pixels (0 for a head with none).
        """
        if not self.count:
            raise ValueError("no attention maps were accumulated")
        # mean over the non-empty rows; a head whose rows all lack spatial mass reports 0
        return (self.sum / self.rows.clamp_min(1)).float()


def mean_attention_distance(
    attn: AttentionMap | torch.Tensor,
    grid: Grid,
    *,
    num_prefix_tokens: int = 0,
    pixels_per_token: Sequence[float] = (1.0, 1.0),
) -> torch.Tensor:
    """Mean attention distance (Nh,) in pixels of one layer's ``AttentionMap`` on the model grid
    ``grid`` (a bare (B, Nh, T, T) tensor must be on ``grid`` after its prefix tokens).

    Args:
        attn: one layer's ``AttentionMap``, or its bare (B, Nh, T, T) probabilities.
        grid: the model grid (h, w), in tokens.
        num_prefix_tokens: a bare tensor's leading tokens without a position (the class token).
        pixels_per_token: a token's size (rows, cols) in image pixels on ``grid``.

    Returns:
        (Nh,) each head's mean attention distance, in pixels.
    """
    acc = MeanDistance(grid, pixels_per_token)
    acc.update(as_map(attn, grid, num_prefix_tokens))
    return acc.result()
