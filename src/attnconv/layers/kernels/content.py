"""The kernels of content attention with a positional term, one signature
``(q, k, v, term, grid, scale, *, p_drop)`` -> (B, T, Nh, Dv):

    softmax(scale q k^T + positional logits) v                        (Cordonnier et al., eq. 1-9)

q, k (B, Nh, T, dk), v (B, Nh, T, Dv) (heads may share one value tensor: stride 0); the term
from terms.py; grid = (h, w, the layer's dtype). Which one runs is kernels/plan.py's choice,
the dtype each computes in precision.py's.
"""

from __future__ import annotations

import torch

from ..encodings.terms import AxisTerm, GaussianTerm
from ..functional import dropped_links, scaled_dot_product_attention
from ..precision import (
    hi,
    hi_kept_low,
    kernel_dtype,
    no_autocast,
    operand_dtype,
    softmax_f32,
    upcast,
)
from . import triton_axis, triton_compile
from .blocked import axis_attention, gaussian_attention
from .flex import axis_score_mod, flex_mod_attention, gaussian_score_mod
from .fused import axis_attention_fused


def score_mod(term: AxisTerm, q: torch.Tensor, *, in_kernel: bool = False):
    """The positional logits of an AxisTerm as a FlexAttention score_mod (flex.py): each query's
    row/column logits gathered, or (``in_kernel``, a term with a Gaussian) eq. 9 computed in the
    kernel from each pair's pixel offset, no gather. q (B, Nh, T, dk) in float32 at least."""
    if in_kernel:
        return gaussian_score_mod(hi(term.gaussian.alpha), hi(term.gaussian.centers), term.w)
    return axis_score_mod(term.q_axis(q), term.h, term.w)


def q_axis_kept_low(term: AxisTerm, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B|1, Nh, T, dk) made contiguous, and its axis logits from hi(q): the tables' product
    then saves views of hi(q) (a strided q's halves would be copied), which autograd keeps as q
    itself (precision.hi_kept_low): no float32 copy of a bfloat16 q from forward to backward."""
    if not term.query_reads:  # input-independent logits (quadratic): q not read
        return q, term.q_axis(hi(q))
    q = q.contiguous()
    with hi_kept_low(q) as q_hi:
        return q, term.q_axis(q_hi)


def flex(q, k, v, term, grid, scale, *, p_drop=0.0, per_image=True, in_kernel=False):
    """FlexAttention, the row/column logits added by a score_mod (flex.py). q, k, v keep their
    (autocast) dtype, the kernel accumulates scores in float32 and the logits are added in
    float32."""
    with no_autocast(q.device.type):
        if in_kernel:
            mod = score_mod(term, hi(q), in_kernel=True)
        else:  # the logits' float32 q not held for the backward
            q, q_axis = q_axis_kept_low(term, q)
            mod = axis_score_mod(q_axis, term.h, term.w)
        y = flex_mod_attention(
            q, k.to(q.dtype), v.to(q.dtype), mod, scale, compiled=q.device.type == "cuda"
        )
    return y.to(grid.dtype).transpose(1, 2)


def flex_gaussian(q, k, v, term, grid, scale, *, p_drop=0.0, per_image=True):
    """``flex`` with eq. 9 computed in the kernel (inference). Training gathers: compiled Flex
    reduces a captured per-head scalar's gradient over every (query, key) pair with atomics on
    Nh addresses, far slower (docs/benchmarks.md, "On a GPU"; `attnconv bench --suite cuda`)."""
    return flex(q, k, v, term, grid, scale, in_kernel=True)


def shared_bias(q, k, v, term, grid, scale, *, p_drop=0.0, per_image=True):
    """softmax(q k^T * scale + R[q1, k1] + C[q2, k2]) v, the fused SDPA with one (1, Nh, T, T)
    bias for the batch, built from the fixed row and column logits (the dense path's values
    less a per-query constant, which the softmax cancels). A bfloat16 bias rounds the logits it
    adds: attention in float32."""
    h, w = grid.h, grid.w
    row, col = term.axes(grid.dtype)  # (Nh, h, h), (Nh, w, w), float32+
    t = h * w
    bias = (row[:, :, None, :, None] + col[:, None, :, None, :]).reshape(1, -1, t, t)
    q, k, v = upcast(q, k, v)
    with no_autocast(q.device.type):
        y = scaled_dot_product_attention(
            q, k, v.to(q.dtype), bias=bias.to(q.device, q.dtype), scale=scale
        )  # (B, Nh, T, Dv)
    return y.to(grid.dtype).transpose(1, 2)


def blocked(q, k, v, term, grid, scale, *, p_drop=0.0, per_image=True):
    """softmax(scale q k^T + R[q1, k1] + C[q2, k2]) v by query blocks (blocked.py): dk-wide
    logits where the fold's are dk + H + W, in kernel_dtype (the axis logits too)."""
    dt = kernel_dtype(q.dtype)
    with no_autocast(q.device.type):
        q, k = q.to(dt), k.to(dt)
        q_axis = term.q_axis(q)  # (B|1, Nh, T, h + w)
        if q_axis.stride(0) == 0:  # input-independent (quadratic): one copy for the batch
            q_axis = q_axis[:1]
        y = axis_attention(q, k, v, q_axis, grid.h, grid.w, scale)
    return y.to(grid.dtype).transpose(1, 2)


def dense_dropout(q, k, v, term, grid, scale, *, p_drop=0.0, per_image=True):
    """softmax(scale q k^T + R[q1, k1] + C[q2, k2]) with the links of ``functional.dropped_links``
    removed (the plain path's own mask), times v, in kernel_dtype: the logits one baddbmm onto
    the broadcast row/column logits, dropout a mask fill (1 / (1 - p) applied to the output)."""
    h, w = grid.h, grid.w
    b, nh, t, dk = q.shape
    dt = kernel_dtype(q.dtype)
    with no_autocast(q.device.type):
        q, k = q.to(dt), k.to(dt)
        q_axis = term.q_axis(q)  # (B|1, Nh, T, h + w)
        pos = q_axis[..., :h, None] + q_axis[..., None, h:]  # (B|1, Nh, T, h, w), scaled
        pos = pos.expand(b, nh, t, h, w).reshape(b * nh, t, t)
        logits = torch.baddbmm(
            pos, q.reshape(b * nh, t, dk), k.reshape(b * nh, t, dk).transpose(1, 2), alpha=scale
        )
        probs = torch.softmax(logits, dim=-1).view(b, nh, t, t)
        probs = probs.masked_fill(dropped_links(nh, t, b, p_drop, q.device), 0.0)
        if v.shape[1] == 1 or v.stride(1) == 0:  # the heads share values: one (Nh*T, T) GEMM
            y = torch.matmul(probs.view(b, nh * t, t), v[:, 0].to(dt))
        else:
            y = torch.matmul(probs, v.to(dt))
        y = y.view(b, nh, t, -1) * (1.0 / (1.0 - p_drop))
    return y.to(grid.dtype).transpose(1, 2)


def fused(q, k, v, term, grid, scale, *, p_drop=0.0, per_image=True):
    """softmax(scale q k^T + R[q1, k1] + C[q2, k2]) with the links of ``functional.dropped_links``
    removed, times v: the C++ kernel of fused.py (one task per image and head, query blocks in
    L2, the mask redrawn in backward), in kernel_dtype; under bf16 autocast q, k, v stay the
    bfloat16 operands of its products, the axis logits float32."""
    with no_autocast(q.device.type):
        if operand_dtype(q.dtype) != kernel_dtype(q.dtype):  # bf16: no float32 q kept
            q, q_axis = q_axis_kept_low(term, q)
        else:
            q = q.to(kernel_dtype(q.dtype))  # once: the axis logits and the kernel read it
            q_axis = term.q_axis(q)  # (B|1, Nh, T, h + w)
        y = axis_attention_fused(q, k, v, q_axis, grid.h, grid.w, scale, p_drop, per_image)
    return y.to(grid.dtype)


def triton(q, k, v, term, grid, scale, *, p_drop=0.0, per_image=True):
    """softmax(scale q k^T + R[q1, k1] + C[q2, k2]) with the links of ``functional.dropped_links``
    removed, times v: the flash-style Triton kernel of triton_axis.py (``backend="triton"``), q, k,
    v in their (autocast) dtype, the axis logits in float32 at least. The plan chose it where it
    can run (capability.triton_axis_fits): the query block its GPU's shared memory takes is that
    check's (triton_compile.fit, cached)."""
    with no_autocast(q.device.type):
        q, q_axis = q_axis_kept_low(term, q)  # (B|1, Nh, T, h + w), float32 at least
    # the axis logits count too: a learned encoding trains through them
    train = triton_axis.trains(q, k, v, q_axis)
    why, block_m = triton_compile.fit(q, v, grid.h, grid.w, p_drop, per_image, train)
    if why:  # the plan's Case said it fits: a call it did not describe
        raise RuntimeError(f"attnconv: the Triton kernel was chosen but cannot run: {why}")
    with no_autocast(q.device.type):  # q, k, q_axis of one image (B|1) read for every image
        y = triton_axis.axis_attention_triton(
            q, k, v, q_axis, grid.h, grid.w, scale, p_drop, per_image, block_m=block_m
        )
    return y.to(grid.dtype)


def blocked_gaussian(q, k, v, term, grid, scale, *, p_drop=0.0, per_image=True):
    """softmax(scale q k^T - 1/2 (d - Delta)^T S (d - Delta)) v by query blocks, in float32, the
    position logits built from the offsets (blocked.gaussian_attention); attention dropout by
    the plain path's own dropped links. Folded into q/k, the bilinear form's alpha H^2 terms
    cancel in float32 (docs/benchmarks.md, "Figures behind the code's comments")."""
    b, nh, t = q.shape[:3]
    drop = dropped_links(nh, t, b, p_drop, q.device) if p_drop > 0 else None
    y = gaussian_attention(
        q, k, v, hi(term.centers), term.precision, grid.h, grid.w, scale, drop=drop, p_drop=p_drop
    )
    return y.to(grid.dtype).transpose(1, 2)


def folded_qkv(q, k, v, term, scale):
    """Augmented q, k (B, Nh, T, dk + folded terms) and v (B, Nh, T, Dv) such that
    softmax(q_aug k_aug^T) v is the attention (scale folded into q_aug); large folded logits
    (quadratic, learned relative) in float32."""
    if term.large_logits:
        q, k, v = upcast(q, k, v)
    qs, ks = ([q * scale], [k]) if term.qk else ([], [])
    q_pos, k_pos = term.fold(q, k)  # the positional terms as extra columns
    q_aug, k_aug = torch.cat(qs + q_pos, dim=-1), torch.cat(ks + k_pos, dim=-1)
    return q_aug, k_aug, v.to(q_aug.dtype)


def fold(q, k, v, term, grid, scale, *, p_drop=0.0, per_image=True):
    """Every positional term folded into q/k (``folded_qkv``): the fused SDPA, no bias. The folded
    quadratic logits reach alpha H^2: kept in float32, autocast must not cast them back."""
    q_aug, k_aug, v = folded_qkv(q, k, v, term, scale)
    with no_autocast(q_aug.device.type, term.large_logits):
        y = scaled_dot_product_attention(
            q_aug, k_aug, v, scale=1.0, dropout_p=p_drop, backend="sdpa"
        )  # (B, Nh, T, Dv)
    return y.to(grid.dtype).transpose(1, 2)


def content_probs(q, k, v, term, grid, scale):
    """(B, Nh, T, T) probabilities of content attention from the fold (a Gaussian term: from the
    offsets, its fold cancels)."""
    if isinstance(term, GaussianTerm):
        lg = q @ k.transpose(-2, -1) * scale + term.dense_logits().to(q.dtype)
        return softmax_f32(lg)
    q_aug, k_aug, _ = folded_qkv(q, k, v, term, scale)
    return softmax_f32(q_aug @ k_aug.transpose(-2, -1))  # scale folded into q_aug
