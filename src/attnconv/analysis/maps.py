"""Attention maps of every head of every layer for one query (Cordonnier et al. 2020, fig. 4-6).

The models' contract: ``model(x, return_attention=True) -> (logits, maps)`` with ``maps`` a list
(input -> output order) of ``AttentionMap`` (``attnconv.layers.attention_map``): softmax
probabilities (B or 1, Nh, T, T) with the token grid they live on and their number of prefix
tokens, so nothing here guesses a layer's grid. Queries are given as (row, col) on the model's
``attention_grid`` and scaled to each layer's grid. A map is one query's row reshaped to the
layer's token grid: (Nh, h, w).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import torch
import torch.nn as nn

from attnconv.layers.attention_map import AttentionMap, Grid
from attnconv.progress import Progress

log = logging.getLogger(__name__)


def as_map(
    attn: AttentionMap | torch.Tensor, grid: Grid | None = None, num_prefix_tokens: int = 0
) -> AttentionMap:
    """An ``AttentionMap`` as is; a bare (B, Nh, T, T) tensor only if it fits ``grid`` exactly."""
    if isinstance(attn, AttentionMap):
        return attn
    if isinstance(attn, torch.Tensor) and grid is not None:
        return AttentionMap(attn, grid, num_prefix_tokens)
    raise TypeError(
        f"expected an AttentionMap (probabilities, grid, prefix tokens), got {type(attn).__name__}"
        "; a model's return_attention must return AttentionMap objects"
    )


def scale_query(query: Sequence[int], grid: Grid, lgrid: Grid) -> tuple[int, int]:
    """Map a query (row, col) on the model grid to a layer grid (same image area)."""
    r, c = int(query[0]), int(query[1])
    if not (0 <= r < grid[0] and 0 <= c < grid[1]):
        raise ValueError(f"query {tuple(query)} is outside the token grid {tuple(grid)}")
    return (r * lgrid[0] // grid[0], c * lgrid[1] // grid[1])


def query_maps(
    maps: Sequence[AttentionMap],
    grid: Grid,
    query: Sequence[int],
    *,
    image: int | None = None,
) -> list[torch.Tensor]:
    """Per layer, the (Nh, h, w) attention of ``query`` (row, col on ``grid``) over the keys.

    ``image=None`` averages over the batch; otherwise picks that batch element (a batch of 1,
    position-only attention, is shared by every image).

    Args:
        maps: every layer's ``AttentionMap``, input -> output.
        grid: the model grid (h, w), in tokens.
        query: the query (row, col) on ``grid``, scaled to each layer's grid.
        image: the batch element to show; None for the batch mean.

    Returns:
        Per layer, an (Nh, h, w) tensor on that layer's grid (prefix keys dropped).
    """
    out = []
    for m in maps:
        m = as_map(m)
        row = m.query_row(*scale_query(query, grid, m.grid))  # (B, Nh, h, w)
        if image is None or row.shape[0] == 1:
            row = row.mean(0)
        else:
            if not 0 <= image < row.shape[0]:
                raise ValueError(f"image index {image} out of range for batch {row.shape[0]}")
            row = row[image]
        out.append(row)  # (Nh, h, w)
    return out


def layer_names(model: nn.Module, n: int) -> list[str]:
    """Labels of the ``n`` attention layers of ``model``: its ``layer_names`` (a converted CNN's
    module names) when it has one per layer, else "layer 1", "layer 2", ..."""
    names = getattr(model, "layer_names", None)
    if names is not None and len(names) == n:
        return [str(x) for x in names]
    return [f"layer {i + 1}" for i in range(n)]


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
) -> Iterator[tuple[int, int, list[AttentionMap]]]:
    """Run ``model`` over ``images`` (N, C, H, W); yield (start, stop, maps) per batch, the
    batch being ``images[start:stop]`` (maps of batch 1 are shared by the whole batch).

    The first batch is two images. If all its maps are position-only (batch 1: the same for
    every image), they are yielded once for all N images and no other image is run. Otherwise
    its maps' size sets the next batches' size so that one batch holds at most ``budget`` bytes
    of maps (and at most ``batch_size`` images). A model without
    attention maps raises ValueError, or with ``allow_empty`` yields nothing. Progress (images
    done) is shown as ``desc``.

    Args:
        model: a model whose forward takes ``return_attention=True``; set to eval mode.
        images: the (N, C, H, W) input, moved batch by batch to the model's device and cast to
            the dtype of its first floating-point parameter.
        batch_size: the most images in one batch.
        budget: the most bytes of attention maps in one batch.
        allow_empty: yield nothing (instead of raising) for a model without attention maps.
        desc: the progress bar's label.

    Yields:
        ``(start, stop, maps)``: the batch ``images[start:stop]`` and its maps (one
        ``AttentionMap`` per layer, on the CPU).

    Raises:
        ValueError: ``images`` is not 4-D, ``batch_size`` < 1, or the model returned no maps.
    """
    if images.dim() != 4:
        raise ValueError(f"images must have shape (N, C, H, W), got {tuple(images.shape)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    model.eval()
    dev = next(model.parameters(), images).device  # the images go where the model is
    floats = (p for p in model.parameters() if p.is_floating_point())
    dtype = next(floats, images).dtype  # ... in its dtype (a bf16 model takes bf16 images)
    bar = Progress(images.shape[0], desc, unit="img", logger=log, leave=False)
    start, b = 0, min(2, batch_size)
    try:
        while start < images.shape[0]:
            stop = min(start + b, images.shape[0])
            out = model(images[start:stop].to(dev, dtype), return_attention=True)
            pair = isinstance(out, tuple) and len(out) == 2
            maps = [as_map(m).to("cpu") for m in out[1]] if pair else []
            if not maps:
                if allow_empty:
                    return
                raise ValueError(f"{type(model).__name__} returned no attention maps")
            if start == 0 and stop > 1 and all(m.shape[0] == 1 for m in maps):
                stop = images.shape[0]  # position-only: these maps are every image's
            bar.update(stop - start)
            yield start, stop, maps
            if start == 0:  # size the next batches from the first image's maps
                per_image = sum(m.probs[:1].numel() * m.probs.element_size() for m in maps)
                b = max(1, min(batch_size, budget // max(per_image, 1)))
            start = stop
    finally:
        bar.close()


class MapAverage:
    """Running mean over images of the attention rows of chosen queries (None = all queries).

    ``result()`` -> list per layer of (Nh, Q, h*w) mean spatial probabilities (prefix keys dropped).
    Queries are (row, col) on the model grid and are scaled to each layer's grid.

    Args:
        grid: the model grid (h, w), in tokens.
        queries: the queries (row, col) on ``grid``; None for every query of each layer.
    """

    def __init__(self, grid: Grid, queries: Sequence[Sequence[int]] | None = None):
        self.grid = (int(grid[0]), int(grid[1]))
        self.queries = None if queries is None else [tuple(q) for q in queries]
        self.sums: list[torch.Tensor] | None = None
        self.grids: list[Grid] = []
        self.count = 0

    def update(self, maps: Sequence[AttentionMap], batch: int | None = None) -> None:
        """Add one batch's maps to the running mean.

        Args:
            maps: every layer's ``AttentionMap`` for a batch of images, input -> output.
            batch: the images the batch holds (a shared (1, Nh, T, T) map stands for them all);
                None: the largest batch size of the maps.
        """
        maps = [as_map(m) for m in maps]
        n = batch if batch is not None else max(m.shape[0] for m in maps)
        if self.sums is None:
            self.grids = [m.grid for m in maps]
            self.sums = [None] * len(maps)  # type: ignore[list-item]
        if len(maps) != len(self.sums):
            raise ValueError(f"expected {len(self.sums)} attention layers, got {len(maps)}")
        for i, m in enumerate(maps):
            k = m.num_prefix_tokens
            if self.queries is None:
                p = m.probs[:, :, k:, k:]
            else:
                rows = [m.query_index(*scale_query(q, self.grid, m.grid)) for q in self.queries]
                p = m.probs[:, :, rows, k:]
            s = p.detach().float().sum(0) * (n if m.shape[0] == 1 else 1)  # (Nh, Q, hw)
            self.sums[i] = s if self.sums[i] is None else self.sums[i] + s
        self.count += n

    def result(self) -> list[torch.Tensor]:
        """The mean over every image added so far.

        Returns:
            Per layer, (Nh, Q, h*w) mean probabilities of the Q queries over the layer's keys
            (prefix keys dropped; Q = h*w when every query is kept).
        """
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
