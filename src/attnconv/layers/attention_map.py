"""One layer's attention probabilities together with the token grid they live on.

Every model's ``forward(x, return_attention=True)`` returns ``(logits, maps)`` with ``maps`` a
list of ``AttentionMap`` (input -> output order), so that analysis never has to guess where a
token sits: ``probs`` (B or 1, Nh, T, T) are softmax rows (queries) over keys, T =
``num_prefix_tokens`` + h * w, the prefix tokens (a ViT's class or distillation token) first and
the h x w spatial tokens after them in row-major order. A batch dimension of 1 means the map is
shared by every image of the batch (position-only attention).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Grid = tuple[int, int]


@dataclass(frozen=True)
class AttentionMap:
    """One layer's attention probabilities and the token grid they live on (validated).

    Args:
        probs: (B or 1, Nh, T, T) softmax rows (queries) over keys, T = num_prefix_tokens + h*w.
        grid: (h, w) of the spatial tokens, row-major after the prefix tokens.
        num_prefix_tokens: tokens before the grid (a ViT's class or distillation token).
        queries: (h*w,) bool, the spatial queries whose output the layer keeps (a converted
            strided or unpadded convolution outputs only some); None: every one.
    """

    probs: torch.Tensor  # (B or 1, Nh, T, T), T = num_prefix_tokens + h*w
    grid: Grid  # (h, w) of the spatial tokens, row-major
    num_prefix_tokens: int = 0
    queries: torch.Tensor | None = None  # (h*w,) bool: the queries output; None: all

    def __post_init__(self) -> None:
        p = self.probs
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"AttentionMap.probs must be a torch.Tensor, got {type(p).__name__}")
        if p.dim() != 4 or p.shape[-1] != p.shape[-2]:
            raise ValueError(f"AttentionMap.probs must be (B, Nh, T, T), got {tuple(p.shape)}")
        h, w = (int(s) for s in self.grid)
        object.__setattr__(self, "grid", (h, w))
        n = int(self.num_prefix_tokens)
        if h < 1 or w < 1 or n < 0 or p.shape[-1] != n + h * w:
            raise ValueError(
                f"AttentionMap of {p.shape[-1]} tokens does not fit a {h}x{w} grid with "
                f"{n} prefix tokens"
            )
        q = self.queries
        if q is not None and not (
            isinstance(q, torch.Tensor) and q.dtype == torch.bool and q.shape == (h * w,)
        ):
            raise ValueError(f"AttentionMap.queries must be a ({h * w},) bool tensor or None")

    @property
    def shape(self) -> torch.Size:
        return self.probs.shape

    @property
    def num_heads(self) -> int:
        return self.probs.shape[1]

    def spatial(self, renormalize: bool = False) -> torch.Tensor:
        """(B, Nh, hw, hw) float32, prefix tokens dropped (rows renormalized if asked)."""
        n = self.num_prefix_tokens
        p = self.probs.detach()[..., n:, n:].float()
        if renormalize:
            p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
        return p

    def output_rows(self) -> torch.Tensor:
        """(B, Nh, hw, hw) spatial probabilities, prefix tokens dropped and the rows of queries
        the layer does not output zeroed (the statistics leave empty rows out)."""
        n = self.num_prefix_tokens
        p = self.probs.detach()[..., n:, n:]
        return p if self.queries is None else p * self.queries.to(p.device, p.dtype)[:, None]

    def query_index(self, row: int, col: int) -> int:
        """Token index of the spatial query (row, col) of this map's grid."""
        h, w = self.grid
        if not (0 <= row < h and 0 <= col < w):
            raise ValueError(f"query ({row}, {col}) is outside the token grid {self.grid}")
        return self.num_prefix_tokens + row * w + col

    def query_row(self, row: int, col: int) -> torch.Tensor:
        """(B, Nh, h, w) float32: the attention of query (row, col) over the spatial keys."""
        n = self.num_prefix_tokens
        p = self.probs.detach()[:, :, self.query_index(row, col), n:].float()  # (B, Nh, hw)
        return p.reshape(*p.shape[:2], *self.grid)

    def image(self, index: int) -> AttentionMap:
        """The map of one batch element, as a batch of 1 (a shared map, batch 1: itself for every
        image); a negative index counts from the end."""
        b = self.probs.shape[0]
        if b > 1 and not -b <= index < b:  # a slice would give an empty map
            raise ValueError(f"image index {index} is outside the batch of {b} maps")
        i = index % b  # shared (b == 1): every image's map is the one
        probs = self.probs[i : i + 1]
        return AttentionMap(probs, self.grid, self.num_prefix_tokens, self.queries)

    def to(self, *args, **kwargs) -> AttentionMap:
        probs = self.probs.to(*args, **kwargs)
        return AttentionMap(probs, self.grid, self.num_prefix_tokens, self.queries)
