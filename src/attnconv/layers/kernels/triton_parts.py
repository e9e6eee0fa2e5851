"""The device functions of triton_axis_jit.py's kernels: the counter-hash dropout, the products,
the block loads, the logits, and SASA's window (its tables read at each key's offset, the band of
rows a window reaches). Imported only where triton is installed."""

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
def _low(x, dtype: tl.constexpr):
    """float32 x in ``dtype``, rounded to nearest even as a GPU rounds it. Triton's interpreter
    truncates a float32 cast to bfloat16 (its error twice a rounding's: docs/benchmarks.md,
    "What the interpreter hides"), so there the bits are rounded and taken as bfloat16's (NaN kept
    a NaN; the interpreter's own conversion also loses subnormals)."""
    if INTERPRET and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        top = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        top = tl.where(x != x, (bits >> 16) | 0x40, top)
        return top.to(tl.uint16).to(dtype, bitcast=True)
    return x.to(dtype)


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
def _key_block(r0, c0, nr, nc, H, W, WINDOW: tl.constexpr):
    """Token index and validity of the key block of image rows r0, r0 + 1, ... and columns c0,
    c0 + 1, ... (nr, nc: each key's row and column within the block; r0, c0 < 0 only on a
    window's grid)."""
    r, c = r0 + nr, c0 + nc
    ok = (r < H) & (c < W)
    if WINDOW:
        ok = ok & (r >= 0) & (c >= 0)
    return r * W + c, ok


@triton.jit
def _query_tile(t0, T, H, W, BLOCK_M: tl.constexpr, WP: tl.constexpr, WINDOW: tl.constexpr):
    """Token index and validity of query block t0: BLOCK_M consecutive tokens, or (WINDOW) a
    tile of BLOCK_M // WP image rows of WP columns, the tiles row-major over the image."""
    m = tl.arange(0, BLOCK_M)
    if WINDOW:
        tiles = tl.cdiv(W, WP)
        qr = (t0 // tiles) * (BLOCK_M // WP) + m // WP
        qc = (t0 % tiles) * WP + m % WP
        i, i_ok = qr * W + qc, (qr < H) & (qc < W)
    else:
        i = t0 * BLOCK_M + m
        i_ok = i < T
    return i, i_ok


@triton.jit
def _query_stats(STATS, DELTA, bh, T, i, i_ok):
    """A query block's saved max m, 1 / l (forward) and delta (the dQ kernel's delta pass)."""
    m_i = tl.load(STATS + bh * T + i, mask=i_ok, other=0.0)
    inv_l = tl.load(STATS + tl.num_programs(1) * T + bh * T + i, mask=i_ok, other=0.0)
    return m_i, inv_l, tl.load(DELTA + bh * T + i, mask=i_ok, other=0.0)


# SASA's k x k window (triton_local.py) is these kernels with WINDOW set: QA holds each query's
# window tables [Rq | Cq] (k values each) read at the key's row / column offset, -inf off the
# window. Queries come in 2-D tiles (BLOCK_M // WP rows of WP columns), keys in blocks of ROWS
# rows of WP columns on a grid from (-SHIFT, -SHIFT) (triton_tiles.window_shift), and every loop
# walks only the blocks a window reaches (NATTEN's tiling): at 56x56, k = 7 and 8x8 tiles, 2 x 2
# blocks of 64 keys a tile, where 64 queries in a run of tokens walked 8-9 rows of 64.


@triton.jit
def _offsets(i, W, rr, c, BEFORE):
    """Each query's row and column offsets into its window tables for key rows ``rr`` and key
    columns ``c``: (M, ROWS) and (M, WP)."""
    dr = rr[None, :] - (i // W)[:, None] + BEFORE
    dc = c[None, :] - (i % W)[:, None] + BEFORE
    return dr, dc


@triton.jit
def _inside(i_ok, d, x, KS, N):
    """(M, n) offsets ``d`` that lie in the window and at a position ``x`` (n,) of the image's
    [0, N)."""
    return i_ok[:, None] & (d >= 0) & (d < KS) & (x[None, :] >= 0) & (x[None, :] < N)


@triton.jit
def _window_tables(QA, i, i_ok, rr, c, H, W, KS, BEFORE):
    """r_blk (M, ROWS), c_blk (M, WP): each query's window logits for key rows ``rr`` and columns
    ``c`` (QA: (M, 1) pointers to the queries' tables); -inf off the window or the image."""
    dr, dc = _offsets(i, W, rr, c, BEFORE)
    r_blk = tl.load(QA + dr, mask=_inside(i_ok, dr, rr, KS, H), other=float("-inf"))
    c_blk = tl.load(QA + KS + dc, mask=_inside(i_ok, dc, c, KS, W), other=float("-inf"))
    return r_blk, c_blk


@triton.jit
def _band(first, n, size, BEFORE, AFTER, STEP, ORIGIN):
    """Along one axis: [lo, hi) of the positions that positions first .. first + n - 1 reach
    (BEFORE before them, AFTER after, within [0, size)), lo rounded down to the grid of STEP
    that starts at -ORIGIN: every kernel steps on that grid, so each logit is recomputed at the
    same place of the same product shape, so rounded alike."""
    lo = tl.maximum(first - BEFORE, 0)
    return ((lo + ORIGIN) // STEP) * STEP - ORIGIN, tl.minimum(first + n + AFTER, size)


@triton.jit
def _query_band(
    t0, H, W, KS, BEFORE, SHIFT, BLOCK_M: tl.constexpr, ROWS: tl.constexpr, WP: tl.constexpr
):
    """The key blocks that the windows of query tile t0 (``_query_tile``) reach: the first's
    row and column (on the grid from -SHIFT: triton_tiles.window_shift), how many block rows
    down, block columns across."""
    tiles, after = tl.cdiv(W, WP), KS - 1 - BEFORE
    qr0 = (t0 // tiles) * (BLOCK_M // WP)
    r_lo, r_hi = _band(qr0, BLOCK_M // WP, H, BEFORE, after, ROWS, SHIFT)
    c_lo, c_hi = _band((t0 % tiles) * WP, WP, W, BEFORE, after, WP, SHIFT)
    return r_lo, tl.cdiv(r_hi - r_lo, ROWS), c_lo, tl.cdiv(c_hi - c_lo, WP)


@triton.jit
def _step(s, r_lo, c_lo, down, ROWS: tl.constexpr, WP: tl.constexpr, WINDOW: tl.constexpr):
    """The key block (r0, c0) of a query block's loop step s: the key rows s, s + 1, ... of
    every column (s on the ROWS grid), or a window's block s of its band, block columns outer."""
    if WINDOW:
        r0, c0 = r_lo + (s % down) * ROWS, c_lo + (s // down) * WP
    else:
        r0, c0 = s, 0
    return r0, c0


@triton.jit
def _key_band(
    r0, c0, H, W, KS, BEFORE, BLOCK_M: tl.constexpr, ROWS: tl.constexpr, WP: tl.constexpr
):
    """The query tiles [tr_lo, tr_hi) x [tc_lo, tc_hi) (tile rows and columns, ``_query_tile``)
    whose windows reach the key block at (r0, c0)."""
    QR: tl.constexpr = BLOCK_M // WP
    r_lo, r_hi = _band(r0, ROWS, H, KS - 1 - BEFORE, BEFORE, QR, 0)
    c_lo, c_hi = _band(c0, WP, W, KS - 1 - BEFORE, BEFORE, WP, 0)
    return r_lo // QR, tl.cdiv(r_hi, QR), c_lo // WP, tl.cdiv(c_hi, WP)


@triton.jit
def _window_partials(KS, WP: tl.constexpr):
    """How many key-block columns a query tile's windows (WP + KS - 1 columns) reach at most, on
    any grid: the row-logit gradient is summed per block column (``triton_tiles.window_dqa`` adds
    them), the column one stored once."""
    return tl.cdiv(WP + KS - 2, WP) + 1
