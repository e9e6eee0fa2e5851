"""Fast kernels for position-only attention whose logits split into a row and a column term.

If logits(q, k) = a_h(q1, k1) + b_h(q2, k2) (quadratic encoding eq. 9 with isotropic or diagonal
precision: -alpha (d1 - D1)^2 - alpha (d2 - D2)^2; learned relative row + column tables), then
softmax over the H*W keys factorizes, normalizer included:

    P_h[(q1, q2), (k1, k2)] = R_h[q1, k1] * C_h[q2, k2]
    R_h = softmax over k1 of a_h,  C_h = softmax over k2 of b_h

so attention is a row operator then a column operator, O(HW(H+W)) per channel, never T x T.
Each softmax runs over one axis in float32 with its row max subtracted (log-space), so alpha up
to 1e4 and centres far outside the image stay finite.

The alpha -> infinity limit (Lemma 2) is a shift: head h reads pixel clamp(q + round(Delta_h))
per axis, a gather.
"""

from __future__ import annotations

import torch


def axis_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Row-wise softmax in at least float32 (bfloat16 logits lose the max subtraction)."""
    dt = torch.promote_types(logits.dtype, torch.float32)
    return torch.softmax(logits, dim=-1, dtype=dt)


def separable_attention(
    v: torch.Tensor, row_logits: torch.Tensor, col_logits: torch.Tensor
) -> torch.Tensor:
    """y[b, i, j, h] = sum_{k, l} R_h[i, k] C_h[j, l] v[b, k, l, h].

    v (B, H, W, Nh or 1, D) (1: every head reads the same values, the reference code's layout),
    row_logits (Nh, H, H) [query row, key row], col_logits (Nh, W, W) -> (B, H, W, Nh, D).
    """
    r = axis_softmax(row_logits).to(v.dtype)  # (Nh, H, H)
    c = axis_softmax(col_logits).to(v.dtype)  # (Nh, W, W)
    if v.shape[3] == 1:
        y = torch.einsum("hik,bkld->bilhd", r, v[:, :, :, 0])  # (B, H, W, Nh, D) row operator
    else:
        y = torch.einsum("hik,bklhd->bilhd", r, v)  # (B, H, W, Nh, D) row operator
    return torch.einsum("hjl,bilhd->bijhd", c, y)  # column operator


def separable_probs(row_logits: torch.Tensor, col_logits: torch.Tensor) -> torch.Tensor:
    """The dense (Nh, T, T) probabilities R_h (x) C_h (for return_attention and tests)."""
    r, c = axis_softmax(row_logits), axis_softmax(col_logits)
    nh, h, w = r.shape[0], r.shape[1], c.shape[1]
    p = r[:, :, None, :, None] * c[:, None, :, None, :]  # (Nh, H, W, H, W)
    return p.reshape(nh, h * w, h * w)


def shift_gather(v: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Hard attention: y[b, i, j, h] = v[b, rows[h, i], cols[h, j], h].

    v (B, H, W, Nh or 1, D), rows (Nh, H), cols (Nh, W) long -> (B, H, W, Nh, D).
    """
    nh = rows.shape[0]
    ri = rows.t()[:, None, :]  # (H, 1, Nh)
    ci = cols.t()[None, :, :]  # (1, W, Nh)
    if v.shape[3] == 1:
        hi = torch.zeros(1, 1, nh, dtype=torch.long, device=v.device)
    else:
        hi = torch.arange(nh, device=v.device)[None, None, :]  # (1, 1, Nh)
    return v[:, ri, ci, hi]  # (B, H, W, Nh, D)
