"""The local k x k window attention kernel of SASA layers and the attention stem
(Ramachandran et al. 2019, eq. 2-3), written once, in three kernels of the same equation
(``backend``; the layers' LOCAL_TABLE picks among them and the other window kernels):

- ``"reference"``: unfold keys and values into k^2 copies and call the shared plain kernel
  ``functional.scaled_dot_product_attention(backend="reference")`` with one query per window.
- ``"window"`` (fast): one custom autograd function looping over the k^2 offsets on shifted
  views of the keys and values (clipped to the image), softmax and its backward in place, in-place
  accumulation of the gradients. Only the probabilities (B, nh, k^2, H, W) are stored:
  O(k^2 HW nh) memory, not O(k^2 HW C).
- ``"fused"``: the same function's equation in C++ (kernels/fused_local.cpp), on a CPU.

Borders: ``padding="mask"`` (default) excludes keys outside the image from the softmax;
``padding="zeros"`` treats them as zero pixels (keys and values 0), as the public
reimplementations do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..checks import check_window, refuses_retired
from ..first_order import compiling
from ..functional import scaled_dot_product_attention
from ..precision import LOW, backward_without_autocast
from .fused import available, extension
from .window_geometry import (  # noqa: F401  (window_pad, local_to_dense: re-exported)
    local_to_dense,
    pad_hw,
    window_offsets,
    window_pad,
    window_valid,
)

PADDINGS = ("mask", "zeros")
WINDOW_BACKENDS = ("reference", "window", "fused")  # local_attention's kernels


def _window_logits(q: torch.Tensor, k: torch.Tensor, ks: int, out: torch.Tensor) -> None:
    """out[:, :, o] += q . k shifted by offset o, inside the image: q, k (B, nh, d, H, W),
    out (B, nh, k^2, H, W). One shifted view per offset, no k^2 copies of the keys."""
    tmp = torch.empty_like(q)  # one scratch buffer, viewed per offset (no allocations)
    for o, qb, kb in window_offsets(ks, *q.shape[-2:]):
        t = torch.mul(q[qb], k[kb], out=tmp[qb])
        torch.sum(t, dim=2, out=out[:, :, o][qb])  # out is 0 there before


def _window_logits_grad(gl, q, k, ks, need_q, need_k):
    """Gradients of _window_logits for the logit gradient gl (B, nh, k^2, H, W)."""
    gq = torch.zeros_like(q) if need_q else None
    gk = torch.zeros_like(k) if need_k else None
    for o, qb, kb in window_offsets(ks, *q.shape[-2:]):
        go = gl[:, :, o].unsqueeze(2)[qb]  # (B, nh, 1, h', w')
        if gq is not None:
            gq[qb].addcmul_(go, k[kb])
        if gk is not None:
            gk[kb].addcmul_(go, q[qb])
    return gq, gk


def _window_aggregate(probs, v, mix, ks):
    """sum_o probs[:, :, o] * sum_m mix[o, m] v[:, :, m] shifted by o -> (B, nh, dv, H, W).

    probs (B, nh, k^2, H, W), v (B, nh, M, dv, H, W), mix (k^2, M) mixing M value maps per
    offset (the attention stem's spatially-aware values) or None (M = 1, plain attention).
    Keys outside the image contribute nothing (masked: zero probability; zeros: zero value).
    """
    bsz, nh, _, h, w = probs.shape
    out = v.new_zeros(bsz, nh, v.shape[3], h, w)
    for o, qb, kb in window_offsets(ks, h, w):
        p_o = probs[:, :, o].unsqueeze(2)[qb]  # (B, nh, 1, h', w')
        for m in range(v.shape[2]):
            w_om = p_o if mix is None else p_o * mix[o, m]
            out[qb].addcmul_(w_om, v[:, :, m][kb])
    return out


def _window_aggregate_grad(g, probs, v, mix, ks, need_v, need_m):
    """Gradients of _window_aggregate for the output gradient g (B, nh, dv, H, W)."""
    gp = torch.zeros_like(probs)
    gv = torch.zeros_like(v) if need_v else None
    gm = torch.zeros_like(mix) if need_m and mix is not None else None
    tmp, stmp = torch.empty_like(g), torch.empty_like(probs[:, :, 0])  # scratch buffers
    for o, qb, kb in window_offsets(ks, *probs.shape[-2:]):
        p_o = probs[:, :, o].unsqueeze(2)[qb]  # (B, nh, 1, h', w')
        g_o = g[qb]
        for m in range(v.shape[2]):
            t = torch.mul(g_o, v[:, :, m][kb], out=tmp[qb])
            s = torch.sum(t, dim=2, out=stmp[qb])  # g . v^m_ab, (B, nh, h', w')
            if gm is not None:
                gm[o, m] = (p_o.squeeze(2) * s).sum()
            gp[:, :, o][qb].add_(s if mix is None else s * mix[o, m])
            if gv is not None:
                w_om = p_o if mix is None else p_o * mix[o, m]
                gv[:, :, m][kb].addcmul_(w_om, g_o)
    return gp, gv, gm


def window_forward(q, k, v, mix, qr_row, qr_col, valid, ks: int):
    """The Python window kernel's forward (no autograd): logits, mask, softmax in place, the
    weighted sum -> y (B, nh, dv, H, W), probs (B, nh, k^2, H, W)."""
    bsz, nh, _, h, w = q.shape
    logits = q.new_zeros(bsz, nh, ks * ks, h, w)  # (B, nh, k^2, H, W)
    if k is not None:
        _window_logits(q, k, ks, logits)  # q_ij . k_ab (0 for keys outside the image)
    if qr_row is not None:  # + q_ij . r_{a-i,b-j} = q . rel_row[di] + q . rel_col[dj]
        lg = logits.view(bsz, nh, ks, ks, h, w)
        lg.add_(qr_row.unsqueeze(3)).add_(qr_col.unsqueeze(2))
    if valid is not None:  # keys outside the image leave the softmax
        logits.masked_fill_(~valid, float("-inf"))
    # softmax over the window, in place; the centre key is always valid
    probs = logits.sub_(logits.amax(dim=2, keepdim=True)).exp_()
    probs.div_(probs.sum(dim=2, keepdim=True))
    return _window_aggregate(probs, v, mix, ks), probs  # (B, nh, dv, H, W)


def window_backward(gy, q, k, v, mix, probs, ks: int, has_qr: bool, need):
    """The Python window kernel's gradients (first order) for gy (B, nh, dv, H, W): gq, gk, gv,
    gm, g_row, g_col (None where not asked: ``need``, the inputs' needs_input_grad)."""
    gl, gv, gm = _window_aggregate_grad(gy, probs, v, mix, ks, need[2], need[3])
    # softmax backward in place: gl = p * (gp - sum_o p_o gp_o)
    dot = torch.zeros_like(probs[:, :, 0])  # (B, nh, H, W)
    for o in range(ks * ks):
        dot.addcmul_(probs[:, :, o], gl[:, :, o])
    gl.sub_(dot.unsqueeze(2)).mul_(probs)
    g_row = g_col = None
    if has_qr:
        gl6 = gl.view(*gl.shape[:2], ks, ks, *gl.shape[-2:])  # (B, nh, k, k, H, W)
        g_row, g_col = gl6.sum(3), gl6.sum(2)
    gq = gk = None
    if k is not None:
        gq, gk = _window_logits_grad(gl, q, k, ks, need[0], need[1])
    return gq, gk, gv, gm, g_row, g_col


class _LocalAttention(torch.autograd.Function):
    """Fused window attention: logits, mask, softmax and weighted sum over the k^2 offsets.

    Keeps only q, k, v and the probabilities (B, nh, k^2, H, W) for backward; the softmax and
    its backward run in place on one (B, nh, k^2, H, W) buffer each. Higher derivatives
    (``create_graph=True``, e.g. a gradient penalty): the backward is the plain path's gradient,
    itself differentiable, so double backward is exact (never a silent zero).
    """

    @staticmethod
    def forward(ctx, q, k, v, mix, qr_row, qr_col, valid, ks: int):
        with torch.no_grad():  # also when traced (torch.export): in-place, out= kernels
            y, probs = window_forward(q, k, v, mix, qr_row, qr_col, valid, ks)
        _LocalAttention._save(
            ctx, _LocalAttention._window_backward, q, k, v, mix, probs, qr_row, qr_col, valid, ks
        )
        return y, probs

    @staticmethod
    def _save(ctx, first_order, q, k, v, mix, probs, qr_row, qr_col, valid, ks: int) -> None:
        """What either kernel keeps for backward, and its own first-order backward."""
        ctx.save_for_backward(q, k, v, mix, probs, qr_row, qr_col, valid)
        ctx.ks, ctx.has_qr, ctx.first_order = ks, qr_row is not None, first_order
        ctx.mark_non_differentiable(probs)
        ctx.set_materialize_grads(False)  # no zero (B, nh, k^2, H, W) gradient for probs

    @staticmethod
    def backward(ctx, gy, _gprobs):
        if gy is None:  # probs is non-differentiable: nothing flows back
            return (None,) * 8
        if torch.is_grad_enabled():  # create_graph: a differentiable gradient (plain path)
            return _LocalAttention._plain_backward(ctx, gy)
        return ctx.first_order(ctx, gy)

    @staticmethod
    def _window_backward(ctx, gy):
        """The Python window kernel's gradients (first order)."""
        q, k, v, mix, probs, _, _, _ = ctx.saved_tensors
        grads = window_backward(gy, q, k, v, mix, probs, ctx.ks, ctx.has_qr, ctx.needs_input_grad)
        return (*grads, None, None)

    @staticmethod
    def _plain_backward(ctx, gy):
        """Gradients of the plain path (_reference) at the saved inputs, with their graph."""
        # fresh views: partial derivatives per input (qr_row is computed from q outside this
        # function; a gradient w.r.t. q itself would count that path twice)
        *saved, valid = [t if t is None else t.view_as(t) for t in ctx.saved_tensors]
        q, k, v, mix, _, qr_row, qr_col = saved
        inputs = (q, k, v, mix, qr_row, qr_col)
        wrt = [i for i, t in enumerate(inputs) if t is not None and ctx.needs_input_grad[i]]
        qr = (qr_row, qr_col) if ctx.has_qr else None
        padding = "zeros" if valid is None else "mask"
        y = _reference(q, k, v, qr, mix, ctx.ks, padding, False)
        grads = torch.autograd.grad(
            y, [inputs[i] for i in wrt], gy, create_graph=True, allow_unused=True
        )
        out = [None] * 8
        for i, g in zip(wrt, grads):
            out[i] = g
        return tuple(out)


class _FusedLocal(_LocalAttention):
    """_LocalAttention's equation run by the fused C++ kernel (kernels/fused_local.cpp, one task
    per image and head, held in cache), float32/float64, plain or mixed values. Saves what
    _LocalAttention saves, so a differentiable gradient (create_graph) is the same plain
    path's."""

    @staticmethod
    def forward(ctx, q, k, v, mix, qr_row, qr_col, valid, ks: int):
        ext = extension()
        y, probs = ext.local_forward(q, k, v, mix, qr_row, qr_col, ks, valid is not None)
        _LocalAttention._save(
            ctx, _FusedLocal._fused_backward, q, k, v, mix, probs, qr_row, qr_col, valid, ks
        )
        return y, probs

    @staticmethod
    @backward_without_autocast
    def _fused_backward(ctx, gy):
        """The C++ kernel's gradients (first order)."""
        q, k, v, mix, probs, _, _, _ = ctx.saved_tensors
        gq, gk, gv, gm, g_row, g_col = extension().local_backward(
            gy.contiguous(), q, k, v, mix, probs, ctx.ks, ctx.has_qr
        )
        return gq, gk, gv, gm, g_row, g_col, None, None


@refuses_retired
def local_attention(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor,
    *,
    kernel_size: int,
    rel_row: torch.Tensor | None = None,
    rel_col: torch.Tensor | None = None,
    mix: torch.Tensor | None = None,
    padding: str = "mask",
    backend: str = "window",
    return_attention: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Local k x k window attention, the one kernel of SASA layers and the attention stem.

    q (B, nh, dk, H, W), already scaled; k (B, nh, dk, H, W) or None (no content logits);
    v (B, nh, dv, H, W), or (B, nh, M, dv, H, W) with ``mix`` (k*k, M) for spatially-aware
    values v_ab = sum_m mix[(a-i, b-j), m] v^m_ab. ``rel_row``/``rel_col`` (k, dk/2): logits
    += q[:dk/2] . rel_row[a-i] + q[dk/2:] . rel_col[b-j]. Returns (B, nh, dv, H, W) and, with
    ``return_attention``, the probabilities (B, nh, H*W, k*k) (offsets in row-major order).
    ``backend``: one of ``WINDOW_BACKENDS`` (the layers' LOCAL_TABLE decides): "fused", the
    window kernel in C++ (kernels/fused_local.cpp, a CPU with the kernels built) instead of the
    Python loop over the offsets, "reference" the plain equations.
    """
    if backend not in WINDOW_BACKENDS:
        raise ValueError(f"backend must be one of {WINDOW_BACKENDS}, got {backend!r}")
    if backend == "fused" and not (q.device.type == "cpu" and available()):
        raise ValueError(
            "backend='fused' runs on a CPU with the C++ kernels built (attnconv build-kernels); "
            f"q is on {q.device.type}: backend='window' runs everywhere"
        )
    if padding not in PADDINGS:
        raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
    if q.dim() != 5:
        raise ValueError(f"q must be (B, nh, d, H, W), got shape {tuple(q.shape)}")
    if k is None and rel_row is None:
        raise ValueError("local_attention needs keys k or relative tables rel_row/rel_col")
    check_window(q, k, v, rel_row, rel_col, kernel_size)  # before the kernels read them
    bsz, nh, dk, h, w = q.shape
    ks = kernel_size
    if (v.dim() == 6) != (mix is not None):
        raise ValueError(f"v (B, nh, M, dv, H, W) goes with mix (k*k, M); got v {tuple(v.shape)}")
    if v.dim() == 5:
        v = v.unsqueeze(2)  # (B, nh, 1, dv, H, W)
    nm = v.shape[2]
    if mix is not None and tuple(mix.shape) != (ks * ks, nm):
        raise ValueError(f"mix must be ({ks * ks}, {nm}) for {nm} value maps, got {mix.shape}")
    if q.dtype in LOW:  # softmax and sums in float32, cast back

        def up(t):
            return None if t is None else t.float()

        out = local_attention(
            up(q),
            up(k),
            up(v.squeeze(2) if mix is None else v),
            kernel_size=ks,
            rel_row=up(rel_row),
            rel_col=up(rel_col),
            mix=up(mix),
            padding=padding,
            backend=backend,
            return_attention=return_attention,
        )
        return (out[0].to(q.dtype), out[1]) if return_attention else out.to(q.dtype)
    qr = None
    if rel_row is not None:  # q^T r_{a-i,b-j} = q_row . rel_row[di] + q_col . rel_col[dj]
        half = dk // 2
        qr_row = torch.einsum("bndhw,kd->bnkhw", q[:, :, :half], rel_row)  # (B, nh, k, H, W)
        qr_col = torch.einsum("bndhw,kd->bnkhw", q[:, :, half:], rel_col)
        qr = (qr_row, qr_col)

    if backend == "reference":
        return _reference(q, k, v, qr, mix, ks, padding, return_attention)

    valid = window_valid(ks, h, w, q.device) if padding == "mask" else None
    qr_row, qr_col = qr if qr is not None else (None, None)
    fused = backend == "fused"
    if fused:
        q, k, v, mix, qr_row, qr_col = (
            None if t is None else t.to(q.dtype).contiguous()
            for t in (q, k, v, mix, qr_row, qr_col)
        )  # autocast: bf16
    args = (q, k, v, mix, qr_row, qr_col, valid, ks)
    if compiling():  # the same kernel as one custom op (kernels/ops.py)
        y, probs = torch.ops.attnconv.local_window(*args, fused)
    else:
        y, probs = (_FusedLocal if fused else _LocalAttention).apply(*args)
    if return_attention:  # (B, nh, H*W, k^2)
        return y, probs.detach().flatten(3).transpose(2, 3)
    return y


def _reference(q, k, v, qr, mix, ks, padding, return_attention):
    """The plain path: unfold into k^2 copies, then the shared plain softmax(qk^T + bias) v."""
    bsz, nh, dk, h, w = q.shape
    nm, dv = v.shape[2], v.shape[3]
    t = h * w

    def unfold(x):  # (B, nh, M, d, H, W) -> (B*T, nh, M, k^2, d): each query's window
        b_, n_, m_, d_ = x.shape[:4]
        cols = F.unfold(pad_hw(x.reshape(b_, n_ * m_ * d_, h, w), ks), ks)  # (B, .*k^2, T)
        cols = cols.view(b_, n_, m_, d_, ks * ks, t).permute(0, 5, 1, 2, 4, 3)
        return cols.reshape(b_ * t, n_, m_, ks * ks, d_)

    qt = q.reshape(bsz, nh, dk, t).permute(0, 3, 1, 2).reshape(bsz * t, nh, 1, dk)
    vw = unfold(v)  # (B*T, nh, M, k^2, dv)
    if mix is not None:  # spatially-aware values, one per offset: sum_m mix[o, m] v^m
        vw = (vw * mix.t().reshape(1, 1, nm, ks * ks, 1)).sum(2)
    else:
        vw = vw[:, :, 0]
    bias = torch.zeros(bsz, nh, ks, ks, h, w, dtype=q.dtype, device=q.device)
    if qr is not None:
        bias = bias + qr[0][:, :, :, None] + qr[1][:, :, None, :]
    bias = bias.reshape(bsz, nh, ks * ks, t).permute(0, 3, 1, 2).reshape(bsz * t, nh, 1, ks * ks)
    mask = None
    if padding == "mask":
        valid = window_valid(ks, h, w, q.device).reshape(ks * ks, t).t()  # (T, k^2)
        mask = valid[None, :, None, None, :].expand(bsz, t, 1, 1, ks * ks)
        mask = mask.reshape(bsz * t, 1, 1, ks * ks)
    if k is None:
        kw = q.new_zeros(bsz * t, nh, ks * ks, 0)
        qt = qt[..., :0]
    else:
        kw = unfold(k.unsqueeze(2))[:, :, 0]  # (B*T, nh, k^2, dk)
    y, probs = scaled_dot_product_attention(
        qt, kw, vw, bias=bias, mask=mask, scale=1.0, backend="reference", return_attention=True
    )  # (B*T, nh, 1, dv), (B*T, nh, 1, k^2)
    y = y.reshape(bsz, h, w, nh, dv).permute(0, 3, 4, 1, 2)  # (B, nh, dv, H, W)
    if return_attention:
        return y, probs.detach().reshape(bsz, t, nh, ks * ks).transpose(1, 2)
    return y
