"""The Triton kernels of triton_axis.py (forward; backward dQ/dR/dC per query block and dK/dV per
key block), SASA's window among them (WINDOW: triton_local.py); their device functions are in
triton_parts.py. Imported only where triton is installed. The launch, the shapes and the
autograd function are in triton_axis.py."""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_parts import (
    _dot,
    _kept,
    _key_block,
    _logits,
    _offsets,
    _query_band,
    _query_stats,
    _row_band,
    _tokens,
    _tokens_t,
    _window_tables,
)


@triton.jit
def _fwd(
    Q,
    K,
    V,
    QA,
    Y,
    STATS,
    RNG,
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
    sy_t,
    sy_h,
    NH,
    T,
    H,
    W,
    DK,
    DV,
    scale,
    inv_keep,
    KS,
    BEFORE,
    DKP: tl.constexpr,
    DVP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,
    WP: tl.constexpr,
    DROP: tl.constexpr,
    PER_IMAGE: tl.constexpr,
    PREC: tl.constexpr,
    ACC: tl.constexpr,
    SPLIT_P: tl.constexpr,
    WINDOW: tl.constexpr,
):
    N: tl.constexpr = ROWS * WP
    bh = tl.program_id(1)
    b, hd = bh // NH, bh % NH
    i = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # queries
    i_ok = i < T
    dk, dv = tl.arange(0, DKP), tl.arange(0, DVP)
    n = tl.arange(0, N)
    nr, nc = n // WP, n % WP  # a key block: ROWS image rows of WP columns
    c = tl.arange(0, WP)
    qa = QA + b * sa_b + hd * sa_h  # the axis logits [R | C] of (image, head)
    q = _tokens(Q + b * sq_b + hd * sq_h, i * sq_t, i_ok, dk, DK)
    if WINDOW:
        lo, hi = _query_band(T, H, W, KS, BEFORE, BLOCK_M, ROWS)
    else:
        c_blk = _tokens(qa + H, i * sa_t, i_ok, c, W)
        lo, hi = 0, H
    row = (bh if PER_IMAGE else hd).to(tl.int64) * T + i
    m_i = tl.full((BLOCK_M,), float("-inf"), ACC)
    l_i = tl.zeros((BLOCK_M,), ACC)
    acc = tl.zeros((BLOCK_M, DVP), ACC)
    for r0 in range(lo, hi, ROWS):
        rr = r0 + tl.arange(0, ROWS)
        if WINDOW:
            r_blk, c_blk = _window_tables(qa + i[:, None] * sa_t, i, i_ok, rr, c, H, W, KS, BEFORE)
        else:
            r_blk = _tokens(qa, i * sa_t, i_ok, rr, H)
        key, k_ok = _key_block(r0, nr, nc, H, W)
        kt = _tokens_t(K + b * sk_b + hd * sk_h, key * sk_t, k_ok, dk, DK)
        s = _logits(q, kt, r_blk, c_blk, scale, k_ok, PREC, BLOCK_M, N, ACC)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if WINDOW:  # a block with no key of a query's window yet: its max is -inf
            m_new = tl.where(m_new == float("-inf"), -3.0e38, m_new)
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROP:
            p = tl.where(_kept(RNG, row, key), p, 0.0)
        vb = _tokens(V + b * sv_b + hd * sv_h, key * sv_t, k_ok, dv, DV)
        p_hi = p.to(vb.dtype)
        acc = acc * alpha[:, None] + _dot(p_hi, vb, PREC, ACC)
        if SPLIT_P:  # P = hi + lo in two low-precision products: Y as if P stayed float32
            acc += _dot((p - p_hi.to(ACC)).to(vb.dtype), vb, PREC, ACC)
        m_i = m_new
    if WINDOW:  # the rows past T saw no key (their l is 0); not stored, but kept finite
        l_i = tl.where(i_ok, l_i, 1.0)
    y = acc * (inv_keep / l_i)[:, None]
    tl.store(
        Y + b * sy_b + hd * sy_h + i[:, None] * sy_t + dv[None, :],
        y.to(Y.dtype.element_ty),
        mask=i_ok[:, None] & (dv[None, :] < DV),
    )
    # P = exp(S - m) / l, each row's max and 1 / sum kept apart: a log-sum-exp m + log l
    # rounds to the ulp of |m + log l| (a large axis logit; docs/benchmarks.md)
    tl.store(STATS + bh * T + i, m_i, mask=i_ok)
    tl.store(STATS + tl.num_programs(1) * T + bh * T + i, 1.0 / l_i, mask=i_ok)


@triton.jit
def _bwd_dq(
    Q,
    K,
    V,
    QA,
    DY,
    STATS,
    DELTA,
    DQ,
    DQA,
    RNG,
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
    sy_t,
    sy_h,
    NH,
    T,
    H,
    W,
    DK,
    DV,
    scale,
    inv_keep,
    KS,
    BEFORE,
    DKP: tl.constexpr,
    DVP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,
    WP: tl.constexpr,
    DROP: tl.constexpr,
    PER_IMAGE: tl.constexpr,
    PREC: tl.constexpr,
    ACC: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """dQ, dR, dC of one query block: dS = P o (dP - rowsum(dY o Y)); dR, dC its sums over
    the keys of each image row / column."""
    N: tl.constexpr = ROWS * WP
    bh = tl.program_id(1)
    b, hd = bh // NH, bh % NH
    i = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    i_ok = i < T
    dk, dv = tl.arange(0, DKP), tl.arange(0, DVP)
    n = tl.arange(0, N)
    nr, nc = n // WP, n % WP
    c = tl.arange(0, WP)
    qa = QA + b * sa_b + hd * sa_h
    q = _tokens(Q + b * sq_b + hd * sq_h, i * sq_t, i_ok, dk, DK)
    dy = _tokens(DY + b * sy_b + hd * sy_h, i * sy_t, i_ok, dv, DV)
    if WINDOW:
        lo, hi = _query_band(T, H, W, KS, BEFORE, BLOCK_M, ROWS)
    else:
        c_blk = _tokens(qa + H, i * sa_t, i_ok, c, W)
        lo, hi = 0, H
    m_i, inv_l, delta = _query_stats(STATS, DELTA, bh, T, i, i_ok)
    row = (bh if PER_IMAGE else hd).to(tl.int64) * T + i
    if WINDOW:  # (B, Nh, T, 2 KS) contiguous, zeroed: offsets off the image get no key
        dqa = DQA + bh * T * 2 * KS + i[:, None] * 2 * KS
    else:
        dqa = DQA + bh * T * (H + W) + i[:, None] * (H + W)  # (B, Nh, T, H + W) contiguous
    dq = tl.zeros((BLOCK_M, DKP), ACC)
    dc = tl.zeros((BLOCK_M, WP), ACC)
    for r0 in range(lo, hi, ROWS):
        rr = r0 + tl.arange(0, ROWS)
        if WINDOW:
            r_blk, c_blk = _window_tables(qa + i[:, None] * sa_t, i, i_ok, rr, c, H, W, KS, BEFORE)
        else:
            r_blk = _tokens(qa, i * sa_t, i_ok, rr, H)
        key, k_ok = _key_block(r0, nr, nc, H, W)
        kb = _tokens(K + b * sk_b + hd * sk_h, key * sk_t, k_ok, dk, DK)
        vt = _tokens_t(V + b * sv_b + hd * sv_h, key * sv_t, k_ok, dv, DV)
        s = _logits(q, tl.trans(kb), r_blk, c_blk, scale, k_ok, PREC, BLOCK_M, N, ACC)
        p = tl.exp(s - m_i[:, None]) * inv_l[:, None]
        dp = _dot(dy, vt, PREC, ACC)
        if DROP:
            dp = tl.where(_kept(RNG, row, key), dp * inv_keep, 0.0)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(kb.dtype), kb, PREC, ACC)
        ds3 = tl.reshape(ds, (BLOCK_M, ROWS, WP))
        if WINDOW:  # at each query's row offset
            dr, _ = _offsets(i, W, rr, c, BEFORE)
            r_ok = i_ok[:, None] & (dr >= 0) & (dr < KS) & (rr[None, :] < H)
            tl.store(dqa + dr, tl.sum(ds3, 2), mask=r_ok)
        else:
            tl.store(dqa + rr[None, :], tl.sum(ds3, 2), mask=i_ok[:, None] & (rr[None, :] < H))
        dc += tl.sum(ds3, 1)
    tl.store(
        DQ + bh * T * DK + i[:, None] * DK + dk[None, :],
        dq * scale,
        mask=i_ok[:, None] & (dk[None, :] < DK),
    )
    if WINDOW:  # at each query's column offset
        _, dco = _offsets(i, W, c, c, BEFORE)
        c_ok = i_ok[:, None] & (dco >= 0) & (dco < KS) & (c[None, :] < W)
        tl.store(dqa + KS + dco, dc, mask=c_ok)
    else:
        tl.store(dqa + H + c[None, :], dc, mask=i_ok[:, None] & (c[None, :] < W))


@triton.jit
def _bwd_dkdv(
    Q,
    K,
    V,
    QA,
    DY,
    STATS,
    DELTA,
    DK_,
    DV_,
    RNG,
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
    sy_t,
    sy_h,
    NH,
    T,
    H,
    W,
    DK,
    DV,
    scale,
    inv_keep,
    KS,
    BEFORE,
    DKP: tl.constexpr,
    DVP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,
    WP: tl.constexpr,
    DROP: tl.constexpr,
    PER_IMAGE: tl.constexpr,
    PREC: tl.constexpr,
    ACC: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """dK, dV of one key block (ROWS image rows), over every query block."""
    N: tl.constexpr = ROWS * WP
    bh = tl.program_id(1)
    b, hd = bh // NH, bh % NH
    r0 = tl.program_id(0) * ROWS
    dk, dv = tl.arange(0, DKP), tl.arange(0, DVP)
    qa = QA + b * sa_b + hd * sa_h  # the axis logits [R | C] of (image, head)
    n = tl.arange(0, N)
    nr, nc = n // WP, n % WP
    c = tl.arange(0, WP)
    rr = r0 + tl.arange(0, ROWS)
    key, k_ok = _key_block(r0, nr, nc, H, W)
    kb = _tokens(K + b * sk_b + hd * sk_h, key * sk_t, k_ok, dk, DK)
    vb = _tokens(V + b * sv_b + hd * sv_h, key * sv_t, k_ok, dv, DV)
    dk_acc = tl.zeros((N, DKP), ACC)
    dv_acc = tl.zeros((N, DVP), ACC)
    if WINDOW:  # the query rows whose windows reach the block, on the forward's query grid
        last = tl.minimum(r0 + ROWS, H) * W - 1
        lo, hi = _row_band(r0 * W, last, H, W, KS - 1 - BEFORE, BEFORE, 1)
        t_lo, t_hi = (lo * W // BLOCK_M) * BLOCK_M, hi * W
    else:
        t_lo, t_hi = 0, T
    for m0 in range(t_lo, t_hi, BLOCK_M):
        i = m0 + tl.arange(0, BLOCK_M)
        i_ok = i < t_hi
        q = _tokens(Q + b * sq_b + hd * sq_h, i * sq_t, i_ok, dk, DK)
        dy = _tokens(DY + b * sy_b + hd * sy_h, i * sy_t, i_ok, dv, DV)
        if WINDOW:
            r_blk, c_blk = _window_tables(qa + i[:, None] * sa_t, i, i_ok, rr, c, H, W, KS, BEFORE)
        else:
            r_blk = _tokens(qa, i * sa_t, i_ok, rr, H)
            c_blk = _tokens(qa + H, i * sa_t, i_ok, c, W)
        m_i, inv_l, delta = _query_stats(STATS, DELTA, bh, T, i, i_ok)
        s = _logits(q, tl.trans(kb), r_blk, c_blk, scale, k_ok, PREC, BLOCK_M, N, ACC)
        p = tl.where(i_ok[:, None], tl.exp(s - m_i[:, None]) * inv_l[:, None], 0.0)
        dp = _dot(dy, tl.trans(vb), PREC, ACC)
        if DROP:
            kept = _kept(RNG, (bh if PER_IMAGE else hd).to(tl.int64) * T + i, key)
            pd = tl.where(kept, p * inv_keep, 0.0)
            dp = tl.where(kept, dp * inv_keep, 0.0)
        else:
            pd = p
        dv_acc += _dot(tl.trans(pd.to(dy.dtype)), dy, PREC, ACC)
        ds = p * (dp - delta[:, None])
        dk_acc += _dot(tl.trans(ds.to(q.dtype)), q, PREC, ACC)
    out_k = DK_ + bh * T * DK + key[:, None] * DK + dk[None, :]
    tl.store(out_k, dk_acc * scale, mask=k_ok[:, None] & (dk[None, :] < DK))
    out_v = DV_ + bh * T * DV + key[:, None] * DV + dv[None, :]
    tl.store(out_v, dv_acc, mask=k_ok[:, None] & (dv[None, :] < DV))
