"""The sweep that chose triton_tiles.TILES, on a machine without a GPU: every candidate tile of
every kernel compiled for an NVIDIA target (training with dropout, each operand kind, padded
head width and image row width), its shared memory, registers and spilled bytes read from the
cubin.

    python -m attnconv.layers.kernels.triton_sweep [--arch 90] [--rows 16] > sweep.jsonl
    python -m attnconv.layers.kernels.triton_sweep --pick A.jsonl B.jsonl      (TILES, a table)

The recorded sweeps: benchmarks/results/triton_sweep_<triton version>.jsonl (rows of 16: a
16x16 image) and triton_sweep_<version>_rows.jsonl (``--rows 32 64``), each triton version the
GPU machines' and PyPI's; the tests check that TILES is ``pick`` over them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

from . import triton_axis
from .triton_compile import Case, compile_launch, launches, limit_of
from .triton_tiles import (
    KERNELS,
    KINDS,
    ROW_WIDTHS,
    WIDTHS,
    Choice,
    Tile,
    candidates,
    pick,
)

HEIGHT = 16  # image rows (a runtime size: it changes no compiled kernel)


def case(kind: str, width: int, row: int = 16) -> Case:
    dtype = torch.bfloat16 if kind == "16bit" else torch.float32
    return Case(dtype, HEIGHT, row, width, width, p=0.1, tf32=kind == "tf32")


def sweep(arch: int = 90, rows=(16,), kinds=KINDS, widths=WIDTHS):
    """One record per (row width, kind, width, kernel, candidate): the tile, the rung it
    compiled at, its shared memory, registers and stack (spilled) bytes per thread, and the
    compile's seconds (near 0 where Triton's cache held the kernel). Smaller blocks first; a
    candidate at least as large in both dimensions as one that spilled at the same warps is
    not compiled (``skipped``: a larger tile needs more registers a thread), which spares the
    float32 kernels' widest blocks (minutes of compile each, kilobytes spilled)."""
    import triton

    limit = limit_of(arch)
    for row in rows:
        order = sorted(candidates(row), key=lambda t: (t.block_m * t.keys, t.block_m, t.warps))
        for kind in kinds:
            for width in widths:
                c = case(kind, width, row)
                for kernel, args, meta in launches(c):
                    if meta.get("DELTA_PASS"):  # the dQ kernel's first pass: _bwd_dq's tile
                        continue
                    spilled: list[Tile] = []
                    for t in order:
                        rec = dict(triton=triton.__version__, arch=arch, row=row, kind=kind)
                        rec.update(width=width, kernel=kernel.__name__, block_m=t.block_m)
                        rec.update(keys=t.keys, warps=t.warps)
                        if any(_within(s, t) for s in spilled):
                            yield dict(rec, skipped=True)
                            continue
                        m = dict(meta, BLOCK_M=t.block_m, ROWS=t.keys // row, num_warps=t.warps)
                        got = compile_launch(kernel, args, m, c, arch, limit)
                        if got.stack or got.block_m != t.block_m:
                            spilled.append(t)
                        yield dict(
                            rec,
                            stages=got.stages,
                            fitted_block_m=got.block_m,
                            shared=got.shared,
                            registers=got.registers,
                            stack=got.stack,
                            seconds=round(got.seconds, 2),
                        )


def _within(small: Tile, t: Tile) -> bool:
    return small.warps == t.warps and small.block_m <= t.block_m and small.keys <= t.keys


def picks(records) -> dict[tuple[str, int], tuple[Choice, ...]]:
    """TILES from sweep records (of one or more triton versions): ``pick`` per (kind, row width,
    head width) over each kernel's candidates, their stack bytes summed across the versions. A
    candidate that did not fit at its own query block (the rungs halved it), or was skipped,
    counts as a spill."""
    stacks: dict[tuple, dict[Tile, int]] = defaultdict(lambda: defaultdict(int))
    for r in records:
        t = Tile(r["block_m"], r["keys"], r["warps"])
        bad = r.get("skipped") or r["fitted_block_m"] != r["block_m"]
        key = r["kind"], r["row"], r["width"], r["kernel"]
        stacks[key][t] += (r.get("stack") or 0) + (1 << 20) * bad
    classes = {(kind, row) for kind, row, _, _ in stacks}
    return {
        (kind, row): tuple(pick({k: stacks[kind, row, w, k] for k in KERNELS}) for w in WIDTHS)
        for kind, row in sorted(classes, key=lambda c: (KINDS.index(c[0]), c[1]))
    }


def table(records) -> str:
    """Markdown: per (kind, row width, head width, kernel) the pick, its registers and stack in
    each version."""
    chosen = picks(records)
    by = defaultdict(dict)
    for r in records:
        t = Tile(r["block_m"], r["keys"], r["warps"])
        by[r["kind"], r["row"], r["width"], r["kernel"], t][r["triton"]] = r
    versions = sorted({r["triton"] for r in records})
    head = " | ".join(f"triton {v}: regs, stack B, KiB shared" for v in versions)
    lines = [f"| kind | row | width | kernel | BLOCK_M | keys | warps | {head} |"]
    lines.append("|---" * (7 + len(versions)) + "|")
    for (kind, row), tiles in chosen.items():
        for width, c in zip(WIDTHS, tiles, strict=True):
            for kernel in KERNELS:
                t = Tile(c.block_m, c.keys, c.warps[KERNELS.index(kernel)])
                cells = []
                for v in versions:
                    r = by[kind, row, width, kernel, t].get(v)
                    ok = r and not r.get("skipped")
                    cells.append(
                        f"{r['registers']}, {r['stack']}, {r['shared'] / 1024:.1f}" if ok else "-"
                    )
                lines.append(
                    f"| {kind} | {row} | {width} | {kernel} | {t.block_m} | {t.keys} | {t.warps} | "
                    + " | ".join(cells)
                    + " |"
                )
    return "\n".join(lines)


def read(paths) -> list[dict]:
    return [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90, help="sm_<arch> target (90)")
    p.add_argument(
        "--rows", type=int, nargs="+", default=[16], choices=ROW_WIDTHS, help="image rows (16)"
    )
    p.add_argument("--pick", nargs="+", metavar="JSONL", help="recorded sweeps: print TILES")
    args = p.parse_args(argv)
    if args.pick:
        records = read(args.pick)
        for (kind, row), tiles in picks(records).items():
            cells = ", ".join(f"C({c.block_m}, {c.keys}, {c.warps})" for c in tiles)
            print(f'    ("{kind}", {row}): ({cells}),')
        print()
        print(table(records))
        return 0
    if not triton_axis.INSTALLED or triton_axis.interpreted():
        raise SystemExit("triton_sweep: needs triton installed and TRITON_INTERPRET unset")
    for record in sweep(args.arch, args.rows):
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
