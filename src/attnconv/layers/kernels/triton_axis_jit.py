"""The Triton kernels of triton_axis.py (forward; backward dQ/dR/dC per query block and dK/dV per
key block), SASA's window among them (WINDOW: triton_local.py); their device functions are in
triton_parts.py. Imported only where triton is installed. The launch, the shapes and the
autograd function are in triton_axis.py."""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_parts import (
    _dot,
    _inside,
    _kept,
    _key_band,
    _key_block,
    _logits,
    _low,
    _offsets,
    _query_band,
    _query_stats,
    _query_tile,
    _step,
    _tokens,
    _tokens_t,
    _window_partials,
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
    SC,
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
    SHIFT,
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
    N: tl.constexpr = ROWS * WP
    if ACC == tl.float64:  # a float argument is fp32 on a GPU: float64's exact values from SC
        scale, inv_keep = tl.load(SC), tl.load(SC + 1)
    bh = tl.program_id(1)
    b, hd = bh // NH, bh % NH
    t0 = tl.program_id(0)
    i, i_ok = _query_tile(t0, T, H, W, BLOCK_M, WP, WINDOW)  # queries
    dk, dv = tl.arange(0, DKP), tl.arange(0, DVP)
    n = tl.arange(0, N)
    nr, nc = n // WP, n % WP  # a key block: ROWS image rows of WP columns
    qa = QA + b * sa_b + hd * sa_h  # the axis logits [R | C] of (image, head)
    q = _tokens(Q + b * sq_b + hd * sq_h, i * sq_t, i_ok, dk, DK)
    if WINDOW:  # the key blocks its windows reach
        r_lo, down, c_lo, across = _query_band(t0, H, W, KS, BEFORE, SHIFT, BLOCK_M, ROWS, WP)
        s_hi, s_step = down * across, 1
    else:  # every key row, ROWS a step; one block column, the whole (padded) row
        c_blk = _tokens(qa + H, i * sa_t, i_ok, tl.arange(0, WP), W)
        r_lo, c_lo, down, s_hi, s_step = 0, 0, 1, H, ROWS
    row = (bh if PER_IMAGE else hd).to(tl.int64) * T + i
    m_i = tl.full((BLOCK_M,), float("-inf"), ACC)
    l_i = tl.zeros((BLOCK_M,), ACC)
    acc = tl.zeros((BLOCK_M, DVP), ACC)
    for step in range(0, s_hi, s_step):
        r0, c0 = _step(step, r_lo, c_lo, down, ROWS, WP, WINDOW)
        c = c0 + tl.arange(0, WP)
        rr = r0 + tl.arange(0, ROWS)
        if WINDOW:
            qai = qa + i[:, None] * sa_t
            r_blk, c_blk = _window_tables(qai, i, i_ok, rr, c, H, W, KS, BEFORE)
        else:
            r_blk = _tokens(qa, i * sa_t, i_ok, rr, H)
        key, k_ok = _key_block(r0, c0, nr, nc, H, W, WINDOW)
        # K loaded as the backward kernels load it, its transpose taken here: the backward's
        # logits, so its P, then equal these to the bit (K^T loaded transposed here is another
        # operand layout, which a BLAS may sum in another order: docs/benchmarks.md, Spills)
        kb = _tokens(K + b * sk_b + hd * sk_h, key * sk_t, k_ok, dk, DK)
        s = _logits(q, tl.trans(kb), r_blk, c_blk, scale, k_ok, PREC, BLOCK_M, N, ACC)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row with no finite logit yet (no key of its window, or axis logits at -inf in the
        # first blocks): its max is -inf, and exp(-inf - -inf) would be NaN
        m_new = tl.where(m_new == float("-inf"), -3.0e38, m_new)
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROP:
            p = tl.where(_kept(RNG, row, key), p, 0.0)
        vb = _tokens(V + b * sv_b + hd * sv_h, key * sv_t, k_ok, dv, DV)
        acc = acc * alpha[:, None] + _dot(_low(p, vb.dtype), vb, PREC, ACC)
        m_i = m_new
    if WINDOW:  # the rows past T saw no key (their l is 0); not stored, but kept finite
        l_i = tl.where(i_ok, l_i, 1.0)
    y = acc * (inv_keep / l_i)[:, None]
    tl.store(
        Y + b * sy_b + hd * sy_h + i[:, None] * sy_t + dv[None, :],
        _low(y, Y.dtype.element_ty),
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
    SC,
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
    SHIFT,
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
    DELTA_PASS: tl.constexpr,
):
    """dQ, dR, dC of one query block: dS = P o (dP - delta); dR, dC its sums over the keys
    of each image row / column. DELTA_PASS: the pass before, delta = rowsum(P o dP) / rowsum(P)
    from the probabilities this backward recomputes (into DELTA), not flash attention's
    rowsum(dY o Y): Y's rounding does not cancel against them, and dividing by rowsum(P) makes
    each row of dS sum to 0 as it does exactly (a 1 x N image's row-logit gradient, 0, came
    out past the plain path's error in fp32: docs/benchmarks.md, "Figures behind the code's
    comments")."""
    N: tl.constexpr = ROWS * WP
    if ACC == tl.float64:  # a float argument is fp32 on a GPU: float64's exact values from SC
        scale, inv_keep = tl.load(SC), tl.load(SC + 1)
    bh = tl.program_id(1)
    b, hd = bh // NH, bh % NH
    t0 = tl.program_id(0)
    i, i_ok = _query_tile(t0, T, H, W, BLOCK_M, WP, WINDOW)
    dk, dv = tl.arange(0, DKP), tl.arange(0, DVP)
    n = tl.arange(0, N)
    nr, nc = n // WP, n % WP
    qa = QA + b * sa_b + hd * sa_h
    q = _tokens(Q + b * sq_b + hd * sq_h, i * sq_t, i_ok, dk, DK)
    dy = _tokens(DY + b * sy_b + hd * sy_h, i * sy_t, i_ok, dv, DV)
    if WINDOW:  # the key blocks its windows reach
        r_lo, down, c_lo, across = _query_band(t0, H, W, KS, BEFORE, SHIFT, BLOCK_M, ROWS, WP)
        s_hi, s_step = down * across, 1
    else:
        c_blk = _tokens(qa + H, i * sa_t, i_ok, tl.arange(0, WP), W)
        r_lo, c_lo, down, s_hi, s_step = 0, 0, 1, H, ROWS
    m_i, inv_l, delta = _query_stats(STATS, DELTA, bh, T, i, i_ok)
    row = (bh if PER_IMAGE else hd).to(tl.int64) * T + i
    if WINDOW:  # (B, Nh, T, (P + 1) KS) contiguous, zeroed (offsets off the image get no key):
        # P partial row-logit gradients, one per block column (window_dqa adds them), then C's
        parts = _window_partials(KS, WP)
        dqa = DQA + (bh * T + i[:, None]) * (parts + 1) * KS
    else:
        dqa = DQA + bh * T * (H + W) + i[:, None] * (H + W)  # (B, Nh, T, H + W) contiguous
    dq = tl.zeros((BLOCK_M, DKP), ACC)
    dc = tl.zeros((BLOCK_M, WP), ACC)
    pdp = tl.zeros((BLOCK_M,), ACC)  # the delta pass's sum_j P dP and sum_j P
    psum = tl.zeros((BLOCK_M,), ACC)
    for step in range(0, s_hi, s_step):
        r0, c0 = _step(step, r_lo, c_lo, down, ROWS, WP, WINDOW)
        c = c0 + tl.arange(0, WP)
        rr = r0 + tl.arange(0, ROWS)
        if WINDOW:
            qai = qa + i[:, None] * sa_t
            r_blk, c_blk = _window_tables(qai, i, i_ok, rr, c, H, W, KS, BEFORE)
        else:
            r_blk = _tokens(qa, i * sa_t, i_ok, rr, H)
        key, k_ok = _key_block(r0, c0, nr, nc, H, W, WINDOW)
        kb = _tokens(K + b * sk_b + hd * sk_h, key * sk_t, k_ok, dk, DK)
        vt = _tokens_t(V + b * sv_b + hd * sv_h, key * sv_t, k_ok, dv, DV)
        s = _logits(q, tl.trans(kb), r_blk, c_blk, scale, k_ok, PREC, BLOCK_M, N, ACC)
        p = tl.exp(s - m_i[:, None]) * inv_l[:, None]
        dp = _dot(dy, vt, PREC, ACC)
        if DROP:
            dp = tl.where(_kept(RNG, row, key), dp * inv_keep, 0.0)
        if DELTA_PASS:
            pdp += tl.sum(p * dp, 1)
            psum += tl.sum(p, 1)
        else:
            ds = p * (dp - delta[:, None])
            dq += _dot(_low(ds, kb.dtype), kb, PREC, ACC)
            ds3 = tl.reshape(ds, (BLOCK_M, ROWS, WP))
            if WINDOW:  # at each query's row offset, this block column's part
                dr, _ = _offsets(i, W, rr, c, BEFORE)
                part = dqa + (step // down) * KS
                tl.store(part + dr, tl.sum(ds3, 2), mask=_inside(i_ok, dr, rr, KS, H))
            else:
                r_ok = i_ok[:, None] & (rr[None, :] < H)
                tl.store(dqa + rr[None, :], tl.sum(ds3, 2), mask=r_ok)
            dc += tl.sum(ds3, 1)
            if WINDOW:  # a block column done: at each query's column offset
                if step % down == down - 1:
                    _, dco = _offsets(i, W, c, c, BEFORE)
                    tl.store(dqa + parts * KS + dco, dc, mask=_inside(i_ok, dco, c, KS, W))
                    dc = tl.zeros((BLOCK_M, WP), ACC)
    if DELTA_PASS:
        psum = tl.where(i_ok, psum, 1.0)
        if ACC == tl.float64:
            delta = pdp / psum
        else:  # rounded to nearest: a GPU's '/' is an approximate division (2 ulp)
            delta = tl.math.div_rn(pdp, psum)
        tl.store(DELTA + bh * T + i, delta, mask=i_ok)
    else:
        tl.store(
            DQ + bh * T * DK + i[:, None] * DK + dk[None, :],
            dq * scale,
            mask=i_ok[:, None] & (dk[None, :] < DK),
        )
        if not WINDOW:
            c = tl.arange(0, WP)
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
    SC,
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
    SHIFT,
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
    """dK, dV of one key block (ROWS image rows; WINDOW: of WP columns), over the query blocks
    that reach it."""
    N: tl.constexpr = ROWS * WP
    if ACC == tl.float64:  # a float argument is fp32 on a GPU: float64's exact values from SC
        scale, inv_keep = tl.load(SC), tl.load(SC + 1)
    bh = tl.program_id(1)
    b, hd = bh // NH, bh % NH
    dk, dv = tl.arange(0, DKP), tl.arange(0, DVP)
    qa = QA + b * sa_b + hd * sa_h  # the axis logits [R | C] of (image, head)
    n = tl.arange(0, N)
    nr, nc = n // WP, n % WP
    if WINDOW:  # key blocks on the grid from (-SHIFT, -SHIFT), those that touch the image
        first_r, first_c = SHIFT // ROWS, SHIFT // WP
        cols = tl.cdiv(W + SHIFT, WP) - first_c
        r0 = (tl.program_id(0) // cols + first_r) * ROWS - SHIFT
        c0 = (tl.program_id(0) % cols + first_c) * WP - SHIFT
        tr_lo, tr_hi, tc_lo, tc_hi = _key_band(r0, c0, H, W, KS, BEFORE, BLOCK_M, ROWS, WP)
        across = tc_hi - tc_lo  # the query tiles reaching it, one flat loop
        t_hi, t_step = (tr_hi - tr_lo) * across, 1
    else:  # ROWS whole image rows, walked by every query block
        r0, c0 = tl.program_id(0) * ROWS, 0
        t_hi, t_step = T, BLOCK_M
    c = c0 + tl.arange(0, WP)
    rr = r0 + tl.arange(0, ROWS)
    key, k_ok = _key_block(r0, c0, nr, nc, H, W, WINDOW)
    kb = _tokens(K + b * sk_b + hd * sk_h, key * sk_t, k_ok, dk, DK)
    vb = _tokens(V + b * sv_b + hd * sv_h, key * sv_t, k_ok, dv, DV)
    dk_acc = tl.zeros((N, DKP), ACC)
    dv_acc = tl.zeros((N, DVP), ACC)
    for t in range(0, t_hi, t_step):
        if WINDOW:
            t0 = (tr_lo + t // across) * tl.cdiv(W, WP) + tc_lo + t % across
            i, i_ok = _query_tile(t0, T, H, W, BLOCK_M, WP, WINDOW)
        else:
            i = t + tl.arange(0, BLOCK_M)
            i_ok = i < T
        q = _tokens(Q + b * sq_b + hd * sq_h, i * sq_t, i_ok, dk, DK)
        dy = _tokens(DY + b * sy_b + hd * sy_h, i * sy_t, i_ok, dv, DV)
        if WINDOW:
            qai = qa + i[:, None] * sa_t
            r_blk, c_blk = _window_tables(qai, i, i_ok, rr, c, H, W, KS, BEFORE)
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
        dv_acc += _dot(tl.trans(_low(pd, dy.dtype)), dy, PREC, ACC)
        ds = p * (dp - delta[:, None])
        dk_acc += _dot(tl.trans(_low(ds, q.dtype)), q, PREC, ACC)
    out_k = DK_ + bh * T * DK + key[:, None] * DK + dk[None, :]
    tl.store(out_k, dk_acc * scale, mask=k_ok[:, None] & (dk[None, :] < DK))
    out_v = DV_ + bh * T * DV + key[:, None] * DV + dv[None, :]
    tl.store(out_v, dv_acc, mask=k_ok[:, None] & (dv[None, :] < DV))
