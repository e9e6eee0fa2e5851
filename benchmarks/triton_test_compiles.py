"""What a GPU run of the Triton tests pays in compiles: runs tests/test_triton_axis.py through
Triton's interpreter here, records every distinct (kernel, compile-time values, dtype) it
launches, then compiles each for an NVIDIA target (layers/kernels/triton_compile.py) and prints
their number and compile time by dtype. On a GPU each is a JIT compile before the test runs;
benchmarks/gpu_session.sh budgets its steps with it.

    python benchmarks/triton_test_compiles.py [--arch 90]

Counts are at the CPU's hypothesis example counts (a GPU draws fewer shapes: an upper bound).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def record() -> set[tuple]:
    """Run the Triton tests under the interpreter with every launch recorded (this process)."""
    os.environ["TRITON_INTERPRET"] = "1"  # before attnconv is imported: triton.jit reads it
    import pytest

    from attnconv.layers.kernels import triton_axis

    seen, launch = set(), triton_axis.launch

    def recording(kernel, grid, args, meta):
        consts = tuple((k, v) for k, v in meta.items() if k != "ACC")  # ACC: from the dtype
        seen.add((kernel.__name__, consts, str(args[0].dtype)))
        return launch(kernel, grid, args, meta)

    triton_axis.launch = recording
    args = ["-q", "-p", "no:cacheprovider", "-m", "slow or not slow"]  # every test, slow or not
    code = pytest.main([*args, str(ROOT / "tests/test_triton_axis.py")])
    if code != 0:
        raise SystemExit(f"the Triton tests failed (pytest exit {code}): nothing to count")
    return seen


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--child", help=argparse.SUPPRESS)  # the compiling process: a repr of seen
    args = p.parse_args(argv)
    if args.child is None:  # record here, compile in a process without TRITON_INTERPRET
        seen = sorted(record())
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        cmd = [sys.executable, __file__, "--arch", str(args.arch), "--child", repr(seen)]
        raise SystemExit(subprocess.run(cmd, env=env).returncode)
    import ast

    import torch
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnconv.layers.kernels import triton_axis
    from attnconv.layers.kernels import triton_compile as tc

    dtypes = {str(d): d for d in (torch.float64, torch.float32, torch.bfloat16, torch.float16)}
    seen = ast.literal_eval(args.child)
    by: dict[str, float] = {}
    for name, meta, dtype in seen:
        base = tc.launches(tc.Case(dtypes[dtype], 4, 4, 16, 16, p=0.1))
        kernel, kargs = next((k, a) for k, a, _ in base if k.__name__ == name)
        meta = dict(meta)
        meta["ACC"] = tl.float64 if dtypes[dtype] == torch.float64 else tl.float32
        meta, warps = triton_axis.compile_options(meta)
        start = time.perf_counter()
        src = ASTSource(kernel, tc.signature(kernel, kargs, meta), constexprs=meta)
        triton.compile(src, target=GPUTarget("cuda", args.arch, 32), options={"num_warps": warps})
        by[dtype] = by.get(dtype, 0.0) + time.perf_counter() - start
    total = sum(by.values())
    parts = ", ".join(f"{d.removeprefix('torch.')} {s:.0f} s" for d, s in sorted(by.items()))
    print(f"{len(seen)} kernels launched by tests/test_triton_axis.py; compiled for sm_{args.arch}")
    print(f"in {total:.0f} s (triton {triton.__version__}; by dtype: {parts})")


if __name__ == "__main__":
    main()
