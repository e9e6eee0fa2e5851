"""The sweep that chose triton_tiles.TILES, on a machine without a GPU: every candidate tile of
every kernel compiled for an NVIDIA target (training with dropout, a 16x16 image, each operand
kind and padded head width), its shared memory, registers and spilled bytes read from the cubin.

    python -m attnconv.layers.kernels.triton_sweep [--arch 90] > sweep.jsonl   (each triton)
    python -m attnconv.layers.kernels.triton_sweep --pick A.jsonl B.jsonl      (TILES, a table)

The recorded sweeps: benchmarks/results/triton_sweep_<triton version>.jsonl; the tests check that
TILES is ``pick`` over them.
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
from .triton_tiles import CANDIDATES, KERNELS, KINDS, WIDTHS, Choice, Tile, pick

IMAGE = 16  # a 16x16 image: a row of 16 keys, so a step of 16, 32 or 64 keys is whole rows


def case(kind: str, width: int) -> Case:
    dtype = torch.bfloat16 if kind == "16bit" else torch.float32
    return Case(dtype, IMAGE, IMAGE, width, width, p=0.1, tf32=kind == "tf32")


def sweep(arch: int = 90, kinds=KINDS, widths=WIDTHS):
    """One record per (kind, width, kernel, candidate): the tile, the rung it compiled at, its
    shared memory, registers and stack (spilled) bytes per thread, and the compile's seconds
    (near 0 where Triton's cache held the kernel). Smaller blocks first; a
    candidate at least as large in both dimensions as one that spilled at the same warps is
    not compiled (``skipped``: a larger tile needs more registers a thread), which spares the
    float32 kernels' widest blocks (minutes of compile each, kilobytes spilled)."""
    import triton

    limit = limit_of(arch)
    order = sorted(CANDIDATES, key=lambda t: (t.block_m * t.keys, t.block_m, t.warps))
    for kind in kinds:
        for width in widths:
            c = case(kind, width)
            for kernel, args, meta in launches(c):
                spilled: list[Tile] = []
                for t in order:
                    rec = dict(triton=triton.__version__, arch=arch, kind=kind, width=width)
                    rec.update(kernel=kernel.__name__, block_m=t.block_m, keys=t.keys)
                    rec.update(warps=t.warps)
                    if any(_within(s, t) for s in spilled):
                        yield dict(rec, skipped=True)
                        continue
                    m = dict(meta, BLOCK_M=t.block_m, ROWS=t.keys // IMAGE, num_warps=t.warps)
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


def picks(records) -> dict[str, tuple[Choice, ...]]:
    """TILES from sweep records (of one or more triton versions): ``pick`` per (kind, width)
    over each kernel's candidates, their stack bytes summed across the versions. A candidate
    that did not fit at its own query block (the rungs halved it), or was skipped, counts as a
    spill."""
    stacks: dict[tuple, dict[Tile, int]] = defaultdict(lambda: defaultdict(int))
    for r in records:
        t = Tile(r["block_m"], r["keys"], r["warps"])
        bad = r.get("skipped") or r["fitted_block_m"] != r["block_m"]
        stacks[r["kind"], r["width"], r["kernel"]][t] += (r.get("stack") or 0) + (1 << 20) * bad
    kinds = {kind for kind, _, _ in stacks}
    return {
        kind: tuple(pick({k: stacks[kind, w, k] for k in KERNELS}) for w in WIDTHS)
        for kind in kinds
    }


def table(records) -> str:
    """Markdown: per (kind, width, kernel) the pick, its registers and stack in each version."""
    chosen = picks(records)
    by = defaultdict(dict)
    for r in records:
        by[r["kind"], r["width"], r["kernel"], Tile(r["block_m"], r["keys"], r["warps"])][
            r["triton"]
        ] = r
    versions = sorted({r["triton"] for r in records})
    head = " | ".join(f"triton {v}: regs, stack B, KiB shared" for v in versions)
    lines = [f"| kind | width | kernel | BLOCK_M | keys | warps | {head} |"]
    lines.append("|---" * (6 + len(versions)) + "|")
    for kind in KINDS:
        for i, width in enumerate(WIDTHS):
            for kernel in KERNELS:
                c = chosen[kind][i]
                t = Tile(c.block_m, c.keys, c.warps[KERNELS.index(kernel)])
                cells = []
                for v in versions:
                    r = by[kind, width, kernel, t].get(v)
                    ok = r and not r.get("skipped")
                    cells.append(
                        f"{r['registers']}, {r['stack']}, {r['shared'] / 1024:.1f}" if ok else "-"
                    )
                lines.append(
                    f"| {kind} | {width} | {kernel} | {t.block_m} | {t.keys} | {t.warps} | "
                    + " | ".join(cells)
                    + " |"
                )
    return "\n".join(lines)


def read(paths) -> list[dict]:
    return [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90, help="sm_<arch> target (90)")
    p.add_argument("--pick", nargs="+", metavar="JSONL", help="recorded sweeps: print TILES")
    args = p.parse_args(argv)
    if args.pick:
        records = read(args.pick)
        for kind, row in sorted(picks(records).items()):
            cells = ", ".join(f"C({c.block_m}, {c.keys}, {c.warps})" for c in row)
            print(f'    "{kind}": ({cells}),')
        print()
        print(table(records))
        return 0
    if not triton_axis.INSTALLED or triton_axis.interpreted():
        raise SystemExit("triton_sweep: needs triton installed and TRITON_INTERPRET unset")
    for record in sweep(args.arch):
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
