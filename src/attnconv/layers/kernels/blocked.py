"""Exact content attention with row/column positional logits, blocked over queries (CPU).

For the separable encodings with content (quadratic eq. 9 of Cordonnier et al. 2020 and the
learned relative row/column tables of sec. 4.3) every query q has row logits R[q, k1] (H) and
column logits C[q, k2] (W) against the key's row k1 and column k2, given as
q_axis (B|1, Nh, T, H + W). The attention is

    softmax_k(scale q.k + R[q, k1] + C[q, k2]) v                          (eq. 1-2, 9)

The fold (mhsa2d.folded_qkv) widens each head from dk to dk + H + W so that the fused kernel sees
no bias; here the logits of a block of Bq queries are built directly, the bias by broadcasting
(Bq, H, 1) + (Bq, 1, W) (never (T, T)), then q_blk k^T added in place, softmax, @ v. Backward
recomputes each block's probabilities from q, k, v, q_axis and two saved (B, Nh, T) row
statistics, max and 1 / sum (flash-attention style, Dao et al. 2022; P = exp(s - max) / sum as
in the forward and the dense softmax, which measured closer to float64 than exp(s - logsumexp));
nothing else is kept.

FLOPs per head (matmuls, T = H W): forward 2 T^2 (dk + dv), the plain dense path's; backward
2 T^2 (3 dk + 2 dv) (dV, dP, dQ, dK and the logits' recompute, 2 T^2 dk more than the dense
backward), where the fold pays 2 T^2 (dk + H + W) for each logits product (at dk = 16, 32^2:
5x dk). The elementwise work (bias, exp, row sums) is O(T^2) per head, as in any attention.
bench/anchors.py counts them (FlopCounterMode) against the dense anchor.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..encodings.base import pixel_coords
from ..encodings.gaussian import gaussian_offset_logits
from ..first_order import compiling, first_order_only
from ..precision import backward_without_autocast, kernel_dtype, no_autocast

_FLOOR = -60.0  # exp(-60) = 8.8e-27: products with gradients stay normal float32
_BLOCK_ELEMS = 1 << 19  # logits per block, Nh * Bq * T: 2 MiB of float32, one core's L2 + L3 share


def query_block(nh: int, t: int) -> int:
    """Queries per block: a block's (Nh, Bq, T) logits fit in _BLOCK_ELEMS and, on small images,
    stay below one head's T x T (Nh Bq < T): the kernel never holds the dense logits."""
    return max(1, min(_BLOCK_ELEMS // (nh * t), (t - 1) // nh))


def _block_logits(q, kt, qa, h: int, w: int, scale: float) -> torch.Tensor:
    """(Nh, Bq, T) logits of a query block: q (Nh, Bq, dk), kt (Nh, dk, T), qa (Nh, Bq, H + W)."""
    nh, bq = q.shape[:2]
    s = torch.empty(nh, bq, h, w, dtype=q.dtype, device=q.device)
    torch.add(qa[..., :h, None], qa[..., None, h:], out=s)  # R[q, k1] + C[q, k2]
    return s.view(nh, bq, h * w).baddbmm_(q, kt, alpha=scale)  # + scale q.k


def _exp_(s: torch.Tensor) -> torch.Tensor:
    """exp in place of logits minus their max (<= 0). float32: clamped at _FLOOR first, so that no
    probability is subnormal (subnormal exp results and products run far slower on x86,
    docs/benchmarks.md, "Figures behind the code's comments"; the quadratic logits -alpha d^2
    reach -1e5). Each clamped term is < 1e-26 of the softmax sum, far
    below float32 rounding; float64 is left exact."""
    if s.dtype == torch.float32:
        s.clamp_(min=_FLOOR)
    return s.exp_()


def _column_major_zeros(x: torch.Tensor) -> torch.Tensor:
    """Zeros of x's shape (..., T, d), each (T, d) stored column-major (a transposed view): the
    layout in which the BLAS sums dK, dV += P^T dO over query blocks fastest (docs/benchmarks.md,
    the fused kernel's key and value gradients)."""
    return x.new_zeros(*x.shape[:-2], x.shape[-1], x.shape[-2]).transpose(-2, -1)


class _AxisAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, q_axis, h: int, w: int, scale: float, bq: int):
        b, nh, t, _ = q.shape
        out = torch.empty(*q.shape[:3], v.shape[-1], dtype=q.dtype, device=q.device)
        # per query: the logits' max and 1 / the softmax sum, so that backward recomputes P as
        # the forward (and the dense softmax) does: exp(s - max) / sum
        rmax, rden = (torch.empty(b, nh, t, 1, dtype=q.dtype, device=q.device) for _ in "md")
        for i in range(b):
            kt, qa = k[i].transpose(1, 2), q_axis[i if q_axis.shape[0] > 1 else 0]
            for j in range(0, t, bq):
                sl = slice(j, j + bq)
                s = _block_logits(q[i, :, sl], kt, qa[:, sl], h, w, scale)  # (Nh, Bq, T)
                m = s.amax(-1, keepdim=True)  # (Nh, Bq, 1)
                p = _exp_(s.sub_(m))
                rd = p.sum(-1, keepdim=True).reciprocal_()
                out[i, :, sl] = torch.bmm(p, v[i]).mul_(rd)
                rmax[i, :, sl], rden[i, :, sl] = m, rd
        ctx.save_for_backward(q, k, v, q_axis, rmax, rden)
        ctx.hw, ctx.scale, ctx.bq = (h, w), scale, bq
        return out

    @staticmethod
    @once_differentiable
    @backward_without_autocast
    def backward(ctx, dout):
        q, k, v, q_axis, rmax, rden = ctx.saved_tensors
        (h, w), scale, bq = ctx.hw, ctx.scale, ctx.bq
        b, nh, t, _ = q.shape
        dout = dout.to(q.dtype).contiguous()
        dq, dqa = torch.zeros_like(q), torch.zeros_like(q_axis)
        dk, dv = _column_major_zeros(k), _column_major_zeros(v)
        for i in range(b):
            kt, qa = k[i].transpose(1, 2), q_axis[i if q_axis.shape[0] > 1 else 0]
            dqa_i = dqa[i if q_axis.shape[0] > 1 else 0]
            for j in range(0, t, bq):
                sl = slice(j, j + bq)
                qi, doi = q[i, :, sl], dout[i, :, sl]
                s = _block_logits(qi, kt, qa[:, sl], h, w, scale).sub_(rmax[i, :, sl])
                p = _exp_(s).mul_(rden[i, :, sl])  # P (Nh, Bq, T)
                dv[i].baddbmm_(p.transpose(1, 2), doi)  # dV += P^T dO
                ds = torch.bmm(doi, v[i].transpose(1, 2)).mul_(p)  # P o dP
                ds.addcmul_(p, ds.sum(-1, keepdim=True), value=-1)  # dS = P o (dP - sum P o dP)
                torch.bmm(ds, k[i], out=dq[i, :, sl]).mul_(scale)
                dk[i].baddbmm_(ds.transpose(1, 2), qi, alpha=scale)
                ds4 = ds.view(nh, -1, h, w)
                dqa_i[:, sl, :h] += ds4.sum(-1)  # d R[q, k1] = sum over k2 of dS
                dqa_i[:, sl, h:] += ds4.sum(-2)  # d C[q, k2] = sum over k1 of dS
        return dq, dk, dv, dqa, None, None, None, None


def axis_attention(
    q, k, v, q_axis, h: int, w: int, scale: float, block: int | None = None
) -> torch.Tensor:
    """softmax(scale q k^T + R[q1, k1] + C[q2, k2]) v, exact, blocked over queries.
    q, k (B, Nh, T, dk), v (B, Nh, T, dv), q_axis (B|1, Nh, T, H + W) -> (B, Nh, T, dv), in
    float32 (float64 inputs stay float64); ``block`` queries a block (default: query_block).
    First derivative only."""
    if q_axis.shape[-1] != h + w or q_axis.shape[-2] != h * w:
        raise ValueError(f"q_axis {tuple(q_axis.shape)} must be (B, Nh, T={h * w}, H+W={h + w})")
    dt = kernel_dtype(q.dtype)
    q, k, v, q_axis = (t.to(dt).contiguous() for t in (q, k, v, q_axis))
    q, k, v, q_axis = first_order_only(
        "the blocked axis attention (backend='blocked')", q, k, v, q_axis
    )
    with no_autocast(q.device.type):
        bq = block or query_block(q.shape[1], q.shape[2])
        if compiling():  # the same kernel as one custom op (kernels/ops.py)
            return torch.ops.attnconv.blocked_axis(q, k, v, q_axis, h, w, scale, bq)[0]
        return _AxisAttention.apply(q, k, v, q_axis, h, w, scale, bq)


def axis_attention_reference(q, k, v, q_axis, h: int, w: int, scale: float) -> torch.Tensor:
    """The plain equation of ``axis_attention``: the dense (B, Nh, T, T) logits, softmax, @ v."""
    bias = (q_axis[..., :h, None] + q_axis[..., None, h:]).flatten(-2)  # (B|1, Nh, T, T)
    return torch.softmax(scale * q @ k.transpose(-2, -1) + bias, -1) @ v


class _GaussianAttention(torch.autograd.Function):
    """softmax(scale q k^T + G) v with G the generalized quadratic position logits, blocked over
    queries like _AxisAttention; backward recomputes each block and returns the gradients of
    the centres (sum dS S e) and of the precision (-1/2 sum dS e e^T), summed over the batch."""

    @staticmethod
    def forward(ctx, q, k, v, ctr, prec, coords, scale: float, bq: int, drop, p_drop: float):
        b, nh, t, _ = q.shape
        out = torch.empty(*q.shape[:3], v.shape[-1], dtype=q.dtype, device=q.device)
        rmax, rden = (torch.empty(b, nh, t, 1, dtype=q.dtype, device=q.device) for _ in "md")
        for j in range(0, t, bq):
            sl = slice(j, j + bq)
            g, _ = gaussian_offset_logits(coords[sl], coords, ctr, prec)  # (Nh, Bq, T), all images
            for i in range(b):
                s = torch.baddbmm(g, q[i, :, sl], k[i].transpose(1, 2), alpha=scale)
                m = s.amax(-1, keepdim=True)
                p = _exp_(s.sub_(m))
                rd = p.sum(-1, keepdim=True).reciprocal_()
                rmax[i, :, sl], rden[i, :, sl] = m, rd  # the softmax's, before dropout
                if drop is not None:  # attention dropout after the softmax: kept / (1 - p)
                    p.masked_fill_(drop[i, :, sl], 0.0)
                    rd = rd / (1.0 - p_drop)
                out[i, :, sl] = torch.bmm(p, v[i]).mul_(rd)
        ctx.save_for_backward(
            q, k, v, ctr, prec, coords, rmax, rden, *(() if drop is None else (drop,))
        )
        ctx.scale, ctx.bq, ctx.p_drop = scale, bq, p_drop
        return out

    @staticmethod
    @once_differentiable
    @backward_without_autocast
    def backward(ctx, dout):
        q, k, v, ctr, prec, coords, rmax, rden, *drop = ctx.saved_tensors
        scale, bq, p_drop = ctx.scale, ctx.bq, ctx.p_drop
        drop = drop[0] if drop else None
        b, nh, t, _ = q.shape
        dout = dout.to(q.dtype).contiguous()
        dq, dk, dv = torch.zeros_like(q), _column_major_zeros(k), _column_major_zeros(v)
        u = torch.zeros(nh, 2, dtype=q.dtype, device=q.device)  # sum dS e
        dprec = torch.zeros_like(prec)  # -1/2 sum dS e e^T
        for j in range(0, t, bq):
            sl = slice(j, j + bq)
            g, e = gaussian_offset_logits(coords[sl], coords, ctr, prec)
            dg = torch.zeros_like(g)
            for i in range(b):
                qi, doi = q[i, :, sl], dout[i, :, sl]
                s = torch.baddbmm(g, qi, k[i].transpose(1, 2), alpha=scale).sub_(rmax[i, :, sl])
                p = _exp_(s).mul_(rden[i, :, sl])  # P, before dropout
                dp = torch.bmm(doi, v[i].transpose(1, 2))  # dL/dP' (Nh, Bq, T)
                if drop is not None:  # P' = P o keep / (1 - p): dP = dP' o keep / (1 - p)
                    keep = drop[i, :, sl].logical_not()
                    pk = p.masked_fill(~keep, 0.0).div_(1.0 - p_drop)
                    dv[i].baddbmm_(pk.transpose(1, 2), doi)
                    dp.masked_fill_(~keep, 0.0).div_(1.0 - p_drop)
                else:
                    dv[i].baddbmm_(p.transpose(1, 2), doi)
                ds = dp.mul_(p)
                ds.addcmul_(p, ds.sum(-1, keepdim=True), value=-1)
                torch.bmm(ds, k[i], out=dq[i, :, sl]).mul_(scale)
                dk[i].baddbmm_(ds.transpose(1, 2), qi, alpha=scale)
                dg += ds
            u += torch.einsum("hqk,hqki->hi", dg, e)
            dprec -= 0.5 * torch.einsum("hqk,hqki,hqkj->hij", dg, e, e)
        dctr = torch.einsum("hij,hj->hi", prec, u)  # dG/dDelta = S e (S symmetric)
        return dq, dk, dv, dctr, dprec, None, None, None, None, None


def gaussian_attention(
    q,
    k,
    v,
    centers,
    precision,
    h: int,
    w: int,
    scale: float,
    block: int | None = None,
    drop=None,
    p_drop: float = 0.0,
) -> torch.Tensor:
    """softmax(scale q k^T - 1/2 (d - Delta)^T S (d - Delta)) v, d = key - query pixel, exact,
    blocked over queries (generalized quadratic encoding with content). q, k (B, Nh, T, dk),
    v (B, Nh, T, dv), centers (Nh, 2), precision (Nh, 2, 2) symmetric -> (B, Nh, T, dv), in
    float32 (float64 stays); ``drop`` (B, Nh, T, T) bool: the links attention dropout removes
    (functional.dropped_links), kept ones scaled by 1 / (1 - p_drop). First derivative only."""
    dt = kernel_dtype(q.dtype)
    q, k, v, centers, precision = (t.to(dt).contiguous() for t in (q, k, v, centers, precision))
    q, k, v, centers, precision = first_order_only(
        "the blocked Gaussian attention (backend='blocked')", q, k, v, centers, precision
    )
    coords = pixel_coords(h, w, q.device, dt)  # (T, 2)
    with no_autocast(q.device.type):
        bq = block or query_block(2 * q.shape[1], q.shape[2])  # e = d - Delta: 2 values a link
        args = (q, k, v, centers, precision, coords, scale, bq, drop, p_drop)
        if compiling():  # the same kernel as one custom op (kernels/ops.py)
            return torch.ops.attnconv.blocked_gaussian(*args)[0]
        return _GaussianAttention.apply(*args)


def gaussian_attention_reference(
    q, k, v, centers, precision, h: int, w: int, scale: float
) -> torch.Tensor:
    """The plain equation of ``gaussian_attention``: dense logits, softmax, @ v."""
    c = pixel_coords(h, w, q.device, q.dtype)
    g, _ = gaussian_offset_logits(c, c, centers.to(q.dtype), precision.to(q.dtype))  # (Nh, T, T)
    return torch.softmax(scale * q @ k.transpose(-2, -1) + g, -1) @ v
