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
def _query_band(T, H, W, KS, BEFORE, BLOCK_M: tl.constexpr, ROWS: tl.constexpr):
    """``_row_band`` of this program's query block (BLOCK_M queries from program_id(0)): the
    key rows [lo, hi) its windows reach, on the ROWS grid."""
    m0 = tl.program_id(0) * BLOCK_M
    last = tl.minimum(m0 + BLOCK_M, T) - 1
    return _row_band(m0, last, H, W, BEFORE, KS - 1 - BEFORE, ROWS)
