"""Content attention with row/column positional logits through PyTorch's FlexAttention
(torch.nn.attention.flex_attention; Dong et al. 2024), the GPU backend of the folded path.

The folded path (mhsa2d.py) gives each query its row logits and column logits against every key
row and column, q_axis (B, Nh, T, H + W), met by one-hot key rows/columns (quadratic eq. 9 of
Cordonnier et al. 2020: R[q1, k1] = -alpha (k1 - q1 - Delta1)^2, likewise C; learned relative,
sec. 4.3: the query's scores against the row/column tables). Flex adds them as a score_mod,

    logits[b, h, q, k] = scale q.k + q_axis[b, h, q, k // W] + q_axis[b, h, q, H + k % W],

with no extra head width and no (T, T) tensor. Eager on CPU (forward only, slow: for tests);
compiled on CUDA, whose kernels need head widths of at least MIN_HEAD_DIM: narrower q, k, v are
zero-padded (q.k and the values' first columns are unchanged).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..encodings.terms import isotropic_energy
from ..first_order import compiling

MIN_HEAD_DIM = 16  # compiled FlexAttention: "embedding dimension ... must be at least 16"


def _flex(q, k, v, *, compiled: bool, **kwargs) -> torch.Tensor:
    """flex_attention on q, k (B, Nh, T, dk), v (B, Nh, T, dv), zero-padded to MIN_HEAD_DIM."""
    from torch.nn.attention.flex_attention import flex_attention

    dk, dv = q.shape[-1], v.shape[-1]
    if dk < MIN_HEAD_DIM:  # zero columns add nothing to q.k
        q, k = F.pad(q, (0, MIN_HEAD_DIM - dk)), F.pad(k, (0, MIN_HEAD_DIM - dk))
    if dv < MIN_HEAD_DIM:  # zero value columns, dropped below
        v = F.pad(v, (0, MIN_HEAD_DIM - dv))
    # inside a torch.compile'd model the outer compile compiles Flex itself
    fn = _compiled_flex() if compiled and not compiling() else flex_attention
    return fn(q, k, v, **kwargs)[..., :dv]


def axis_score_mod(q_axis: torch.Tensor, h: int, w: int):
    """score_mod adding a query's row logit for the key's row and column logit for its column,
    q_axis (B|1, Nh, T, h + w). Split into two tensors, each indexed once: compiled Flex cannot
    differentiate a captured tensor that a score_mod indexes twice."""
    q_row, q_col = q_axis[..., :h].contiguous(), q_axis[..., h:].contiguous()  # R, C

    def score_mod(score, b, head, q_idx, k_idx):
        return score + q_row[b, head, q_idx, k_idx // w] + q_col[b, head, q_idx, k_idx % w]

    return score_mod


def gaussian_score_mod(alpha: torch.Tensor, centers: torch.Tensor, w: int):
    """score_mod adding the quadratic encoding's logit (Cordonnier et al. eq. 9)
    -alpha_h ((k1 - q1 - Delta_h1)^2 + (k2 - q2 - Delta_h2)^2), computed from the pair's pixel
    offset in float32. alpha (Nh,), centers (Nh, 2) = Delta (row, col)."""
    c_row, c_col = centers[:, 0].contiguous(), centers[:, 1].contiguous()
    dtype = alpha.dtype

    def score_mod(score, b, head, q_idx, k_idx):
        d1 = (k_idx // w - q_idx // w).to(dtype) - c_row[head]
        d2 = (k_idx % w - q_idx % w).to(dtype) - c_col[head]
        return score - isotropic_energy(alpha[head], d1, d2)

    return score_mod


def flex_axis_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_axis: torch.Tensor,
    h: int,
    w: int,
    scale: float,
    *,
    compiled: bool = False,
) -> torch.Tensor:
    """softmax(scale q k^T + R[q1, k1] + C[q2, k2]) v. q, k (B, Nh, T, dk), v (B, Nh, T, dv),
    q_axis (B, Nh, T, h + w) -> (B, Nh, T, dv)."""
    if q_axis.shape[-1] != h + w or q_axis.shape[-2] != h * w:
        raise ValueError(f"q_axis {tuple(q_axis.shape)} must be (B, Nh, T={h * w}, H+W={h + w})")
    score_mod = axis_score_mod(q_axis, h, w)
    return _flex(q, k, v, compiled=compiled, score_mod=score_mod, scale=scale)


def flex_mod_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    score_mod,
    scale: float,
    *,
    compiled: bool = False,
) -> torch.Tensor:
    """softmax(scale q k^T + score_mod) v, q, k (B, Nh, T, dk), v (B, Nh, T, dv) -> (B, Nh,
    T, dv); score_mod from an encoding's ``flex_score_mod``."""
    return _flex(q, k, v, compiled=compiled, score_mod=score_mod, scale=scale)


_COMPILED = None


def _compiled_flex():
    global _COMPILED
    if _COMPILED is None:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED = torch.compile(flex_attention, dynamic=False)
    return _COMPILED


@functools.lru_cache(maxsize=64)
def window_block_mask(kernel_size: int, h: int, w: int, device: str):
    """The k x k window of every query pixel as a Flex BlockMask over (T, T), T = h*w; keys
    outside the image do not exist. Built once per shape and device (cached)."""
    from torch.nn.attention.flex_attention import create_block_mask

    from .window import window_pad

    before, after = window_pad(kernel_size)

    def mask_mod(bi, head, q_idx, k_idx):
        di, dj = k_idx // w - q_idx // w, k_idx % w - q_idx % w
        return (di >= -before) & (di <= after) & (dj >= -before) & (dj <= after)

    return create_block_mask(mask_mod, None, None, h * w, h * w, device=device)


def flex_local_attention(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor,
    kernel_size: int,
    qr_row: torch.Tensor | None = None,
    qr_col: torch.Tensor | None = None,
    *,
    compiled: bool = False,
) -> torch.Tensor:
    """SASA window attention (Ramachandran et al. 2019, eq. 2-3; padding="mask") through Flex:
    a block mask for the k x k window (keys outside the image simply do not exist), the
    relative logits q . r_{a-i,b-j} as a score_mod. q (already scaled), k (B, nh, d, H, W) or
    None, v (B, nh, d, H, W), qr_row/qr_col (B, nh, k, H, W) -> (B, nh, d, H, W)."""
    from .window import window_pad

    b, nh, d, h, w = q.shape
    before, after = window_pad(kernel_size)

    def seq(t):  # (B, nh, c, H, W) -> (B, nh, T, c)
        return t.flatten(3).transpose(-1, -2)

    def offsets(q_idx, k_idx):
        return k_idx // w - q_idx // w, k_idx % w - q_idx % w

    score_mod = None
    if qr_row is not None:
        rr, rc = seq(qr_row), seq(qr_col)  # (B, nh, T, k)

        def score_mod(score, bi, head, q_idx, k_idx):
            di, dj = offsets(q_idx, k_idx)
            di = torch.clamp(di + before, 0, kernel_size - 1)  # masked pairs: any valid index
            dj = torch.clamp(dj + before, 0, kernel_size - 1)
            return score + rr[bi, head, q_idx, di] + rc[bi, head, q_idx, dj]

    qs, vs = seq(q), seq(v)
    ks = seq(k) if k is not None else torch.zeros_like(qs)
    # traced: built in the graph (Dynamo would warn of the cache it skips)
    block_mask = window_block_mask.__wrapped__ if compiling() else window_block_mask
    mask = block_mask(kernel_size, h, w, str(q.device))
    y = _flex(qs, ks, vs, compiled=compiled, score_mod=score_mod, block_mask=mask, scale=1.0)
    return y.transpose(-1, -2).reshape(b, nh, -1, h, w)
