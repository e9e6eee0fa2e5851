"""The Triton kernels of triton_axis.py (forward; backward dQ/dR/dC per query block and dK/dV per
key block), their counter-hash dropout and their products; imported only where triton is
installed. The launch, the shapes and the autograd function are in triton_axis.py."""

from __future__ import annotations

import os

import triton
import triton.language as tl

# read once, as triton.jit reads it; a constexpr, the only kind of global a compiled kernel may read
INTERPRET = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def _h32(x):  # functional._h32 / hash.h's h32, in uint32 arithmetic
    x ^= x >> 16
    x *= 0x21F0AAAD
    x ^= x >> 15
    x *= 0x735A2D97
    x ^= x >> 15
    return x


@triton.jit
def _kept(rng, row, key):
    """(M, N) links kept by dropout: row (M,) int64 = (b Nh + h) T + i, key (N,) indices."""
    seed = tl.load(rng).to(tl.uint32)
    threshold = tl.load(rng + 1).to(tl.uint32)
    k_row = _h32(_h32(row.to(tl.uint32) ^ seed) ^ (row >> 32).to(tl.uint32))
    return _h32(k_row[:, None] ^ key.to(tl.uint32)[None, :]) >= threshold


@triton.jit
def _dot(a, b, PREC: tl.constexpr, ACC: tl.constexpr):
    """a @ b accumulated in ACC; bfloat16/float16 operands multiply exactly in float32 (their
    products fit): the same sum on a GPU's tensor cores and under the interpreter, whose
    low-precision tl.dot misreads bfloat16. float64 (gradcheck) multiplies in registers, in
    small blocks (``_meta``)."""
    if ACC == tl.float64:  # no float64 tl.dot on NVIDIA GPUs: the products summed here
        return tl.sum(a.to(tl.float64)[:, :, None] * b.to(tl.float64)[None, :, :], axis=1)
    if INTERPRET and a.dtype != tl.float32:
        a, b = a.to(tl.float32), b.to(tl.float32)
    return tl.dot(a, b, input_precision=PREC, out_dtype=ACC)


@triton.jit
def _logits(
    q,
    kt,
    r_blk,
    c_blk,
    scale,
    k_ok,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    N: tl.constexpr,
    ACC: tl.constexpr,
):
    """(M, N) scale q.k + R[q, row(k)] + C[q, col(k)]; keys outside the image at -inf."""
    s = _dot(q, kt, PREC, ACC) * scale
    s += tl.reshape(r_blk[:, :, None] + c_blk[:, None, :], (BLOCK_M, N))
    return tl.where(k_ok[None, :], s, float("-inf"))


@triton.jit
def _tokens(PTR, tok, tok_ok, d, D):
    """(M, Dp) block of a token-major tensor: PTR at (image, head), rows = tokens ``tok``
    (stride 1 in d), the columns d < D; zeros outside."""
    return tl.load(
        PTR + tok[:, None] + d[None, :], mask=tok_ok[:, None] & (d[None, :] < D), other=0.0
    )


@triton.jit
def _tokens_t(PTR, tok, tok_ok, d, D):
    """The (Dp, M) transpose of ``_tokens``, loaded transposed."""
    return tl.load(
        PTR + tok[None, :] + d[:, None], mask=tok_ok[None, :] & (d[:, None] < D), other=0.0
    )


@triton.jit
def _key_block(r0, nr, nc, H, W):
    """Token index and validity of the key block of image rows r0, r0 + 1, ... (nr, nc: each
    key's row and column within the block)."""
    return (r0 + nr) * W + nc, (r0 + nr < H) & (nc < W)


@triton.jit
def _query_stats(STATS, DELTA, bh, T, i, i_ok):
    """A query block's saved max m, 1 / l (forward) and rowsum(dY o Y) (backward's delta)."""
    m_i = tl.load(STATS + bh * T + i, mask=i_ok, other=0.0)
    inv_l = tl.load(STATS + tl.num_programs(1) * T + bh * T + i, mask=i_ok, other=0.0)
    return m_i, inv_l, tl.load(DELTA + bh * T + i, mask=i_ok, other=0.0)


# SASA's k x k window (triton_local.py) is these kernels with WINDOW set: QA holds each query's
# window tables [Rq | Cq] (k values each) read at the key's row / column offset, -inf off the
# window, and every loop walks only the image rows a window reaches.


@triton.jit
def _offsets(i, W, rr, c, BEFORE):
    """Each query's row and column offsets into its window tables for key rows ``rr`` and key
    columns ``c``: (M, ROWS) and (M, WP)."""
    dr = rr[None, :] - (i // W)[:, None] + BEFORE
    dc = c[None, :] - (i % W)[:, None] + BEFORE
    return dr, dc


@triton.jit
def _window_tables(QA, i, i_ok, rr, c, H, W, KS, BEFORE):
    """r_blk (M, ROWS), c_blk (M, WP): each query's window logits for key rows ``rr`` and columns
    ``c`` (QA: (M, 1) pointers to the queries' tables); -inf off the window or the image."""
    dr, dc = _offsets(i, W, rr, c, BEFORE)
    r_ok = i_ok[:, None] & (dr >= 0) & (dr < KS) & (rr[None, :] < H)
    c_ok = i_ok[:, None] & (dc >= 0) & (dc < KS) & (c[None, :] < W)
    r_blk = tl.load(QA + dr, mask=r_ok, other=float("-inf"))
    c_blk = tl.load(QA + KS + dc, mask=c_ok, other=float("-inf"))
    return r_blk, c_blk


@triton.jit
def _row_band(first, last, H, W, BEFORE, AFTER, STEP):
    """The image rows [lo, hi) whose keys the queries ``first`` .. ``last`` (token indices) may
    see (for a key block, the query rows that see it: BEFORE and AFTER swapped), lo rounded
    down to the grid of STEP rows every kernel steps on: each logit is then recomputed at the
    same place of the same product shape, so rounded alike."""
    lo = tl.maximum(first // W - BEFORE, 0)
    return (lo // STEP) * STEP, tl.minimum(last // W + AFTER + 1, H)


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
        m0 = tl.program_id(0) * BLOCK_M
        last = tl.minimum(m0 + BLOCK_M, T) - 1
        lo, hi = _row_band(m0, last, H, W, BEFORE, KS - 1 - BEFORE, ROWS)
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
        m0 = tl.program_id(0) * BLOCK_M
        last = tl.minimum(m0 + BLOCK_M, T) - 1
        lo, hi = _row_band(m0, last, H, W, BEFORE, KS - 1 - BEFORE, ROWS)
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
