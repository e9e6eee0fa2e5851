"""How much each head behaves like one tap of a convolution (Cordonnier et al. 2020, Lemma 1).

Lemma 1: a layer whose Nh = K^2 heads each put all their mass on the pixel q + f(h), with f a
bijection onto the shifts of a K x K kernel, computes exactly a K x K convolution. Per head we
measure, over every query q of every image:

- ``offset``: the head's modal relative offset Delta = k* - q, where k* = argmax_k p(q, k);
- ``score``: the mean attention mass p(q, q + Delta) on that single offset (1.0 = hard head);
- ``stability``: the share of (image, query) pairs whose most attended offset is Delta;
- ``peak``: the mean of max_k p(q, k), whatever its offset.

Queries for which q + Delta falls outside the image (where a zero-padded convolution reads
padding) are left out of ``score`` and ``stability``, as are the queries a layer does not
output (``AttentionMap.queries``: a converted strided or unpadded convolution's). A query row
with no spatial mass at all (a converted conv's query whose only tap is in the padding) has no
maximum: it casts no vote for the modal offset and is left out of ``stability`` and ``peak``.
Mass on prefix tokens (the class token) counts in the denominator: it is mass not spent on any
offset. A layer of hard heads whose offsets fill a K x K grid scores exactly 1.0 and reports
``kernel = K``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from attnconv.layers.attention_map import AttentionMap

from .maps import Grid, as_map


def offset_index(grid: Grid) -> torch.Tensor:
    """(hw, hw) index of the offset k - q in the (2h-1) x (2w-1) offset table, row-major."""
    h, w = grid
    r = torch.arange(h).repeat_interleave(w)
    c = torch.arange(w).repeat(h)
    dr = r[None, :] - r[:, None] + (h - 1)
    dc = c[None, :] - c[:, None] + (w - 1)
    return dr * (2 * w - 1) + dc


def offset_of(index: int, grid: Grid) -> tuple[int, int]:
    h, w = grid
    return (index // (2 * w - 1) - (h - 1), index % (2 * w - 1) - (w - 1))


@dataclass
class LayerConvLikeness:
    """Conv-likeness of one layer; per-head lists, ``score`` = mean of the heads' scores."""

    grid: Grid
    offsets: list[tuple[int, int]]
    head_scores: list[float]
    stability: list[float]
    peak: list[float]
    score: float = 0.0
    distinct: bool = False
    kernel: int = 0  # K if the modal offsets fill a K x K grid (one head per shift), else 0
    dilation: int = 0
    extra: dict = field(default_factory=dict)


def kernel_of(offsets: list[tuple[int, int]]) -> tuple[int, int]:
    """(K, dilation) if ``offsets`` are the shifts of a K x K (dilated) kernel; else (0, 0)."""
    n = len(offsets)
    k = math.isqrt(n)
    if k * k != n or len(set(offsets)) != n:
        return (0, 0)
    rows = sorted({o[0] for o in offsets})
    cols = sorted({o[1] for o in offsets})
    if len(rows) != k or len(cols) != k:
        return (0, 0)
    if k == 1:
        return (1, 1)
    step = rows[1] - rows[0]
    ok = all(b - a == step for a, b in zip(rows, rows[1:])) and all(
        b - a == step for a, b in zip(cols, cols[1:])
    )
    return (k, step) if ok else (0, 0)


class ConvLikeness:
    """Accumulates one layer's ``AttentionMap`` over batches; then ``result()``.

    Takes no arguments: the layer's grid is read from the first map ``update`` gets.
    """

    def __init__(self) -> None:
        self.lgrid: Grid | None = None
        self.queries: torch.Tensor | None = None  # (hw,) bool: the queries the layer outputs
        self.mass: torch.Tensor | None = None  # (Nh, n_offsets) summed p(q, q + o)
        self.argmax: list[torch.Tensor] = []  # (B, Nh, hw) offset of each row's max; -1 empty
        self.peak_sum: torch.Tensor | None = None  # (Nh,) summed max over non-empty rows
        self.peak_rows: torch.Tensor | None = None  # (Nh,) number of non-empty rows summed
        self.count = 0

    def update(self, attn: AttentionMap, batch: int | None = None) -> None:
        """Add one batch's maps (every one on the same grid as the first).

        Args:
            attn: one layer's ``AttentionMap`` for a batch of images.
            batch: the images a shared (1, Nh, T, T) map (position-only attention) stands for;
                None: the map's own batch size.
        """
        attn = as_map(attn)
        if self.lgrid is None:
            self.lgrid = attn.grid
            self.oidx = offset_index(self.lgrid)  # (hw, hw)
            self.queries = attn.queries  # the queries the layer outputs (None: all)
        elif attn.grid != self.lgrid:
            raise ValueError(f"attention on a {attn.grid} grid after maps on {self.lgrid}")
        n = batch if (batch is not None and attn.shape[0] == 1) else attn.shape[0]
        w = n / attn.shape[0]  # a shared (1, ...) map stands for n images
        p = attn.output_rows()  # (B, Nh, hw, hw), queries the layer does not output: empty
        nh = p.shape[1]
        h, wd = self.lgrid
        mass = torch.zeros(nh, (2 * h - 1) * (2 * wd - 1), dtype=torch.float64)
        psum = p.sum(0, dtype=torch.float64).reshape(nh, -1)  # summed over images
        mass.index_add_(1, self.oidx.reshape(-1), psum * w)
        self.mass = mass if self.mass is None else self.mass + mass
        top, arg = p.max(-1)  # (B, Nh, hw)
        off = self.oidx[torch.arange(p.shape[-2]), arg]  # offset index of each row's maximum
        full = p.sum(-1) > 0  # (B, Nh, hw) rows with spatial mass; an all-zero row has no max
        off = torch.where(full, off, -1)  # empty rows vote for no offset
        self.argmax.append(off.expand(n, -1, -1) if off.shape[0] != n else off)
        peak = (top.double() * full).sum((0, 2)) * w
        rows = full.sum((0, 2)).double() * w
        self.peak_sum = peak if self.peak_sum is None else self.peak_sum + peak
        self.peak_rows = rows if self.peak_rows is None else self.peak_rows + rows
        self.count += n

    def result(self) -> LayerConvLikeness:
        """The layer's conv-likeness over every image added so far.

        Returns:
            Per head its modal offset, score, stability and peak; the layer's mean score, and
            ``kernel`` K when the modal offsets fill a K x K grid (else 0).
        """
        if not self.count:
            raise ValueError("no attention maps were accumulated")
        h, w = self.lgrid
        arg = torch.cat(self.argmax, 0)  # (N, Nh, hw)
        nh = arg.shape[1]
        qr = torch.arange(h).repeat_interleave(w)
        qc = torch.arange(w).repeat(h)
        offsets, scores, stab = [], [], []
        centre = (h - 1) * (2 * w - 1) + (w - 1)  # offset (0, 0): a head without votes
        for hd in range(nh):
            votes = arg[:, hd].reshape(-1)
            votes = votes[votes >= 0]  # empty rows (-1) cast no vote
            modal = int(torch.bincount(votes).argmax()) if votes.numel() else centre
            dr, dc = offset_of(modal, (h, w))
            inside = (qr + dr >= 0) & (qr + dr < h) & (qc + dc >= 0) & (qc + dc < w)  # (hw,)
            if self.queries is not None:  # a strided / unpadded conv's output queries only
                inside &= self.queries.cpu()
            n_valid = int(inside.sum()) * self.count
            offsets.append((dr, dc))
            scores.append(float(self.mass[hd, modal]) / n_valid)
            a = arg[:, hd][:, inside]
            stab.append(float((a == modal).sum()) / max(int((a >= 0).sum()), 1))
        peak = (self.peak_sum / self.peak_rows.clamp_min(1)).tolist()  # over non-empty rows
        k, dil = kernel_of(offsets)
        return LayerConvLikeness(
            grid=(h, w),
            offsets=offsets,
            head_scores=scores,
            stability=stab,
            peak=peak,
            score=sum(scores) / nh,
            distinct=len(set(offsets)) == nh,
            kernel=k,
            dilation=dil,
        )


def conv_likeness(
    attn: AttentionMap | torch.Tensor, grid: Grid | None = None, *, num_prefix_tokens: int = 0
) -> LayerConvLikeness:
    """Conv-likeness of one layer's ``AttentionMap`` (a bare (B, Nh, T, T) tensor must be on
    ``grid`` after its prefix tokens)."""
    acc = ConvLikeness()
    acc.update(as_map(attn, grid, num_prefix_tokens))
    return acc.result()
