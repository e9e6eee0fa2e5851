"""The tiles of triton_axis.py's kernels: the queries a program holds (BLOCK_M) and the keys a
step walks, one block shape for the three kernels of a call, and each kernel's num_warps, per
operand kind and padded head width.

One block shape: the backward recomputes every logit S with the forward's product shape, so
with the same rounding, and P = exp(S - m) / l stays normalized by the forward's own l (a block
per kernel, tried first, made the gradients of 400-wide float32 heads err past the plain
path's bound under the interpreter: docs/benchmarks.md, "Figures behind the code's comments").

Chosen without a GPU: each candidate compiled for sm_90 under the GPU machines' triton (3.6) and
PyPI's (3.9), keeping the largest block that every kernel compiles without spilling registers to
the stack under both, at its fewer warps (``pick``): ``python -m
attnconv.layers.kernels.triton_sweep``, benchmarks/results/triton_sweep_*.jsonl and
triton_tiles.md. A key step is whole image rows, so a row wider than a tile's keys makes the
step longer than the tile says: the tiles are swept per row width (ROW_WIDTHS: rows up to 16
pixels on a 16x16 image, rows of 32 and of 64 with the keys a whole number of rows; rows of 128
take the 64's block, unswept). A spill count is the compiler's, not a timing: a GPU's
measurement may overrule a row.

SASA's window (triton_local.py) takes the tiles of rows of 16 laid out in 2-D: queries and keys
in blocks WINDOW_WP = 8 columns wide, the key blocks on a grid that ``window_shift`` places by
the keys it walks (``walked_keys``).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tile:
    block_m: int  # queries a program holds (dK/dV's: queries a step walks)
    keys: int  # keys a step walks (dK/dV's: keys a program holds): whole image rows, at least
    # one, so more where rows are wider than ``keys``
    warps: int


@dataclass(frozen=True)
class Choice:
    """A call's tiles: the block every kernel steps over, and num_warps per kernel."""

    block_m: int
    keys: int
    warps: tuple[int, int, int]  # _fwd, _bwd_dq, _bwd_dkdv


KERNELS = ("_fwd", "_bwd_dq", "_bwd_dkdv")
KINDS = ("16bit", "ieee", "tf32")  # bf16/fp16 operands; float32 exact; float32 as tf32
WIDTHS = (16, 64, 128, 256, 512)  # padded head widths swept; a width uses the next one up
ROW_WIDTHS = (16, 32, 64)  # padded image rows swept; a row uses the next one up (128: 64's)
CANDIDATES = [Tile(m, n, w) for n, m, w in itertools.product((64, 32, 16), (64, 32, 16), (4, 8))]
FLOAT64 = Tile(16, 16, 4)  # gradcheck's: products summed in registers (triton_parts._dot)


def candidates(row: int) -> list[Tile]:
    """The tiles a sweep compiles for image rows of ``row`` pixels: keys whole rows."""
    return [t for t in CANDIDATES if t.keys >= row]


C = Choice
# (kind, row width) -> its tiles at WIDTHS 16, 64, 128, 256, 512: ``pick`` over the recorded
# sweeps (triton_sweep --pick)
TILES: dict[tuple[str, int], tuple[Choice, ...]] = {
    ("16bit", 16): (
        C(64, 64, (4, 4, 4)),
        C(64, 64, (8, 4, 8)),
        C(32, 64, (4, 4, 8)),
        C(16, 32, (4, 4, 8)),
        C(16, 16, (8, 4, 8)),
    ),
    ("16bit", 32): (
        C(64, 64, (4, 4, 4)),
        C(64, 64, (8, 4, 8)),
        C(32, 64, (4, 8, 8)),
        C(16, 32, (4, 4, 8)),
        C(16, 32, (8, 8, 8)),
    ),
    ("16bit", 64): (
        C(64, 64, (4, 4, 4)),
        C(32, 64, (4, 8, 4)),
        C(16, 64, (4, 8, 8)),
        C(16, 64, (8, 8, 8)),
        C(16, 64, (8, 8, 8)),
    ),
    ("ieee", 16): (
        C(64, 16, (4, 4, 8)),
        C(16, 16, (4, 4, 8)),
        C(16, 16, (4, 4, 8)),
        C(16, 16, (4, 4, 8)),
        C(16, 16, (4, 8, 8)),
    ),
    ("ieee", 32): (
        C(32, 32, (4, 4, 8)),
        C(16, 32, (8, 4, 8)),
        C(16, 32, (8, 4, 8)),
        C(16, 32, (8, 8, 8)),
        C(16, 32, (8, 8, 8)),
    ),
    ("ieee", 64): (
        C(16, 64, (4, 4, 8)),
        C(16, 64, (8, 4, 8)),
        C(16, 64, (8, 8, 8)),
        C(16, 64, (4, 8, 8)),
        C(16, 64, (8, 8, 8)),
    ),
    ("tf32", 16): (
        C(64, 64, (4, 4, 4)),
        C(64, 32, (4, 4, 8)),
        C(32, 32, (4, 8, 4)),
        C(16, 32, (4, 8, 8)),
        C(16, 16, (4, 8, 8)),
    ),
    ("tf32", 32): (
        C(64, 64, (4, 4, 4)),
        C(64, 32, (4, 4, 8)),
        C(32, 32, (4, 4, 4)),
        C(32, 32, (8, 8, 8)),
        C(16, 32, (8, 8, 8)),
    ),
    ("tf32", 64): (
        C(64, 64, (4, 8, 4)),
        C(32, 64, (8, 8, 4)),
        C(16, 64, (8, 8, 8)),
        C(16, 64, (8, 8, 8)),
        C(16, 64, (8, 8, 8)),
    ),
}


def kind(dtype: torch.dtype, prec: str) -> str:
    """The operand kind of a call: "16bit", "ieee", "tf32" or "fp64"."""
    if dtype == torch.float64:
        return "fp64"
    if dtype == torch.float32:
        return prec
    return "16bit"


def tile(kernel: str, kind: str, width: int, row: int = 16) -> Tile:
    """``kernel``'s tile for operands of ``kind``, heads padded to ``width`` and image rows
    padded to ``row`` pixels (the tiles of the next swept row width up, the widest's past it)."""
    if kind == "fp64":
        return FLOAT64
    rows = [r for r in ROW_WIDTHS if (kind, r) in TILES]  # all, but while a sweep runs
    tiles = TILES[kind, next((r for r in rows if row <= r), rows[-1])]
    c = next((c for w, c in zip(WIDTHS, tiles, strict=True) if width <= w), tiles[-1])
    return Tile(c.block_m, c.keys, c.warps[KERNELS.index(kernel)])


def pick(stacks: dict[str, dict[Tile, int]]) -> Choice:
    """The tiles a sweep keeps from each kernel's candidates and their stack bytes (summed over
    the triton versions): the largest block (BLOCK_M x keys, then the taller) at which every
    kernel has a warp count without a spill, each kernel at its fewer such warps; where every
    block spills somewhere, the block of the fewest bytes spilled over the three kernels."""

    def best(kernel: str, block: tuple[int, int]) -> tuple[int, int]:  # (stack, warps)
        return min((s, t.warps) for t, s in stacks[kernel].items() if (t.block_m, t.keys) == block)

    def spilled(block: tuple[int, int]) -> int:
        return sum(best(k, block)[0] for k in KERNELS)

    blocks = {(t.block_m, t.keys) for t in stacks[KERNELS[0]]}
    clean = [b for b in blocks if spilled(b) == 0]
    if clean:
        block = max(clean, key=lambda b: (b[0] * b[1], b[0]))
    else:
        block = min(blocks, key=lambda b: (spilled(b), -b[0] * b[1], -b[0]))
    return Choice(*block, tuple(best(k, block)[1] for k in KERNELS))


WINDOW_WP = 8  # a window's query tiles and key blocks are 8 columns wide (fewer on narrower images)


def walked_keys(h: int, w: int, ks: int, block_m: int, keys: int, wp: int, shift: int) -> float:
    """The keys the window forward walks a query, on average over an h x w image, with query
    tiles of block_m // wp rows of wp columns and key blocks of keys // wp rows on the grid from
    (-shift, -shift): the kernels' band arithmetic (triton_parts._query_band) in Python. A
    k x k window needs k**2."""
    before, after = (ks - 1) // 2, ks // 2
    rows, qr = max(1, keys // wp), block_m // wp

    def blocks(first: int, n: int, size: int, step: int) -> int:  # triton_parts._band
        lo = (max(first - before, 0) + shift) // step * step - shift
        return -(-(min(first + n + after, size) - lo) // step)

    down = [blocks(r, qr, h, rows) for r in range(0, h, qr)]  # a tile row's block rows
    across = [blocks(c, wp, w, wp) for c in range(0, w, wp)]  # a tile column's block columns
    return sum(down) * sum(across) * rows * wp / (len(down) * len(across))


@functools.lru_cache(maxsize=256)
def window_shift(h: int, w: int, ks: int, block_m: int, keys: int, wp: int) -> int:
    """Where a window's key-block grid starts, -shift: (k - 1) // 2 lets a tile's windows reach
    whole blocks inside the image (2 x 2 blocks of 8 x 8 at 56x56, k = 7), 0 keeps a small image
    in one block (7x7: 1, where the shifted grid walks 4); the one that walks fewer keys."""
    shifts = ((ks - 1) // 2, 0)
    return min(shifts, key=lambda s: walked_keys(h, w, ks, block_m, keys, wp, s))


def pow2(x: int, least: int = 1) -> int:
    """The least power of two >= x (and >= ``least``): padded rows and head widths."""
    return max(least, 1 << max(0, x - 1).bit_length())


def window_wp(w: int) -> int:
    """The columns of a window's query tiles and key blocks on an image W pixels wide."""
    return min(WINDOW_WP, pow2(w))


def window_parts(window: int, wp: int) -> int:
    """The block columns a window's query tile reaches at most (triton_parts._window_partials):
    the dQ kernel stores a row-logit gradient for each."""
    return -(-(wp + window - 2) // wp) + 1


def window_logits(window: int, w: int) -> int:
    """The columns of the dQ kernel's row-logit scratch for a k x k window (P + 1) k: P partial
    row-logit gradients (``window_parts``) and the column ones."""
    return (window_parts(window, window_wp(w)) + 1) * window


def window_dqa(dqa: torch.Tensor, window: int) -> torch.Tensor:
    """(B, Nh, T, (P + 1) k) -> (B, Nh, T, 2k): the dQ kernel's P partial row-logit gradients
    added, the column ones beside them."""
    rows = dqa[..., :-window].unflatten(-1, (-1, window)).sum(-2)
    return torch.cat([rows, dqa[..., -window:]], -1)
