"""The Triton kernels of triton_local.py: SASA's k x k window attention (Ramachandran et al.
2019, eq. 3), flash-style, as the axis kernels of triton_axis_jit.py restricted to a band of
image rows: the logit of query i and key j is

    q_i . k_j + Rq[i, row(j) - row(i) + c] + Cq[i, col(j) - col(i) + c]      (c = (k - 1) // 2)

where both offsets lie in the window, and no link otherwise (keys outside the image do not
exist: padding="mask"). Rq, Cq (B, Nh, T, k): q . r_row, q . r_col per query and offset, read as
the row and column logits of the axis kernels (QA = [Rq | Cq]) by the offset, -inf outside the
window. A query block walks only the key rows its window reaches; a key block only the query
rows that reach it. Imported only where triton is installed."""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_axis_jit import _dot, _key_block, _logits, _tokens, _tokens_t


@triton.jit
def _offsets(i, W, rr, c, BEFORE):
    """Each query's row and column offsets into the window tables for key rows ``rr`` and key
    columns ``c``: (M, ROWS) and (M, WP)."""
    dr = rr[None, :] - (i // W)[:, None] + BEFORE
    dc = c[None, :] - (i % W)[:, None] + BEFORE
    return dr, dc


@triton.jit
def _tables(QA, i, i_ok, rr, c, H, W, KS, BEFORE):
    """r_blk (M, ROWS), c_blk (M, WP): the window's row and column logits of each query for key
    rows ``rr`` and columns ``c``; -inf where the offset leaves the window or the image."""
    dr, dc = _offsets(i, W, rr, c, BEFORE)
    r_ok = i_ok[:, None] & (dr >= 0) & (dr < KS) & (rr[None, :] < H)
    c_ok = i_ok[:, None] & (dc >= 0) & (dc < KS) & (c[None, :] < W)
    r_blk = tl.load(QA + dr, mask=r_ok, other=float("-inf"))
    c_blk = tl.load(QA + KS + dc, mask=c_ok, other=float("-inf"))
    return r_blk, c_blk


@triton.jit
def _row_band(first, last, H, W, BEFORE, AFTER):
    """The image rows [lo, hi) whose keys the queries ``first`` .. ``last`` (token indices) may
    see; for a key block, the query rows that may see its rows (BEFORE and AFTER swapped)."""
    return tl.maximum(first // W - BEFORE, 0), tl.minimum(last // W + AFTER + 1, H)


@triton.jit
def _aligned(lo, STEP):
    """``lo`` rounded down to the grid of STEP every kernel steps on: each logit is then
    recomputed at the same place of the same product shape, so rounded alike."""
    return (lo // STEP) * STEP


@triton.jit
def _lfwd(
    Q,
    K,
    V,
    QA,
    Y,
    STATS,
    sq_b,
    sq_h,
    sq_t,
    sk_b,
    sk_h,
    sk_t,
    sv_b,
    sv_h,
    sv_t,
    sa_b,
    sa_h,
    sa_t,
    sy_b,
    sy_h,
    sy_t,
    NH,
    T,
    H,
    W,
    DK,
    DV,
    KS,
    BEFORE,
    DKP: tl.constexpr,
    DVP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,
    WP: tl.constexpr,
    PREC: tl.constexpr,
    ACC: tl.constexpr,
    SPLIT_P: tl.constexpr,
):
    N: tl.constexpr = ROWS * WP
    bh = tl.program_id(1)
    b, hd = bh // NH, bh % NH
    m0 = tl.program_id(0) * BLOCK_M
    i = m0 + tl.arange(0, BLOCK_M)  # queries
    i_ok = i < T
    dk, dv = tl.arange(0, DKP), tl.arange(0, DVP)
    n = tl.arange(0, N)
    nr, nc = n // WP, n % WP  # a key block: ROWS image rows of WP columns
    c = tl.arange(0, WP)
    qa = QA + b * sa_b + hd * sa_h + i[:, None] * sa_t  # each query's [Rq | Cq]
    q = _tokens(Q + b * sq_b + hd * sq_h, i * sq_t, i_ok, dk, DK)
    lo, hi = _row_band(m0, tl.minimum(m0 + BLOCK_M, T) - 1, H, W, BEFORE, KS - 1 - BEFORE)
    m_i = tl.full((BLOCK_M,), float("-inf"), ACC)
    l_i = tl.zeros((BLOCK_M,), ACC)
    acc = tl.zeros((BLOCK_M, DVP), ACC)
    for r0 in range(_aligned(lo, ROWS), hi, ROWS):
        rr = r0 + tl.arange(0, ROWS)
        r_blk, c_blk = _tables(qa, i, i_ok, rr, c, H, W, KS, BEFORE)
        key, k_ok = _key_block(r0, nr, nc, H, W)
        kt = _tokens_t(K + b * sk_b + hd * sk_h, key * sk_t, k_ok, dk, DK)
        s = _logits(q, kt, r_blk, c_blk, 1.0, k_ok, PREC, BLOCK_M, N, ACC)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key of the window yet
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        vb = _tokens(V + b * sv_b + hd * sv_h, key * sv_t, k_ok, dv, DV)
        p_hi = p.to(vb.dtype)
        acc = acc * alpha[:, None] + _dot(p_hi, vb, PREC, ACC)
        if SPLIT_P:  # P = hi + lo in two low-precision products: Y as if P stayed float32
            acc += _dot((p - p_hi.to(ACC)).to(vb.dtype), vb, PREC, ACC)
        m_i = m_new
    l_i = tl.where(i_ok, l_i, 1.0)
    tl.store(
        Y + b * sy_b + hd * sy_h + i[:, None] * sy_t + dv[None, :],
        (acc / l_i[:, None]).to(Y.dtype.element_ty),
        mask=i_ok[:, None] & (dv[None, :] < DV),
    )
    tl.store(STATS + bh * T + i, m_i, mask=i_ok)
    tl.store(STATS + tl.num_programs(1) * T + bh * T + i, 1.0 / l_i, mask=i_ok)


@triton.jit
def _lbwd_dq(
    Q,
    K,
    V,
    QA,
    DY,
    STATS,
    DELTA,
    DQ,
    DQA,
    sq_b,
    sq_h,
    sq_t,
    sk_b,
    sk_h,
    sk_t,
    sv_b,
    sv_h,
    sv_t,
    sa_b,
    sa_h,
    sa_t,
    sy_b,
    sy_h,
    sy_t,
    NH,
    T,
    H,
    W,
    DK,
    DV,
    KS,
    BEFORE,
    DKP: tl.constexpr,
    DVP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,
    WP: tl.constexpr,
    PREC: tl.constexpr,
    ACC: tl.constexpr,
):
    """dQ, dRq, dCq of one query block: dS = P o (dP - rowsum(dY o Y)); dRq, dCq its sums over
    the keys of each window row / column, stored at the query's offsets (DQA zeroed: offsets
    outside the image get no key)."""
    N: tl.constexpr = ROWS * WP
    bh = tl.program_id(1)
    b, hd = bh // NH, bh % NH
    m0 = tl.program_id(0) * BLOCK_M
    i = m0 + tl.arange(0, BLOCK_M)
    i_ok = i < T
    dk, dv = tl.arange(0, DKP), tl.arange(0, DVP)
    n = tl.arange(0, N)
    nr, nc = n // WP, n % WP
    c = tl.arange(0, WP)
    qa = QA + b * sa_b + hd * sa_h + i[:, None] * sa_t
    q = _tokens(Q + b * sq_b + hd * sq_h, i * sq_t, i_ok, dk, DK)
    dy = _tokens(DY + b * sy_b + hd * sy_h, i * sy_t, i_ok, dv, DV)
    m_i = tl.load(STATS + bh * T + i, mask=i_ok, other=0.0)
    inv_l = tl.load(STATS + tl.num_programs(1) * T + bh * T + i, mask=i_ok, other=0.0)
    delta = tl.load(DELTA + bh * T + i, mask=i_ok, other=0.0)
    dqa = DQA + bh * T * 2 * KS + i[:, None] * 2 * KS  # (B, Nh, T, 2 KS) contiguous
    lo, hi = _row_band(m0, tl.minimum(m0 + BLOCK_M, T) - 1, H, W, BEFORE, KS - 1 - BEFORE)
    dq = tl.zeros((BLOCK_M, DKP), ACC)
    dc_acc = tl.zeros((BLOCK_M, WP), ACC)
    for r0 in range(_aligned(lo, ROWS), hi, ROWS):
        rr = r0 + tl.arange(0, ROWS)
        r_blk, c_blk = _tables(qa, i, i_ok, rr, c, H, W, KS, BEFORE)
        key, k_ok = _key_block(r0, nr, nc, H, W)
        kb = _tokens(K + b * sk_b + hd * sk_h, key * sk_t, k_ok, dk, DK)
        vt = _tokens_t(V + b * sv_b + hd * sv_h, key * sv_t, k_ok, dv, DV)
        s = _logits(q, tl.trans(kb), r_blk, c_blk, 1.0, k_ok, PREC, BLOCK_M, N, ACC)
        p = tl.exp(s - m_i[:, None]) * inv_l[:, None]
        ds = p * (_dot(dy, vt, PREC, ACC) - delta[:, None])
        dq += _dot(ds.to(kb.dtype), kb, PREC, ACC)
        ds3 = tl.reshape(ds, (BLOCK_M, ROWS, WP))
        dr, _ = _offsets(i, W, rr, c, BEFORE)
        r_ok = i_ok[:, None] & (dr >= 0) & (dr < KS) & (rr[None, :] < H)
        tl.store(dqa + dr, tl.sum(ds3, 2), mask=r_ok)
        dc_acc += tl.sum(ds3, 1)
    tl.store(
        DQ + bh * T * DK + i[:, None] * DK + dk[None, :],
        dq,
        mask=i_ok[:, None] & (dk[None, :] < DK),
    )
    dc = c[None, :] - (i % W)[:, None] + BEFORE
    c_ok = i_ok[:, None] & (dc >= 0) & (dc < KS) & (c[None, :] < W)
    tl.store(dqa + KS + dc, dc_acc, mask=c_ok)


@triton.jit
def _lbwd_dkdv(
    Q,
    K,
    V,
    QA,
    DY,
    STATS,
    DELTA,
    DK_,
    DV_,
    sq_b,
    sq_h,
    sq_t,
    sk_b,
    sk_h,
    sk_t,
    sv_b,
    sv_h,
    sv_t,
    sa_b,
    sa_h,
    sa_t,
    sy_b,
    sy_h,
    sy_t,
    NH,
    T,
    H,
    W,
    DK,
    DV,
    KS,
    BEFORE,
    DKP: tl.constexpr,
    DVP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,
    WP: tl.constexpr,
    PREC: tl.constexpr,
    ACC: tl.constexpr,
):
    """dK, dV of one key block (ROWS image rows), over the query rows whose windows reach it."""
    N: tl.constexpr = ROWS * WP
    bh = tl.program_id(1)
    b, hd = bh // NH, bh % NH
    r0 = tl.program_id(0) * ROWS
    dk, dv = tl.arange(0, DKP), tl.arange(0, DVP)
    n = tl.arange(0, N)
    nr, nc = n // WP, n % WP
    c = tl.arange(0, WP)
    rr = r0 + tl.arange(0, ROWS)
    key, k_ok = _key_block(r0, nr, nc, H, W)
    kb = _tokens(K + b * sk_b + hd * sk_h, key * sk_t, k_ok, dk, DK)
    vb = _tokens(V + b * sv_b + hd * sv_h, key * sv_t, k_ok, dv, DV)
    last = tl.minimum(r0 + ROWS, H) * W - 1  # the block's last key
    lo, hi = _row_band(r0 * W, last, H, W, KS - 1 - BEFORE, BEFORE)  # query rows reaching it
    dk_acc = tl.zeros((N, DKP), ACC)
    dv_acc = tl.zeros((N, DVP), ACC)
    for m0 in range(_aligned(lo * W, BLOCK_M), hi * W, BLOCK_M):
        i = m0 + tl.arange(0, BLOCK_M)
        i_ok = i < hi * W
        q = _tokens(Q + b * sq_b + hd * sq_h, i * sq_t, i_ok, dk, DK)
        dy = _tokens(DY + b * sy_b + hd * sy_h, i * sy_t, i_ok, dv, DV)
        qa = QA + b * sa_b + hd * sa_h + i[:, None] * sa_t
        r_blk, c_blk = _tables(qa, i, i_ok, rr, c, H, W, KS, BEFORE)
        m_i = tl.load(STATS + bh * T + i, mask=i_ok, other=0.0)
        inv_l = tl.load(STATS + tl.num_programs(1) * T + bh * T + i, mask=i_ok, other=0.0)
        delta = tl.load(DELTA + bh * T + i, mask=i_ok, other=0.0)
        s = _logits(q, tl.trans(kb), r_blk, c_blk, 1.0, k_ok, PREC, BLOCK_M, N, ACC)
        p = tl.exp(s - m_i[:, None]) * inv_l[:, None]  # 0 off the window: s = -inf there
        dv_acc += _dot(tl.trans(p.to(dy.dtype)), dy, PREC, ACC)
        ds = p * (_dot(dy, tl.trans(vb), PREC, ACC) - delta[:, None])
        dk_acc += _dot(tl.trans(ds.to(q.dtype)), q, PREC, ACC)
    out_k = DK_ + bh * T * DK + key[:, None] * DK + dk[None, :]
    tl.store(out_k, dk_acc, mask=k_ok[:, None] & (dk[None, :] < DK))
    out_v = DV_ + bh * T * DV + key[:, None] * DV + dv[None, :]
    tl.store(out_v, dv_acc, mask=k_ok[:, None] & (dv[None, :] < DV))
