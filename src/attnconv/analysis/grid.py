"""Grid score of quadratic layers: do the heads sit on the integer offsets of a convolution
kernel (Cordonnier et al. 2020, Theorem 1 and fig. 3)?

A head is *sharp* when it puts more than half of its mass on one key for a query in the middle
of the image (alpha large enough: Lemma 2's hard head is the limit); its offset is that key's
position minus the query's. A layer's score counts the *distinct* offsets of sharp heads inside
the 3x3 (out of 9) and the 5x5 (out of 25) neighbourhood: a layer that became a 3x3
convolution's attention scores 9/9.

``grid_travel``: how far the centres Delta still are from such a layer, the mean distance each
head must move to sit on its own offset of the k x k kernel (the best assignment of heads to
offsets, as Theorem 1 places Nh = k^2 heads).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn

from ..layers.mhsa2d import MultiHeadSelfAttention2d

SHARP = 0.5  # a head is sharp when its top key holds more than this share of its mass


@dataclass
class GridScore:
    peak_mass: list[float]  # per head, the top key's probability
    offsets: list[list[int]]  # per head, (row, col) of its top key relative to the query
    sharp_heads: int
    grid3: int  # distinct offsets of sharp heads with max(|row|, |col|) <= 1 (of 9)
    grid5: int  # ... <= 2 (of 25)

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def middle_query_probs(layer: MultiHeadSelfAttention2d, h: int, w: int) -> torch.Tensor:
    """(Nh, T) attention of the query in the middle of an h x w grid, for a position-only layer
    (its input does not matter: zeros)."""
    dt, dev = layer.out_proj.weight.dtype, layer.out_proj.weight.device
    x = torch.zeros(1, layer.in_channels, h, w, dtype=dt, device=dev)
    return layer.attention_probs(x)[0, :, (h // 2) * w + w // 2]


@torch.no_grad()
def layer_grid_score(layer: MultiHeadSelfAttention2d, h: int, w: int) -> GridScore:
    """Grid score of one position-only quadratic layer on an h x w grid (query at the middle)."""
    qr, qc = h // 2, w // 2
    probs = middle_query_probs(layer, h, w).float()  # (Nh, T)
    peak, idx = probs.max(-1)
    offsets = [[int(i) // w - qr, int(i) % w - qc] for i in idx]
    sharp = {tuple(o) for o, p in zip(offsets, peak.tolist()) if p > SHARP}
    return GridScore(
        peak_mass=[round(p, 4) for p in peak.tolist()],
        offsets=offsets,
        sharp_heads=int((peak > SHARP).sum()),
        grid3=sum(max(abs(r), abs(c)) <= 1 for r, c in sharp),
        grid5=sum(max(abs(r), abs(c)) <= 2 for r, c in sharp),
    )


def grid_scores(model: nn.Module, grid: tuple[int, int]) -> list[GridScore]:
    """Per position-only quadratic layer of ``model`` (input -> output), its grid score on the
    model's token grid; [] for a model without such layers."""
    return [
        layer_grid_score(m, *grid)
        for m in model.modules()
        if isinstance(m, MultiHeadSelfAttention2d)
        and hasattr(m.positional_encoding, "centers")  # Gaussian heads
        and not m.content
    ]


def grid_travel(centers: torch.Tensor, k: int = 3) -> float:
    """Mean distance (tokens) the heads' centres ``centers`` (Nh, 2), (row, col), must travel
    to sit on distinct offsets of the k x k kernel around the query, under the assignment of
    heads to offsets that minimises the total (exact: dynamic programming over the sets of
    offsets taken; Nh <= k^2 <= 16)."""
    if centers.dim() != 2 or centers.shape[1] != 2:
        raise ValueError(f"centers must be (Nh, 2), got {tuple(centers.shape)}")
    n, r = centers.shape[0], k // 2
    if k % 2 == 0 or k * k > 16 or not 0 < n <= k * k:
        raise ValueError(
            f"grid_travel needs odd k with k^2 <= 16 and 1..k^2 heads, got k={k}, {n} heads"
        )
    offs = torch.tensor(
        [[i, j] for i in range(-r, r + 1) for j in range(-r, r + 1)], dtype=torch.float64
    )
    cost = torch.cdist(centers.double(), offs).tolist()  # (Nh, k^2)
    best = {0: 0.0}  # set of offsets taken by heads 0..h-1 -> least total distance
    for h in range(n):
        nxt: dict[int, float] = {}
        for taken, total in best.items():
            for o in range(k * k):
                if not taken >> o & 1:
                    key, val = taken | 1 << o, total + cost[h][o]
                    if val < nxt.get(key, float("inf")):
                        nxt[key] = val
        best = nxt
    return min(best.values()) / n
