"""The Triton kernels' tiles (layers/kernels/triton_tiles.py): the table is the sweep's pick over
the recorded compiles of both triton versions (benchmarks/results/triton_sweep_*.jsonl, made by
``python -m attnconv.layers.kernels.triton_sweep``), the rule picks what its docstring says, a
launch carries its kernel's tile, and the picked tiles compile without spilling under the
installed triton."""

import json
from pathlib import Path

import pytest
import torch

from attnconv.layers.kernels import triton_sweep, triton_tiles
from attnconv.layers.kernels.triton_tiles import TILES, Choice, Tile, pick, tile
from compile_helpers import compiled_python

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def test_the_tiles_are_the_recorded_sweeps_pick():
    files = sorted(RESULTS.glob("triton_sweep_*.jsonl"))
    records = triton_sweep.read(files)
    # the GPU machines' triton and PyPI's: a tile spill-free under one only is not picked
    assert len({r["triton"] for r in records}) >= 2 and "3.6.0" in {r["triton"] for r in records}
    per_row = len(triton_tiles.KINDS) * len(triton_tiles.WIDTHS) * 3
    n = sum(per_row * len(triton_tiles.candidates(r)) for r in triton_tiles.ROW_WIDTHS)
    assert all(len([r for r in records if r["triton"] == v]) == n for v in ("3.6.0", "3.9.0"))
    assert triton_sweep.picks(records) == TILES


def test_every_kind_and_row_width_has_a_tile_per_swept_width():
    kinds, rows = triton_tiles.KINDS, triton_tiles.ROW_WIDTHS
    assert set(TILES) == {(k, r) for k in kinds for r in rows}
    assert all(len(tiles) == len(triton_tiles.WIDTHS) for tiles in TILES.values())
    for (_, row), tiles in TILES.items():
        for c in tiles:  # a key step of whole rows
            assert all(Tile(c.block_m, c.keys, w) in triton_tiles.candidates(row) for w in c.warps)


def _stacks(fwd, dq, dkdv):
    return dict(zip(triton_tiles.KERNELS, (fwd, dq, dkdv), strict=True))


def test_pick_takes_the_largest_block_every_kernel_compiles_without_spills():
    a, b, c, d = Tile(64, 64, 4), Tile(64, 64, 8), Tile(64, 32, 4), Tile(32, 64, 4)
    clean = {a: 0, b: 0, c: 0, d: 0}
    # 64 x 64 spills in dK/dV at 4 warps only: kept, dK/dV at 8
    assert pick(_stacks(clean, clean, {a: 40, b: 0, c: 0, d: 0})) == Choice(64, 64, (4, 4, 8))
    # 64 x 64 spills in dQ at both warps: the next block, the taller of two of one size
    assert pick(_stacks(clean, {a: 8, b: 8, c: 0, d: 0}, clean)) == Choice(64, 32, (4, 4, 4))
    # every block spills somewhere: the fewest bytes over the three kernels
    some = {a: 40, b: 40, c: 16, d: 8}
    assert pick(_stacks(clean, some, clean)) == Choice(32, 64, (4, 4, 4))


def test_a_width_takes_the_tile_of_the_next_swept_width():
    row = TILES["16bit", 16]
    c = row[1]
    assert tile("_fwd", "16bit", 32) == Tile(c.block_m, c.keys, c.warps[0])
    assert tile("_bwd_dkdv", "16bit", 64) == Tile(c.block_m, c.keys, c.warps[2])
    assert tile("_bwd_dq", "16bit", 512).block_m == row[-1].block_m
    assert tile("_fwd", "16bit", 16).keys == row[0].keys
    assert tile("_bwd_dq", "fp64", 512) == triton_tiles.FLOAT64
    assert triton_tiles.kind(torch.float16, "ieee") == "16bit"
    assert triton_tiles.kind(torch.float32, "tf32") == "tf32"


def test_a_row_width_takes_the_tiles_of_the_next_swept_row_width():
    for row, swept in ((1, 16), (16, 16), (17, 32), (32, 32), (64, 64), (128, 64)):
        c = TILES["tf32", swept][2]
        assert tile("_bwd_dq", "tf32", 128, row) == Tile(c.block_m, c.keys, c.warps[1])


@pytest.mark.parametrize("dtype, tf32", [(torch.bfloat16, False), (torch.float32, True)])
def test_each_launch_carries_its_kernels_tile(dtype, tf32):
    pytest.importorskip("triton")
    from attnconv.layers.kernels.triton_compile import Case, launches

    for width, h, w in ((400, 16, 16), (48, 5, 5), (64, 4, 64), (16, 3, 24)):
        metas = []
        for kernel, _, meta in launches(Case(dtype, h, w, width, width, p=0.1, tf32=tf32)):
            kind = triton_tiles.kind(dtype, "tf32" if tf32 else "ieee")
            t = tile(kernel.__name__, kind, meta["DKP"], meta["WP"])
            assert (meta["BLOCK_M"], meta["num_warps"]) == (t.block_m, t.warps)
            assert meta["ROWS"] == max(1, t.keys // meta["WP"])
            metas.append((meta["BLOCK_M"], meta["ROWS"]))
        assert len(set(metas)) == 1  # one block shape: the backward's logits round as forward's


_CHOSEN = """
import json, torch, triton
from attnconv.layers.kernels.triton_compile import Case, compile_case
kinds = (("16bit", torch.bfloat16, 0), ("ieee", torch.float32, 0), ("tf32", torch.float32, 1))
for kind, dt, tf32 in kinds:
    for d in (64, 400):
        for c in compile_case(Case(dt, 16, 16, d, d, p=0.1, tf32=bool(tf32)), 90):
            print(json.dumps(dict(triton=triton.__version__, kind=kind, d=d, kernel=c.kernel,
                                  block_m=c.block_m, keys=c.keys, warps=c.warps, stack=c.stack)))
"""


@pytest.mark.slow
def test_the_picked_tiles_compile_for_sm90_as_the_sweep_recorded():
    """Under the installed triton: the kernels of the paper's content heads (400 wide, the 512
    tiles) and of a 64-wide head, 16x16 tokens, training with dropout, compile at their tile
    with the stack bytes the recorded sweep holds for it (0: no spill, for all but the rows
    where no candidate compiled without one)."""
    pytest.importorskip("triton")
    rows = [json.loads(line) for line in compiled_python("-c", _CHOSEN, timeout=900).splitlines()]
    assert len(rows) == 24  # 3 kinds x 2 widths x 4 launches
    # the dQ kernel's delta pass runs at _bwd_dq's tile (the sweep compiles no tile of its own)
    # and does a part of its work: where _bwd_dq spills nothing, neither does it (at 512 wide
    # both spill, the pass 544 bytes against 504, triton 3.9)
    dq = {(r["kind"], r["d"]): r for r in rows if r["kernel"] == "_bwd_dq"}
    for r in (r for r in rows if r["kernel"] == "_bwd_dq_delta"):
        twin = dq[r["kind"], r["d"]]
        assert [r[k] for k in ("block_m", "keys", "warps")] == [
            twin[k] for k in ("block_m", "keys", "warps")
        ]
        assert r["stack"] == 0 or twin["stack"] > 0, (r, twin)
    rows = [r for r in rows if r["kernel"] != "_bwd_dq_delta"]
    records = triton_sweep.read(sorted(RESULTS.glob("triton_sweep_*.jsonl")))
    if rows[0]["triton"] not in {r["triton"] for r in records}:
        pytest.skip(f"no recorded sweep of triton {rows[0]['triton']}")
    for row in rows:
        width = 64 if row["d"] == 64 else 512
        t = tile(row["kernel"], row["kind"], width)
        assert (row["block_m"], row["keys"], row["warps"]) == (t.block_m, t.keys, t.warps)
        (rec,) = [
            r
            for r in records
            if (r["triton"], r["row"], r["kind"], r["width"], r["kernel"])
            == (row["triton"], 16, row["kind"], width, row["kernel"])
            and Tile(r["block_m"], r["keys"], r["warps"]) == t
        ]
        assert row["stack"] == rec["stack"], (row, rec)
    assert sum(r["stack"] == 0 for r in rows) >= 15  # 3 rows spill in every candidate (3.9)
