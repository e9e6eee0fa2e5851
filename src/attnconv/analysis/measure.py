"""``measure_model``: everything ``attnconv analyze`` reports, as typed data (no file written).

One pass over N test images accumulates the attention of the query token (one image and the
average), the mean attention distance per head (ViT fig. 7 right) and conv-likeness per head
(Cordonnier Lemma 1); then the model's own parameters give the head centres, grid scores, the
position-embedding similarity and the patch-filter components (ViT fig. 7). ``report.py`` renders
an ``AttentionAnalysis`` to PNG / markdown / HTML / JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from attnconv.layers.attention_map import Grid

from .centers import head_centers
from .convlike import ConvLikeness, LayerConvLikeness
from .distance import MeanDistance, pixel_distances
from .explorer import normalize
from .grid import GridScore, grid_scores
from .maps import MapAverage, iter_attention, layer_names, query_maps
from .posemb import (
    find_patch_embedding,
    find_position_embedding,
    patch_filter_pcs,
    position_similarity,
)


@dataclass
class AttentionAnalysis:
    """What one analysis measured; every field a figure or a table is drawn from."""

    images: int
    image_size: Grid  # (H, W) pixels
    grid: Grid  # the model's token grid (``attention_grid``)
    num_prefix_tokens: int
    query_pixel: Grid
    query_token: Grid  # the query on ``grid``
    layer_grids: list[Grid] = field(default_factory=list)  # each attention layer's own grid
    layer_names: list[str] = field(default_factory=list)  # maps.layer_names: module names or N
    single: list[torch.Tensor] | None = None  # per layer (Nh, h, w): one image, query's row
    average: list[torch.Tensor] | None = None  # per layer (Nh, h, w): averaged over the images
    mean_distance: list[torch.Tensor] = field(default_factory=list)  # per layer (Nh,) pixels
    uniform_distance: float | None = None  # a uniform head's mean distance, pixels
    conv_likeness: list[LayerConvLikeness] = field(default_factory=list)
    centers: list[torch.Tensor] = field(default_factory=list)  # per quadratic layer (Nh, 2)
    grid_scores: list[GridScore] = field(default_factory=list)
    position_similarity: torch.Tensor | None = None  # (h, w, h, w) cosine similarities
    patch_pcs: torch.Tensor | None = None  # (K, 3, P, P) principal filters
    patch_pc_variance: torch.Tensor | None = None  # (K,) explained variance ratios
    # the maps are position-only: a batch of several images gave shared (batch 1) maps; one
    # image alone cannot tell (its maps have batch 1 either way): False
    shared: bool = False

    @property
    def has_attention(self) -> bool:
        return self.single is not None


@torch.no_grad()
def measure_model(
    model: nn.Module,
    images: torch.Tensor,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    query: Sequence[int] | None = None,
    image_index: int = 0,
    batch_size: int = 25,
) -> AttentionAnalysis:
    """Measure ``model`` on ``images`` (uint8 (N, 3, H, W)); ``query`` a pixel (row, col) of the
    image (default: the centre), ``image_index`` the image of the single-image maps."""
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(
            f"images must be uint8 (N, 3, H, W), got {images.dtype} {tuple(images.shape)}"
        )
    n, _, H, W = images.shape
    if not 0 <= image_index < n:
        raise ValueError(f"--image {image_index} is out of range for {n} images")
    q = (H // 2, W // 2) if query is None else (int(query[0]), int(query[1]))
    if not (0 <= q[0] < H and 0 <= q[1] < W):
        raise ValueError(f"query pixel {q} is outside the {H}x{W} image")
    grid = tuple(int(g) for g in getattr(model, "attention_grid", (H, W)))
    prefix = int(getattr(model, "num_prefix_tokens", 0))
    qtok = (q[0] * grid[0] // H, q[1] * grid[1] // W)
    ppt = (H / grid[0], W / grid[1])  # image pixels per token
    res = AttentionAnalysis(int(n), (int(H), int(W)), grid, prefix, q, qtok)

    avg = MapAverage(grid, queries=[qtok])
    dist: list[MeanDistance] = []
    conv: list[ConvLikeness] = []
    x = normalize(images, mean, std)
    for seen, stop, maps in iter_attention(model, x, batch_size, allow_empty=True, desc="analyze"):
        b = stop - seen  # no attention maps (a CNN): no batches, only the embedding figures
        if not dist:
            dist = [MeanDistance(grid, ppt) for _ in maps]
            conv = [ConvLikeness() for _ in maps]
        avg.update(maps, batch=b)
        res.shared = res.shared or (b > 1 and all(m.shape[0] == 1 for m in maps))
        for m, d, c in zip(maps, dist, conv):
            d.update(m, batch=b)
            c.update(m, batch=b)
        if seen <= image_index < stop:
            res.single = query_maps(maps, grid, qtok, image=image_index - seen)
    if res.single is not None:
        res.layer_grids = list(avg.grids)
        res.layer_names = layer_names(model, len(avg.grids))
        res.average = [m[:, 0].reshape(-1, *g) for m, g in zip(avg.result(), avg.grids)]
        res.mean_distance = [d.result() for d in dist]
        res.uniform_distance = float(pixel_distances(grid, ppt).mean())
        res.conv_likeness = [c.result() for c in conv]
    res.centers = head_centers(model)
    res.grid_scores = grid_scores(model, grid)
    pos = find_position_embedding(model)
    # a converted ViT's view (analysis/converted.py): the ViT's own token grid and prefix
    pgrid, pprefix = getattr(model, "position_tokens", (grid, prefix))
    if pos is not None and pos.shape[0] == pprefix + pgrid[0] * pgrid[1]:
        res.position_similarity = position_similarity(pos, pgrid, pprefix)
    pe = find_patch_embedding(model)
    if pe is not None:
        res.patch_pcs, res.patch_pc_variance = patch_filter_pcs(pe.weight, 28)
    return res
