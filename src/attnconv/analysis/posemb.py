"""What ViT's embeddings learned (Dosovitskiy et al. 2021, fig. 7 left and centre).

- Position embeddings: cosine similarity between the embedding of each patch and those of all
  other patches, shown as an (h, w) grid of (h, w) maps (near patches, same row/column similar).
- Patch embedding: principal components of the RGB filters of the patch-embedding convolution
  (kernel = stride = P), the first 28 shown as P x P colour images.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .maps import Grid

_POS_NAMES = ("pos_embed", "pos_embedding", "position_embedding", "position_embeddings", "pos_emb")


def find_position_embedding(model: nn.Module) -> torch.Tensor | None:
    """The absolute position embedding (N, D) of ``model`` (learned or fixed), or None.

    A parameter or buffer whose last name component is one of the usual names (pos_embed, ...),
    of shape (1, N, D) or (N, D).
    """
    for name, p in [*model.named_parameters(), *model.named_buffers()]:
        if name.rsplit(".", 1)[-1] in _POS_NAMES and p.dim() in (2, 3):
            if p.dim() == 3 and p.shape[0] != 1:
                continue
            return p.detach().float().cpu().reshape(p.shape[-2], p.shape[-1])
    return None


def position_similarity(pos: torch.Tensor, grid: Grid, num_prefix_tokens: int = 0) -> torch.Tensor:
    """Cosine similarity (h, w, h, w) between the position embeddings of the grid's tokens.

    ``pos`` (N, D) with N = prefix + h*w (prefix embeddings, e.g. the class token's, are dropped).
    """
    h, w = grid
    if pos.dim() != 2 or pos.shape[0] != num_prefix_tokens + h * w:
        raise ValueError(
            f"position embedding of shape {tuple(pos.shape)} does not fit a {h}x{w} grid "
            f"with {num_prefix_tokens} prefix tokens"
        )
    e = torch.nn.functional.normalize(pos[num_prefix_tokens:].double(), dim=-1)  # (hw, D)
    return (e @ e.T).reshape(h, w, h, w).float()


def find_patch_embedding(model: nn.Module) -> nn.Conv2d | None:
    """The patch-embedding convolution: the first Conv2d on RGB input with kernel = stride > 1."""
    for m in model.modules():
        if (
            isinstance(m, nn.Conv2d)
            and m.in_channels == 3
            and m.kernel_size == m.stride
            and max(m.kernel_size) > 1
        ):
            return m
    return None


def patch_filter_pcs(weight: torch.Tensor, n: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """Principal components of patch-embedding filters.

    ``weight`` (D, C, P, Q): D filters. The filters, flattened and centred, are decomposed by SVD;
    returns (components (k, C, P, Q) unit norm, explained-variance ratios (k,)), k = min(n, rank
    bound), sorted by variance.
    """
    if weight.dim() != 4:
        raise ValueError(f"patch filters must have shape (D, C, P, Q), got {tuple(weight.shape)}")
    if n < 1:
        raise ValueError(f"number of principal components must be >= 1, got {n}")
    d = weight.shape[0]
    x = weight.detach().double().cpu().reshape(d, -1)
    x = x - x.mean(0, keepdim=True)
    _, s, vh = torch.linalg.svd(x, full_matrices=False)
    var = s**2
    ratio = var / var.sum().clamp_min(1e-300)
    k = min(n, vh.shape[0])
    return vh[:k].reshape(k, *weight.shape[1:]).float(), ratio[:k].float()
