"""Separable position-only attention on sequence-first tokens, attention dropout included.

For the encodings whose softmax factorizes per head (quadratic eq. 9, learned relative row +
column tables; see kernels/separable.py), P_h = R_h (x) C_h, and the layer (eq. 1-2) is

    MHSA(X) = sum_h Dropout(P_h) X Wval^(h) Wout^(h) + bout.

Tokens are laid out (T, B, C) = (H, W, B, C) row-major, so that every step is a plain GEMM on
contiguous memory and the output is already the next layer's input:

    X1 = R X         (Nh*H, H) @ (H, W*B*C)          row operator, one GEMM
    X2 = C X1        (Nh, H) batches of (W, W) @ (W, B*C)  column operator
    Y  = sum_h X2_h W_h^T + b                         the value/output map, Nh accumulating GEMMs

Attention dropout keeps the factorization: with D the set of dropped links (each link (h, q, k)
dropped with probability p, independently, as ``nn.Dropout`` draws them),

    Dropout(P) X = (P X - (P o 1_D) X) / (1 - p),

and (P o 1_D) X is a sparse product over about p * Nh * T^2 links, run as ``F.embedding_bag``
(bags = (head, query[, image]) rows, weights = P's values at the dropped links, gathered from R
and C so that their gradients reach the encoding); its backward is the scatter of dX and the
sampled dot products dP at the dropped links. ``plain_attention`` is the dense equation the tests
hold every path to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..first_order import MESSAGE, HigherOrderGradError, compiling
from ..functional import dropped_links
from ..precision import autocast_dtype, no_autocast
from .separable import axis_softmax

__all__ = [
    "dropped_links",
    "head_sum_linear",
    "plain_attention",
    "position_attention",
    "separable_head_sum",
]


def separable_tokens(r: torch.Tensor, c: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """sum_k P_h[q, k] x_h[k] for every head: r (Nh, H, H), c (Nh, W, W) row-stochastic, x
    (Nh|1, H, W, N) (1: every head reads the same values) -> (Nh, H, W, N). The row operator is
    one GEMM (Nh batched ones for per-head values), the column one Nh*H small ones."""
    nh, h = r.shape[0], r.shape[1]
    w, n = x.shape[2], x.shape[3]
    if x.shape[0] == 1:
        x1 = r.reshape(nh * h, h) @ x.reshape(h, w * n)  # rows: R_h x
    else:
        x1 = torch.matmul(r, x.reshape(nh, h, w * n))
    return torch.matmul(c[:, None], x1.view(nh, h, w, n))  # (Nh, H, W, N) columns: C_h (R_h x)


def dropped_product(
    r: torch.Tensor, c: torch.Tensor, x: torch.Tensor, drop: torch.Tensor, sign: float = 1.0
) -> torch.Tensor:
    """sign * (P o 1_D) x: r (Nh, H, H), c (Nh, W, W), x (Nh|1, H, W, B, C), drop (Nh, T, T) or
    (B, Nh, T, T) -> (Nh, H, W, B, C), a sparse product over the dropped links only."""
    nh, h = r.shape[0], r.shape[1]
    w, b, ch = x.shape[2], x.shape[3], x.shape[4]
    t, per_head = h * w, x.shape[0] > 1
    if drop.dim() == 3:  # shared by the batch: bags (h, q), rows of x (Nh|1 * T, B*C)
        head, q, k = drop.nonzero(as_tuple=True)
        table, cols, bag = x.reshape(-1, b * ch), k, head * t + q
    else:  # a mask per image: bags (h, q, b), rows of x (Nh|1 * T*B, C)
        head, q, img, k = drop.permute(1, 2, 0, 3).nonzero(as_tuple=True)  # sorted (h, q, b)
        table, cols, bag = x.reshape(-1, ch), k * b + img, (head * t + q) * b + img
    if per_head:
        cols = cols + head * (t if drop.dim() == 3 else t * b)
    vals = r[head, q // w, k // w] * c[head, q % w, k % w]  # P_h[q, k] at the dropped links
    if sign != 1.0:
        vals = vals * sign
    nbags = nh * t * (1 if drop.dim() == 3 else b)
    offsets = torch.searchsorted(bag, torch.arange(nbags, device=bag.device))  # bag is sorted
    y = F.embedding_bag(cols, table, offsets, mode="sum", per_sample_weights=vals.to(x.dtype))
    return y.view(nh, h, w, b, ch)


def position_attention(
    r: torch.Tensor, c: torch.Tensor, x: torch.Tensor, drop: torch.Tensor | None = None
) -> torch.Tensor:
    """(P_h o keep) x_h for every head, UNSCALED (the caller folds 1 / (1 - p) into the output
    map, one scalar on a small matrix instead of a pass over the heads): x (Nh|1, H, W, B, C)
    -> (Nh, H, W, B, C); ``drop`` from ``dropped_links`` (None: no dropout).

    No dropout: the separable row then column operators. A mask shared by the batch: P o keep
    is one dense (Nh*T, T) matrix for the whole batch and one GEMM against x (T, B*C), measured
    faster on CPU than the separable product plus its sparse correction, whose Nh*T*B*C-sized
    passes are memory-bound (benchmarks/results/batch_mask_ab.md, measured by `python
    benchmarks/batch_mask_ab.py`).
    A mask per image: separable product minus the sparse term."""
    g, h, w, b, ch = x.shape
    nh, t = r.shape[0], h * w
    r, c = r.to(x.dtype), c.to(x.dtype)
    if drop is not None and drop.dim() == 3:
        p = (r[:, :, None, :, None] * c[:, None, :, None, :]).reshape(nh, t, t)
        p = p.masked_fill(drop, 0.0)  # (Nh, T, T) kept links, shared by the batch
        if g == 1:
            y = p.view(nh * t, t) @ x.reshape(t, b * ch)
        else:
            y = torch.matmul(p, x.reshape(nh, t, b * ch))
        return y.view(nh, h, w, b, ch)
    if drop is None:
        y = separable_tokens(r, c, x.reshape(g, h, w, b * ch))  # (Nh, H, W, B*C)
        return y.view(nh, h, w, b, ch)
    if compiling():  # the sparse term's links are data-dependent: each image's P o keep, dense
        p = (r[:, :, None, :, None] * c[:, None, :, None, :]).reshape(nh, t, t)
        p = p.masked_fill(drop, 0.0)  # (B, Nh, T, T)
        xs = x.reshape(g, t, b, ch).permute(2, 0, 1, 3)  # (B, Nh|1, T, C)
        return torch.matmul(p, xs).permute(1, 2, 0, 3).reshape(nh, h, w, b, ch)
    return separable_minus_dropped(r, c, x, drop)


def separable_minus_dropped(
    r: torch.Tensor, c: torch.Tensor, x: torch.Tensor, drop: torch.Tensor
) -> torch.Tensor:
    """(P o keep) x = P x - (P o 1_D) x, UNSCALED: the separable product minus the sparse one over
    the dropped links; shapes as ``position_attention``, drop (Nh, T, T) or (B, Nh, T, T)."""
    g, h, w, b, ch = x.shape
    # In x's dtype, autocast off: in bfloat16 the difference of the two rounded products
    # erred past the plain path (docs/benchmarks.md, "Figures behind the code's comments"). The
    # sparse term has negated weights and is added in place to y itself (not a view): the
    # backward neither copies nor negates.
    with no_autocast(x.device.type):
        y = separable_tokens(r, c, x.reshape(g, h, w, b * ch))
        y = y.add_(dropped_product(r, c, x, drop, sign=-1.0).view(y.shape))
    return y.view(r.shape[0], h, w, b, ch)


class _HeadSumLinear(torch.autograd.Function):
    """y = sum_h heads[h] W_h^T + b with a backward that writes dheads[h] = dy W_h straight into
    one (Nh, N, D) tensor (autograd through unbind would stack Nh separate gradients)."""

    @staticmethod
    def forward(ctx, heads, weight, bias):
        nh = heads.shape[0]
        ws = weight.view(weight.shape[0], nh, -1).unbind(1)  # Nh x (Dout, D) strided views
        y = heads[0] @ ws[0].t() if bias is None else torch.addmm(bias, heads[0], ws[0].t())
        for h in range(1, nh):
            y.addmm_(heads[h], ws[h].t())  # accumulates in the GEMM (beta = 1)
        ctx.save_for_backward(heads, weight)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, gy):
        heads, weight = ctx.saved_tensors
        nh, d = heads.shape[0], heads.shape[2]
        ws = weight.view(weight.shape[0], nh, d).unbind(1)
        gh = gw = gb = None
        if ctx.needs_input_grad[0]:
            gh = heads.new_empty(heads.shape, dtype=gy.dtype)
            for h in range(nh):
                torch.mm(gy, ws[h].to(gy.dtype), out=gh[h])
        if ctx.needs_input_grad[1]:
            gw = torch.cat([gy.t() @ heads[h].to(gy.dtype) for h in range(nh)], dim=1)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = gy.sum(0)
        return gh, gw, gb


def head_sum_linear(
    heads: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """sum_h heads[h] W_h^T + b: heads (Nh, N, D), weight (Dout, Nh*D) -> (N, Dout), Nh GEMMs
    accumulating into one output (the concat_h of eq. 1 never built). Under autocast it runs in
    the autocast dtype, as ``F.linear`` would."""
    dev = heads.device.type
    if torch.is_autocast_enabled(dev):
        dt = autocast_dtype(dev, heads.dtype)
        heads, weight = heads.to(dt), weight.to(dt)
        bias = None if bias is None else bias.to(dt)
    else:
        weight = weight.to(heads.dtype)
        bias = None if bias is None else bias.to(heads.dtype)
    with no_autocast(dev):
        return _HeadSumLinear.apply(heads.contiguous(), weight, bias)


BLOCK_BYTES = 1 << 19  # one image block of x: 512 KiB, a core's L2
BLOCK_MAX_THREADS = 1  # more threads: the whole batch (its GEMMs split better over the cores)
# Both set by benchmarks/results/head_sum_blocks.md, with the commands that measured them
# (docs/benchmarks.md, "Training throughput of the paper models").


def image_blocks(x: torch.Tensor) -> list[tuple[int, int]]:
    """[i0, i1) ranges over the images of x (Nh|1, H, W, B, D) such that one head's block,
    H*W*(i1 - i0)*D values, fits BLOCK_BYTES (at least one image), on a CPU running at most
    BLOCK_MAX_THREADS threads; else one range, the batch (the blocks measured faster a training
    step of grid_long's model at one thread, not at two: benchmarks/results/head_sum_blocks.md)."""
    h, w, b, d = x.shape[1:]
    # an export traces this loop with a symbolic batch: one block, else it fixes the batch
    one = x.device.type != "cpu" or torch.get_num_threads() > BLOCK_MAX_THREADS
    if one or torch.compiler.is_exporting():
        return [(0, b)]
    n = max(1, BLOCK_BYTES // max(1, h * w * d * x.element_size()))
    return [(i, min(b, i + n)) for i in range(0, b, n)]


def head_sum_forward(r, c, x, weight, bias):
    """``_SeparableHeadSum``'s forward (no autograd): shapes as ``separable_head_sum``."""
    nh, h, w = r.shape[0], r.shape[1], c.shape[1]
    g, b, d = x.shape[0], x.shape[3], x.shape[4]
    ws = weight.view(weight.shape[0], nh, d)
    blocks = image_blocks(x)
    y = x.new_empty(h, w, b, weight.shape[0]) if len(blocks) > 1 else None
    for i0, i1 in blocks:
        xb = x[:, :, :, i0:i1].contiguous()  # (Nh|1, H, W, Bb, D), x itself if one block
        n = (i1 - i0) * d
        yb = None
        for k in range(nh):
            xk = xb[k if g > 1 else 0].view(h, w * n)
            x2 = torch.bmm(c[k].expand(h, w, w), (r[k] @ xk).view(h, w, n))  # C_h R_h x_h
            x2 = x2.view(-1, d)
            if yb is None:
                yb = x2 @ ws[:, k].t() if bias is None else torch.addmm(bias, x2, ws[:, k].t())
            else:
                yb.addmm_(x2, ws[:, k].t())  # accumulates in the GEMM (beta = 1)
        if y is None:
            y = yb
        else:
            y[:, :, i0:i1] = yb.view(h, w, i1 - i0, -1)
    return y.view(h * w * b, -1)


def head_sum_backward(gy, r, c, x, weight):
    """``_SeparableHeadSum``'s gradients of r, c, x and weight (first order; the bias's is
    gy.sum(0)), each head's row and column products recomputed."""
    nh, h, w = r.shape[0], r.shape[1], c.shape[1]
    g, b, d = x.shape[0], x.shape[3], x.shape[4]
    dout = weight.shape[0]
    ws = weight.view(dout, nh, d)
    acc = torch.promote_types(x.dtype, torch.float32)  # dR_h, dC_h: sums over the images
    gr = torch.zeros(r.shape, dtype=acc, device=r.device)
    gc = torch.zeros(c.shape, dtype=acc, device=c.device)
    gw = torch.empty(nh, dout, d, dtype=weight.dtype, device=weight.device)
    gx = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # (shared values: summed)
    gy4, blocks = gy.view(h, w, b, dout), image_blocks(x)
    for i0, i1 in blocks:
        xb = x[:, :, :, i0:i1].contiguous()
        gyb = gy4[:, :, i0:i1].reshape(-1, dout)  # (H*W*Bb, Dout)
        gxb = gx if len(blocks) == 1 else torch.empty_like(xb)
        n, beta = (i1 - i0) * d, 1.0 if i0 > 0 else 0.0  # the first block overwrites dW
        for k in range(nh):
            xk = xb[k if g > 1 else 0].view(h, w * n)
            x1 = (r[k] @ xk).view(h, w, n)  # recomputed: R_h x_h
            x2 = torch.bmm(c[k].expand(h, w, w), x1)  # C_h R_h x_h (H, W, N)
            gw[k].addmm_(gyb.t(), x2.view(-1, d), beta=beta)  # dW_h = dy^T y_h
            g2 = (gyb @ ws[:, k]).view(h, w, n)  # d(C_h R_h x_h)
            gc[k] += torch.bmm(g2, x1.transpose(1, 2)).sum(0, dtype=acc)
            g1 = torch.bmm(c[k].t().expand(h, w, w), g2).view(h, w * n)  # d(R_h x_h)
            gr[k] += g1 @ xk.t()
            if g > 1 or k == 0:
                torch.mm(r[k].t(), g1, out=gxb[k].view(h, w * n))
            else:  # the heads' sum accumulates in the GEMM (beta = 1), as the forward's
                gxb[0].view(h, w * n).addmm_(r[k].t(), g1)
        if gxb is not gx:
            gx[:, :, :, i0:i1] = gxb
    gw = gw.permute(1, 0, 2).reshape(weight.shape)
    return gr.to(r.dtype), gc.to(c.dtype), gx, gw


class _SeparableHeadSum(torch.autograd.Function):
    """y = sum_h (R_h (x) C_h) x_h W_h^T + b one image block and one head at a time (eq. 9
    factorized, eq. 1's concat_h and Wout never built): a head's row and column products
    (H*W*Bblock*D each) stay in L2 instead of Nh of them streaming through memory, and backward
    recomputes them instead of keeping them (``image_blocks``; per head, and per image block,
    measured faster than the composition: docs/benchmarks.md, "Figures behind the code's
    comments" and "Training throughput of the paper models"). The plain
    composition: ``separable_tokens`` then ``head_sum_linear``. r (Nh, H, H), c (Nh, W, W),
    x (Nh|1, H, W, B, D), weight (Dout, Nh*D), bias (Dout,) or None, all one dtype ->
    (H*W*B, Dout)."""

    @staticmethod
    def forward(ctx, r, c, x, weight, bias):
        ctx.save_for_backward(r, c, x, weight)
        ctx.has_bias = bias is not None
        return head_sum_forward(r, c, x, weight, bias)

    @staticmethod
    def backward(ctx, gy):
        if torch.is_grad_enabled():  # create_graph: the GEMMs below write in place (out=)
            raise HigherOrderGradError(
                MESSAGE.format(what="the one-head-at-a-time position attention (backend None)")
            )
        gr, gc, gx, gw = head_sum_backward(gy, *ctx.saved_tensors)
        return gr, gc, gx, gw, gy.sum(0) if ctx.has_bias else None


def separable_head_sum(
    r: torch.Tensor,
    c: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """sum_h P_h x_h W_h^T + b with P_h = R_h (x) C_h, no dropout: r (Nh, H, H), c (Nh, W, W)
    row-stochastic, x (Nh|1, H, W, B, D) (1: every head reads the same values), weight (Dout,
    Nh*D) -> (H*W*B, Dout); ``head_sum_linear(position_attention(r, c, x), ...)`` one head at a
    time (_SeparableHeadSum). Under autocast it runs in the autocast dtype, as ``F.linear``."""
    dev = x.device.type
    dt = autocast_dtype(dev, x.dtype)
    r, c, x, weight = (t.to(dt) for t in (r, c, x, weight))
    bias = None if bias is None else bias.to(dt)
    with no_autocast(dev):
        if compiling():  # the same kernel as one custom op (kernels/ops.py)
            return torch.ops.attnconv.separable_head_sum(r, c, x, weight, bias)
        return _SeparableHeadSum.apply(r, c, x, weight, bias)


def plain_attention(
    r: torch.Tensor,
    c: torch.Tensor,
    x: torch.Tensor,
    drop: torch.Tensor | None = None,
    p: float = 0.0,
) -> torch.Tensor:
    """The dense equation, for tests: P = R (x) C (Nh, T, T), keep = not drop scaled 1/(1-p),
    y[h, q, b] = sum_k P'[h, q, (b), k] x_h[k, b]; x (Nh|1, H, W, B, C) -> (Nh, H, W, B, C)."""
    nh, h, w = r.shape[0], r.shape[1], c.shape[1]
    b, ch = x.shape[3], x.shape[4]
    p_dense = (r[:, :, None, :, None] * c[:, None, :, None, :]).reshape(nh, h * w, h * w)
    xs = x.reshape(x.shape[0], h * w, b, ch).expand(nh, -1, -1, -1)
    keep = torch.ones(nh, h * w, b, h * w, dtype=x.dtype)
    if drop is not None:
        d = drop.permute(1, 2, 0, 3) if drop.dim() == 4 else drop[:, :, None].expand(-1, -1, b, -1)
        keep = (~d).to(x.dtype) / (1 - p)
    y = torch.einsum("hqk,hqbk,hkbc->hqbc", p_dense, keep, xs)
    return y.reshape(nh, h, w, b, ch)


def separable_projected(v, term, grid, weight, bias, *, p_drop=0.0, per_image=True):
    """The layer's attention and output map on tokens (plan.TABLE's "separable_tokens"):
    v (Nh|1, H, W, B, Dv) values (1: every head reads the raw input), the term's row and column
    logits, ``weight`` (Cout, Nh*Dv) and ``bias`` of the output projection ->
    sum_h Dropout(P_h) v_h Wout_h^T + b, (H, W, B, Cout); the links of functional.dropped_links
    (``per_image``: a mask per image, else one for the batch)."""
    _, h, w, b, dv = v.shape
    nh = weight.shape[1] // dv
    row, col = term.axes(grid.dtype)
    r, c = axis_softmax(row.to(v.device)), axis_softmax(col.to(v.device))
    if p_drop == 0:  # one head at a time, sum_h P_h v_h Wout_h + b (eq. 9 factorized, eq. 1)
        return separable_head_sum(r, c, v, weight, bias).view(h, w, b, -1)
    drop = dropped_links(nh, h * w, b if per_image else None, p_drop, v.device)
    y = position_attention(r, c, v, drop)  # (Nh, H, W, B, Dv), unscaled
    y = head_sum_linear(y.view(nh, h * w * b, dv), weight / (1.0 - p_drop), bias)
    return y.view(h, w, b, -1)
