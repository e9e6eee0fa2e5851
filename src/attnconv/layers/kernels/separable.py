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
import torch.nn.functional as F

from ..precision import softmax_f32

axis_softmax = softmax_f32  # row-wise, in at least float32


def head_major(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, num_heads: int
) -> torch.Tensor:
    """NCHW input -> values in the head-major layout (Nh, D, H, B, W) that lets both axis operators
    run as plain batched matmuls. Wval X + b runs as a 1x1 convolution on the NCHW input (oneDNN
    on CPU), with no layout copy of the input.
    weight None: the raw input is every head's value (value="identity") -> (1, C, H, B, W).
    Returns a permuted view; the row operator makes it contiguous."""
    b, c, h, w = x.shape
    if weight is not None:
        x = F.conv2d(x, weight[:, :, None, None], bias)  # (B, Nh*D, H, W)
    return x.view(b, num_heads if weight is not None else 1, -1, h, w).permute(1, 2, 3, 0, 4)


def head_major_output(y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """(Nh, D, H, B, W) -> Wout concat_h(y_h) + bout as NCHW (B, Cout, H, W), a 1x1 convolution."""
    nh, d, h, b, w = y.shape
    # (B, Nh, D, H, W) copied, then Nh and D merged: merging them before the copy makes torch
    # 2.11's export guard Min(1156 B, 3468 B) == 1156 B on a dynamic batch, and fail on it
    y = y.permute(3, 0, 1, 2, 4).contiguous().view(b, nh * d, h, w)  # (B, Nh*D, H, W)
    return F.conv2d(y, weight[:, :, None, None], bias)


def separable_attention(
    v: torch.Tensor, row_logits: torch.Tensor, col_logits: torch.Tensor
) -> torch.Tensor:
    """y[h, :, i, b, j] = sum_{k, l} R_h[i, k] C_h[j, l] v[h, :, k, b, l].

    v (Nh or 1, D, H, B, W) (1: every head reads the same values), row_logits (Nh, H, H)
    [query row, key row], col_logits (Nh, W, W) -> (Nh, D, H, B, W).
    """
    r = axis_softmax(row_logits).to(v.dtype)  # (Nh, H, H)
    c = axis_softmax(col_logits).to(v.dtype)  # (Nh, W, W)
    nh, (_, d, h, b, w) = r.shape[0], v.shape
    y = torch.matmul(r[:, None], v.reshape(-1, d, h, b * w))  # (Nh, D, H, B*W) row operator
    y = torch.matmul(y.reshape(nh, d * h * b, w), c.transpose(1, 2))  # column operator
    return y.view(nh, d, h, b, w)


def separable_probs(row_logits: torch.Tensor, col_logits: torch.Tensor) -> torch.Tensor:
    """The dense (Nh, T, T) probabilities R_h (x) C_h (for return_attention and tests)."""
    return outer_probs(axis_softmax(row_logits), axis_softmax(col_logits))


def outer_probs(r: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Row (Nh, H, H) and column (Nh, W, W) operators -> dense (Nh, H*W, H*W) R_h (x) C_h."""
    nh, h, w = r.shape[0], r.shape[1], c.shape[1]
    p = r[:, :, None, :, None] * c[:, None, :, None, :]  # (Nh, H, W, H, W)
    return p.reshape(nh, h * w, h * w)


def shift_gather(v: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Hard attention: y[h, :, i, b, j] = v[h, :, rows[h, i], b, cols[h, j]].

    v (Nh or 1, D, H, B, W), rows (Nh, H), cols (Nh, W) long -> (Nh, D, H, B, W).
    """
    heads = [
        v[h if v.shape[0] > 1 else 0].index_select(1, rows[h]).index_select(3, cols[h])
        for h in range(rows.shape[0])
    ]
    return torch.stack(heads)  # (Nh, D, H, B, W)
