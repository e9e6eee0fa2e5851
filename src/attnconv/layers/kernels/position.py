"""The kernels of the plain equations and of position-only attention, one signature
``(q, k, v, term, grid, scale, *, p_drop, per_image)``:

- ``reference``: dense (B, Nh, T, T) logits for every batch element, softmax, matmul;
- ``shared``: position-only attention computed once per forward, shared by the batch;
- ``separable`` / ``shift``: a row then a column operator (separable.py), or the hard shift, in
  the head-major layout: v (Nh|1, D, H, B, W) -> (Nh, D, H, B, W), never T x T.

Token-layout kernels return (B, T, Nh, Dv); q, k (B|1, Nh, T, dk) or None (no query/key
projections), v (B, Nh, T, Dv).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..encodings.terms import AxisTerm, GaussianTerm
from ..functional import attention_probs, scaled_dot_product_attention, shared_dropout
from ..precision import no_autocast
from .separable import axis_softmax, outer_probs, separable_attention, shift_gather
from .separable import separable_probs as axis_probs


def dense_inputs(q, k, v, term, grid):
    """q, k, bias of the plain equations: logits = q k^T * scale + bias, bias (B|1, Nh, T, T) or
    None; zero-width q, k when the logits have no q.k term."""
    bias = term.dense(q, k, grid.dtype)
    if not (q is not None and term.qk):
        b = q.shape[0] if q is not None else (bias.shape[0] if bias is not None else 1)
        q = k = torch.zeros(b, v.shape[1], grid.h * grid.w, 0, dtype=grid.dtype, device=v.device)
    return q, k, bias


def reference(q, k, v, term, grid, scale, *, p_drop=0.0, per_image=True):
    """Dense logits for every batch element, exactly the equations; dropout draws the links of
    functional.dropped_links, as the tokens path does."""
    b = v.shape[0]
    q, k, bias = dense_inputs(q, k, v, term, grid)
    q, k = q.expand(b, *q.shape[1:]), k.expand(b, *k.shape[1:])
    if bias is not None:
        bias = bias.expand(b, *bias.shape[1:])
    if p_drop > 0:
        probs = attention_probs(q, k, bias=bias, scale=scale)
        probs = shared_dropout(probs, p_drop, per_image=per_image)
        return (probs.to(v.dtype) @ v).transpose(1, 2)
    y = scaled_dot_product_attention(q, k, v, bias=bias, scale=scale, backend="reference")
    return y.transpose(1, 2)  # (B, T, Nh, Dv)


def reference_probs(q, k, v, term, grid, scale):
    q, k, bias = dense_inputs(q, k, v, term, grid)
    return attention_probs(q, k, bias=bias, scale=scale)


def shared_probs(q, k, v, term, grid, scale, dtype=None) -> torch.Tensor:
    """(1, Nh, T, T) position-only probabilities: a Gaussian term's from its low-rank fold in
    float64 (position_logits); learned relative tables (sec. 4.3) as the outer product of their
    row and column softmaxes, softmax(R[q, k1] + C[q, k2]) = softmax(R) (x) softmax(C), fewer
    ops in sa_learned's training step than the dense equations (counted by `python
    benchmarks/step_ops.py`: docs/benchmarks.md, "On a GPU"; the quadratic axis term builds
    its per-axis logits in more ops than its dense ones: it stays dense); any other from the
    dense equations. In ``dtype`` (default: the layer's for a Gaussian or axis term, q's
    otherwise)."""
    if isinstance(term, GaussianTerm):
        return axis_softmax(term.position_logits())[None].to(dtype or grid.dtype)
    if isinstance(term, AxisTerm) and not term.query_reads and term.gaussian is None:
        return separable_probs(q, k, v, term, grid, scale).to(dtype or grid.dtype)
    probs = reference_probs(q, k, v, term, grid, scale)
    return probs if dtype is None else probs.to(dtype)


def _batch_summed_outer(dy: torch.Tensor, vs: torch.Tensor) -> torch.Tensor:
    """sum_b dy_b v_b^T per head: dy (B, Tq, Nh, D), vs (B, Tk, Nh, D) -> (Nh, Tq, Tk), one GEMM per
    head over the (b, d) pairs in that order, as autograd reduces the plain einsum's dP (a
    one-call einsum summed them in another order and came out past its float32 error bound:
    docs/benchmarks.md, "Figures behind the code's comments")."""
    b, tq, nh, d = dy.shape
    dyh = dy.permute(2, 1, 0, 3).reshape(nh, tq, b * d)
    vh = vs.permute(2, 1, 0, 3).reshape(nh, vs.shape[1], b * d)
    return dyh @ vh.transpose(1, 2)


class _SharedMix(torch.autograd.Function):
    """y = P v for probabilities P (Nh, T, T) shared by the batch and values in a lower
    precision (bf16 autocast): the product in v's dtype, the batch-summed dP in P's (float32).
    Rounding that sum to bf16 once loses more than the plain path, which rounds each image's dP
    and sums in float32; with sharp heads the centres' gradient error grew past the plain path's
    (docs/benchmarks.md, "On a GPU")."""

    @staticmethod
    def forward(ctx, probs, vs):  # probs (Nh, T, T) float32, vs (B, T, Nh, Dv) -> (B, T, Nh, Dv)
        p = probs.to(vs.dtype)
        ctx.save_for_backward(p, vs)
        ctx.probs_dtype = probs.dtype
        return torch.einsum("hqk,bkhd->bqhd", p, vs)

    @staticmethod
    def backward(ctx, dy):
        p, vs = ctx.saved_tensors
        with no_autocast(dy.device.type):
            dp = dv = None
            if ctx.needs_input_grad[0]:  # dP = sum_b dy v^T, accumulated and kept in P's dtype
                dp = _batch_summed_outer(dy.to(ctx.probs_dtype), vs.to(ctx.probs_dtype))
            if ctx.needs_input_grad[1]:  # dv = P^T dy, per head (an expand sums them)
                dv = torch.einsum("hqk,bqhd->bkhd", p, dy.to(p.dtype))
        return dp, dv


def shared(q, k, v, term, grid, scale, *, p_drop=0.0, per_image=True):
    """Input-independent attention: computed once, shared by the batch. -> (B, T, Nh, Dv)"""
    b, dt = v.shape[0], v.dtype
    probs = shared_probs(q, k, v, term, grid, scale)  # (1, Nh, T, T), float32 under autocast
    vs = v.transpose(1, 2)  # (B, T, Nh, Dv)
    if p_drop > 0 and not per_image:  # one mask: still shared by the batch
        probs = shared_dropout(probs, p_drop)
    elif p_drop > 0:  # a mask per image (dropped_links', as every path): the probabilities expanded
        p = shared_dropout(probs.expand(b, -1, -1, -1), p_drop, per_image=True).to(dt)
        return torch.einsum("bhqk,bkhd->bqhd", p, vs)
    if probs.dtype != dt:  # lower-precision values: the probabilities' gradient in float32
        return _SharedMix.apply(probs[0], vs)
    if vs.shape[2] == 1 or vs.stride(2) == 0:  # the heads share values
        return torch.einsum("hqk,bkd->bqhd", probs[0], vs[:, :, 0])
    return torch.einsum("hqk,bkhd->bqhd", probs[0], vs)  # (B, T, Nh, Dv)


def separable(q, k, v, term, grid, scale, *, p_drop=0.0, per_image=True):
    """Separable position-only attention, head-major v (Nh|1, D, H, B, W): a row then a column
    operator, softmax over each axis (eq. 9 factorized)."""
    row, col = term.axes(grid.dtype)
    return separable_attention(v, row.to(v.device), col.to(v.device))


def separable_probs(q, k, v, term, grid, scale):
    row, col = term.axes(grid.dtype)
    return axis_probs(row.to(v.device), col.to(v.device))[None]


def shift(q, k, v, term, grid, scale, *, p_drop=0.0, per_image=True):
    """The alpha -> infinity limit (Lemma 2), a gather: head-major v (Nh|1, D, H, B, W)."""
    return shift_gather(v, term.rows, term.cols)


def shift_probs(q, k, v, term, grid, scale):
    r, c = F.one_hot(term.rows, grid.h), F.one_hot(term.cols, grid.w)  # (Nh, h, h), (Nh, w, w)
    return outer_probs(r.to(grid.dtype), c.to(grid.dtype))[None]
