"""Attention maps of every head of every layer for one query (Cordonnier et al. 2020, fig. 4-6).

The models' contract: ``model(x, return_attention=True) -> (logits, attns)`` with ``attns`` a list
(input -> output order) of softmax probabilities (B or 1, Nh, T, T), rows = queries in row-major
order over the layer's token grid, after ``model.num_prefix_tokens`` prefix tokens (the ViT class
token). A map is one query's row reshaped to the token grid: (Nh, h, w).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn as nn

from attnconv.progress import Progress

log = logging.getLogger(__name__)

Grid = tuple[int, int]


def layer_grid(num_tokens: int, grid: Grid, num_prefix_tokens: int = 0) -> Grid:
    """The token grid (h, w) of a layer with ``num_tokens`` tokens, given the model's grid.

    Layers after a downsampling stage (SASA ResNets) have the model grid divided by an integer.
    """
    n = num_tokens - num_prefix_tokens
    h, w = int(grid[0]), int(grid[1])
    if n == h * w:
        return (h, w)
    for s in range(2, max(h, w) + 1):
        if h % s == 0 and w % s == 0 and (h // s) * (w // s) == n:
            return (h // s, w // s)
    r = math.isqrt(n)
    if r * r == n:
        return (r, r)
    raise ValueError(
        f"cannot place {num_tokens} tokens ({num_prefix_tokens} prefix) on a grid like {grid}"
    )


def check_attention(attn: torch.Tensor, name: str = "attention") -> torch.Tensor:
    if not isinstance(attn, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(attn).__name__}")
    if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"{name} must have shape (B, Nh, T, T), got {tuple(attn.shape)}")
    return attn


def spatial(attn: torch.Tensor, num_prefix_tokens: int = 0, renormalize: bool = False):
    """Drop prefix tokens: (B, Nh, T, T) -> (B, Nh, hw, hw); optionally renormalize the rows."""
    check_attention(attn)
    p = attn.detach()[..., num_prefix_tokens:, num_prefix_tokens:].float()
    if renormalize:
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
    return p


def scale_query(query: Sequence[int], grid: Grid, lgrid: Grid) -> tuple[int, int]:
    """Map a query (row, col) on the model grid to a layer grid (same image area)."""
    r, c = int(query[0]), int(query[1])
    if not (0 <= r < grid[0] and 0 <= c < grid[1]):
        raise ValueError(f"query {tuple(query)} is outside the token grid {tuple(grid)}")
    return (r * lgrid[0] // grid[0], c * lgrid[1] // grid[1])


def query_maps(
    attns: Sequence[torch.Tensor],
    grid: Grid,
    query: Sequence[int],
    *,
    num_prefix_tokens: int = 0,
    image: int | None = None,
) -> list[torch.Tensor]:
    """Per layer, the (Nh, h, w) attention of ``query`` (row, col on ``grid``) over the keys.

    ``image=None`` averages over the batch; otherwise picks that batch element (a batch of 1,
    position-only attention, is shared by every image).
    """
    out = []
    for i, a in enumerate(attns):
        check_attention(a, f"attention of layer {i}")
        lg = layer_grid(a.shape[-1], grid, num_prefix_tokens)
        r, c = scale_query(query, grid, lg)
        row = a.detach()[
            :, :, num_prefix_tokens + r * lg[1] + c, num_prefix_tokens:
        ].float()  # (B, Nh, hw)
        if image is None or a.shape[0] == 1:
            row = row.mean(0)
        else:
            if not 0 <= image < a.shape[0]:
                raise ValueError(f"image index {image} out of range for batch {a.shape[0]}")
            row = row[image]
        out.append(row.reshape(-1, *lg))  # (Nh, h, w)
    return out


MAP_BUDGET = 2**27  # bytes of attention maps one batch may hold (dense T x T maps are large)


@torch.no_grad()
def iter_attention(
    model: nn.Module,
    images: torch.Tensor,
    batch_size: int = 25,
    *,
    budget: int = MAP_BUDGET,
    allow_empty: bool = False,
    desc: str = "attention maps",
) -> Iterator[tuple[int, int, list[torch.Tensor]]]:
    """Run ``model`` over ``images`` (N, C, H, W); yield (start, stop, attns) per batch, the
    batch being ``images[start:stop]`` (maps of batch 1 are shared by the whole batch).

    The first batch is one image; its maps' size sets the next batches' size so that one batch
    holds at most ``budget`` bytes of maps (and at most ``batch_size`` images). A model without
    attention maps raises ValueError, or with ``allow_empty`` yields nothing. Progress (images
    done) is shown as ``desc``.
    """
    if images.dim() != 4:
        raise ValueError(f"images must have shape (N, C, H, W), got {tuple(images.shape)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    model.eval()
    dev = next(model.parameters(), images).device  # the images go where the model is
    bar = Progress(images.shape[0], desc, unit="img", logger=log, leave=False)
    start, b = 0, 1
    try:
        while start < images.shape[0]:
            stop = min(start + b, images.shape[0])
            out = model(images[start:stop].to(dev), return_attention=True)
            attns = [a.cpu() for a in out[1]] if isinstance(out, tuple) and len(out) == 2 else []
            if not attns:
                if allow_empty:
                    return
                raise ValueError(f"{type(model).__name__} returned no attention maps")
            for i, a in enumerate(attns):
                check_attention(a, f"attention of layer {i}")
            bar.update(stop - start)
            yield start, stop, attns
            if start == 0:  # size the next batches from the first image's maps
                per_image = sum(a.numel() * a.element_size() // a.shape[0] for a in attns)
                b = max(1, min(batch_size, budget // max(per_image, 1)))
            start = stop
    finally:
        bar.close()


class MapAverage:
    """Running mean over images of the attention rows of chosen queries (None = all queries).

    ``result()`` -> list per layer of (Nh, Q, h*w) mean spatial probabilities (prefix keys dropped).
    Queries are (row, col) on the model grid and are scaled to each layer's grid.
    """

    def __init__(
        self,
        grid: Grid,
        num_prefix_tokens: int = 0,
        queries: Sequence[Sequence[int]] | None = None,
    ):
        self.grid = (int(grid[0]), int(grid[1]))
        self.prefix = int(num_prefix_tokens)
        self.queries = None if queries is None else [tuple(q) for q in queries]
        self.sums: list[torch.Tensor] | None = None
        self.grids: list[Grid] = []
        self.count = 0

    def _rows(self, lg: Grid) -> torch.Tensor | None:
        if self.queries is None:
            return None
        idx = [
            self.prefix + r * lg[1] + c
            for r, c in (scale_query(q, self.grid, lg) for q in self.queries)
        ]
        return torch.tensor(idx, dtype=torch.long)

    def update(self, attns: Sequence[torch.Tensor], batch: int | None = None) -> None:
        n = batch if batch is not None else max(a.shape[0] for a in attns)
        if self.sums is None:
            self.grids = [layer_grid(a.shape[-1], self.grid, self.prefix) for a in attns]
            self.sums = [None] * len(attns)  # type: ignore[list-item]
        if len(attns) != len(self.sums):
            raise ValueError(f"expected {len(self.sums)} attention layers, got {len(attns)}")
        for i, a in enumerate(attns):
            rows = self._rows(self.grids[i])
            p = (
                a[:, :, self.prefix :, self.prefix :]
                if rows is None
                else a[:, :, rows, self.prefix :]
            )
            s = p.detach().float().sum(0) * (n if a.shape[0] == 1 else 1)  # (Nh, Q, hw)
            self.sums[i] = s if self.sums[i] is None else self.sums[i] + s
        self.count += n

    def result(self) -> list[torch.Tensor]:
        if not self.count:
            raise ValueError("no attention maps were accumulated")
        return [s / self.count for s in self.sums]  # type: ignore[union-attr]


def crop(
    maps: torch.Tensor, center: Sequence[int], size: int | None
) -> tuple[torch.Tensor, int, int]:
    """Crop (..., h, w) to a size x size window around ``center`` (clipped to the map).

    Returns (cropped, row0, col0) so that the query sits at (center - (row0, col0)).
    """
    h, w = maps.shape[-2:]
    if size is None or (size >= h and size >= w):
        return maps, 0, 0
    if size < 1:
        raise ValueError(f"zoom must be a positive window size, got {size}")
    r0 = min(max(int(center[0]) - size // 2, 0), max(h - size, 0))
    c0 = min(max(int(center[1]) - size // 2, 0), max(w - size, 0))
    return maps[..., r0 : r0 + size, c0 : c0 + size], r0, c0
