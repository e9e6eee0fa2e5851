"""The Triton kernels compiled for a GPU on a machine without one: the same launches as
``triton_axis._TritonAxis`` (``forward_launch``, ``backward_launches``), handed to Triton's
compiler for an NVIDIA target instead of a device. It catches what the interpreter cannot (a
kernel reading a global that is not a constexpr, a ``tl.dot`` shape or dtype the GPU refuses,
more shared memory than the GPU has) and reports each kernel's registers and spills, so that a
lent GPU's minutes go to measuring, not to compile errors.

    python -m attnconv.layers.kernels.triton_compile [--arch 90 80] [--quick] [--json] [--jobs N]

Not under TRITON_INTERPRET=1 (the kernels are then the interpreter's, with its products).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import inspect
import json
import multiprocessing
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from . import triton_axis, triton_tiles

# the most shared memory one block may ask for (bytes; CUDA's per-architecture limits)
SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
SIG = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float64: "fp64",
    torch.int64: "i64",
}


@dataclass(frozen=True)
class Case:
    """One call of ``axis_attention_triton``: an image of h x w tokens, head widths dk, dv."""

    dtype: torch.dtype
    h: int
    w: int
    dk: int
    dv: int
    p: float = 0.0
    per_image: bool = True
    train: bool = True
    tf32: bool = False  # float32 with torch.backends.cuda.matmul.allow_tf32
    window: int = 0  # k: SASA's k x k window (triton_local.py; the kernels' WINDOW); 0: axis

    def __str__(self) -> str:
        kind = "tf32" if self.tf32 else SIG[self.dtype]
        mode = "train" if self.train else "infer"
        what = f" window{self.window}" if self.window else ""
        return f"{kind}{what} {self.h}x{self.w} d{self.dk}/{self.dv} p{self.p:g} {mode}"


@dataclass(frozen=True)
class Compiled:
    kernel: str
    case: Case
    arch: int
    shared: int  # bytes of shared memory a block asks for
    registers: int | None  # per thread (None: no cuobjdump beside triton)
    stack: int | None  # bytes of stack frame per thread: registers spilled (and local arrays)
    seconds: float
    stages: int  # software-pipelining depth and query block: triton_axis.launch's first rung
    block_m: int  # whose shared memory fits
    limit: int  # the shared memory a block may ask for on the target
    keys: int  # keys a step walks (ROWS x WP): the tile's, in whole image rows
    warps: int
    mma: int | None = None  # tensor-core instructions in its SASS (None: no cuobjdump)

    @property
    def fits(self) -> bool:
        return self.shared <= self.limit


def launches(case: Case, block_m: int | None = None) -> list[tuple]:
    """(kernel, arguments, compile-time values) of the forward and, in training, both backward
    kernels, built by the launch code itself from small CPU tensors (only dtypes and strides
    reach the compiler); ``block_m`` overrides the tile's query block, as the call's."""
    t, z = case.h * case.w, torch.zeros
    q, k = z(1, 1, t, case.dk, dtype=case.dtype), z(1, 1, t, case.dk, dtype=case.dtype)
    v = z(1, 1, t, case.dv, dtype=case.dtype)
    na = 2 * case.window if case.window else case.h + case.w  # [Rq | Cq] or [R | C]
    qa = z(1, 1, t, na, dtype=torch.promote_types(case.dtype, torch.float32))
    args = (q, k, v, qa, case.h, case.w, case.dk**-0.5, case.p, 0, case.per_image, block_m)
    (_, fargs, fmeta), (_, stats, scalars, sizes, meta) = triton_axis.forward_launch(
        *args, case.window
    )
    if case.tf32:  # as on a GPU with allow_tf32: tf32 products, tf32's tiles
        fmeta = triton_axis._tiled(triton_axis._fwd, dict(fmeta, PREC="tf32"), case.dtype, block_m)
        meta = dict(meta, PREC="tf32")
    out = [(triton_axis._fwd, fargs, fmeta)]
    if case.train:
        dy = z(1, t, 1, case.dv, dtype=case.dtype)
        back, _ = triton_axis.backward_launches(
            q, k, v, qa, stats, scalars, dy, sizes, meta, block_m
        )
        out += [(kernel, a, m) for kernel, _, a, m in back]
    return out


def signature(kernel, args: tuple, meta: dict) -> dict[str, str]:
    """Triton's signature of a launch, in the kernel's parameter order: each positional
    argument's type, "constexpr" for the compile-time values; a constexpr left to its default
    is left out (a parameter the launch does not give is an error here, not on the GPU)."""
    given = dict(zip(kernel.arg_names, args, strict=False))
    params = inspect.signature(kernel.fn).parameters
    sig = {}
    for name in kernel.arg_names:
        if name in meta:
            sig[name] = "constexpr"
            continue
        a = given.get(name, KeyError)
        if a is KeyError and params[name].default is not inspect.Parameter.empty:
            continue  # its default (N = ROWS * WP)
        if a is KeyError:
            raise TypeError(f"{kernel.__name__}: the launch gives no {name}")
        if isinstance(a, torch.Tensor):
            sig[name] = "*" + SIG[a.dtype]
        elif isinstance(a, float):
            sig[name] = "fp32"
        else:
            sig[name] = "i32" if -(2**31) <= a < 2**31 else "i64"
    return sig


def cuobjdump(cubin: bytes, flag: str) -> str | None:
    """``cuobjdump <flag>`` of the cubin by the copy Triton ships (None where it has none)."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        Path(path).write_bytes(cubin)
        return subprocess.run([str(tool), flag, path], capture_output=True, text=True).stdout


def resources(cubin: bytes) -> tuple[int | None, int | None]:
    """(registers, stack bytes) per thread from the cubin. ptxas spills registers to the stack
    frame (STACK), not to LOCAL (0 for Triton kernels)."""
    m = re.search(r"REG:(\d+) STACK:(\d+)", cuobjdump(cubin, "-res-usage") or "")
    return (int(m[1]), int(m[2])) if m else (None, None)


def tensor_core_ops(cubin: bytes) -> int | None:
    """The tensor-core instructions in the cubin's SASS (HMMA, HGMMA on sm_90, DMMA for float64):
    0 where every product runs on the FMA units (float32 without TF32 by design; a bfloat16
    product there would be a slow path no CPU test can see)."""
    text = cuobjdump(cubin, "-sass")
    return None if text is None else len(re.findall(r"\b[HDI]G?MMA\b", text))


def compile_for(kernel, sig: dict, constexprs: dict, stages: int, warps: int, arch: int):
    """Triton's compile of ``kernel`` (its signature and compile-time values) for sm_<arch>."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(kernel, sig, constexprs=constexprs)
    options = {"num_stages": stages, "num_warps": warps, "enable_fp_fusion": triton_axis.FP_FUSION}
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def compile_launch(kernel, args: tuple, meta: dict, case: Case, arch: int, limit: int):
    """One launch compiled for sm_<arch> at the first rung of ``triton_axis.launch`` whose
    shared memory fits ``limit`` bytes, with its resources read from the cubin."""
    constexprs, warps = triton_axis.compile_options(meta)
    sig = signature(kernel, args, constexprs)
    for stages, block_m in triton_axis.rungs(meta):
        start = time.perf_counter()
        compiled = compile_for(kernel, sig, dict(constexprs, BLOCK_M=block_m), stages, warps, arch)
        seconds = time.perf_counter() - start
        if compiled.metadata.shared <= limit:
            break
    cubin = compiled.asm.get("cubin")
    regs, stack = resources(cubin) if cubin else (None, None)
    shared, keys = compiled.metadata.shared, meta["ROWS"] * meta["WP"]
    name, mma = triton_axis.launch_name(kernel, meta), tensor_core_ops(cubin) if cubin else None
    return Compiled(
        name, case, arch, shared, regs, stack, seconds, stages, block_m, limit, keys, warps, mma
    )


def limit_of(arch: int) -> int:
    """SHARED_LIMIT's bytes for sm_<arch>, sm_80's for an architecture it does not list."""
    return SHARED_LIMIT.get(arch, SHARED_LIMIT[80])


def compile_case(case: Case, arch: int = 90, limit: int | None = None) -> list[Compiled]:
    """Compile every kernel a call of ``case`` launches for the NVIDIA architecture sm_<arch>,
    each at the rung ``triton_axis.launch`` would settle on there: its first (stages, BLOCK_M)
    whose shared memory fits ``limit`` bytes (a GPU's own; None: ``limit_of`` the
    architecture), the backward kernels from the forward's query block as a call runs them."""
    limit = limit or limit_of(arch)
    forward = compile_launch(*launches(case)[0], case, arch, limit)
    back = launches(case, forward.block_m)[1:]
    return [forward, *(compile_launch(*launch, case, arch, limit) for launch in back)]


_compiled: dict[tuple, list[Compiled]] = {}  # (case, arch, limit) -> compile_case's
# Head widths up to which every block fits sm_80 and sm_90 at the first rung when image rows are
# at most 64 pixels (a key block is then at most 64 keys, its most at rows of 64, and a kernel's
# tile depends only on the dtype and the width, triton_tiles): envelope() are its corners,
# compiled by the tests.
ENVELOPE = {torch.float32: 64, torch.bfloat16: 128, torch.float16: 128}
ENVELOPE_ROW = 64


def inside(case: Case, limit: int) -> bool:
    """Whether ``case`` lies in the envelope the tests compiled, on a GPU giving ``limit``."""
    widest = ENVELOPE.get(case.dtype, 0)
    small = case.w <= ENVELOPE_ROW and max(case.dk, case.dv) <= widest
    return small and limit >= SHARED_LIMIT[80] and not case.window


def envelope() -> list[Case]:
    """The envelope's corners: in each dtype the widest heads of each width the tiles tell
    apart (triton_tiles.WIDTHS: a narrower width may take a larger tile), every flag that adds
    a product or a pass (dropout, training's backward and its delta pass, tf32), rows of 64."""
    out = []
    for dt, widest in ENVELOPE.items():
        for d in (d for d in triton_tiles.WIDTHS if d <= widest):
            out.append(Case(dt, 4, ENVELOPE_ROW, d, d, p=0.1))
            if dt == torch.float32:
                out.append(Case(dt, 4, ENVELOPE_ROW, d, d, p=0.1, tf32=True))
    return out


class Fit(NamedTuple):
    """What the compile check says of a call on the GPU at hand: why it cannot run (one line) or
    None; and the query block its three kernels share, where the GPU's shared memory makes one
    kernel step below the tile's (None: the tile's). One block for all three: the backward
    recomputes the logits with the forward's product shapes, rounded alike."""

    why: str | None = None
    block_m: int | None = None


def check(case: Case, arch: int, limit: int) -> Fit:
    """``Fit`` of ``case``'s kernels on an sm_<arch> GPU that gives a block ``limit`` bytes of
    shared memory; compiled once per (case, arch, limit)."""
    key = (case, arch, limit)
    if key not in _compiled:
        _compiled[key] = compile_case(case, arch, limit)
    kernels = _compiled[key]
    big = [c for c in kernels if not c.fits]
    if big:
        why = (
            f"its {big[0].kernel} block needs {big[0].shared // 1024} KiB of shared memory, "
            f"the GPU gives {limit // 1024} KiB (head width {case.dk}, image rows of {case.w})"
        )
        return Fit(why)
    block_m = min(c.block_m for c in kernels)
    return Fit(None, block_m if block_m < kernels[0].block_m else None)


def refusal(case: Case, arch: int, limit: int) -> str | None:
    """Why ``case``'s kernels cannot run on an sm_<arch> GPU that gives a block ``limit`` bytes
    of shared memory (one line), or None."""
    return check(case, arch, limit).why


def fit(q, v, h: int, w: int, p: float, per_image: bool, train, window: int = 0) -> Fit:
    """``check`` for this call on q's GPU, for its own architecture and shared memory (a compile
    only outside the tested envelope, where every kernel fits at its tile; always for the window
    kernels, ``window`` = k); Fit() off CUDA."""
    if q.device.type != "cuda" or triton_axis.interpreted():
        return Fit()
    sizes = (h, w, q.shape[-1], v.shape[-1], p, per_image, bool(train), window)
    return fit_on(q.device.index, q.dtype, *sizes)


# torch.compile calls it while it traces and keeps the answer (the compile check is no graph's)
@torch.compiler.assume_constant_result
def fit_on(index, dtype, h, w, dk, dv, p, per_image, train, window) -> Fit:
    """``fit`` on CUDA device ``index`` for q of ``dtype`` and head widths dk, dv."""
    tf32 = dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    case = Case(dtype, h, w, dk, dv, p, per_image, train, tf32, window)
    props = torch.cuda.get_device_properties(index)
    if inside(case, props.shared_memory_per_block_optin):  # no compile: the tests did it
        return Fit()
    return check(case, props.major * 10 + props.minor, props.shared_memory_per_block_optin)


def cases(quick: bool = False) -> list[Case]:
    """What the tests and the GPU suite run: every dtype, the paper's 16x16 and the suite's
    32x32 / 64x64 images, odd sizes, head widths from 8 (padded to 16) to 128, dropout.
    ``quick``: bfloat16 training with dropout, float64 (gradcheck) and tf32, one each. Float64
    only where the installed triton compiles it (``triton_axis.FLOAT64_DOT``)."""
    every = _cases(quick)
    return [c for c in every if c.dtype != torch.float64 or triton_axis.FLOAT64_DOT]


def _cases(quick: bool) -> list[Case]:
    bf16, f32 = torch.bfloat16, torch.float32
    if quick:
        return [
            Case(bf16, 5, 7, 8, 8, p=0.1),
            Case(torch.float64, 6, 10, 8, 8, p=0.1),
            Case(f32, 32, 32, 64, 64, tf32=True),
        ]
    return [
        Case(bf16, 16, 16, 48, 48, p=0.1, per_image=True),
        Case(bf16, 16, 16, 48, 48, train=False),
        Case(torch.float16, 32, 32, 64, 64),
        Case(bf16, 64, 64, 64, 64, p=0.1, per_image=False),
        Case(bf16, 64, 64, 128, 128),
        Case(bf16, 5, 7, 8, 8, p=0.1),
        Case(bf16, 1, 128, 16, 16),
        Case(f32, 16, 16, 48, 48, p=0.1),
        Case(f32, 32, 32, 64, 64, tf32=True),
        Case(torch.float64, 6, 10, 8, 8, p=0.1),
        Case(bf16, 56, 56, 8, 8, window=7),  # SASA's first stage at ImageNet size
        Case(f32, 14, 14, 32, 32, window=7),
    ]


def _compile_all(jobs: list[tuple[Case, int]], workers: int):
    """compile_case of each (case, architecture), in order, ``workers`` processes at once (one
    build is one core's LLVM run; fresh interpreters, as a fork of torch's threads is not safe)."""
    if workers <= 1 or len(jobs) <= 1:
        yield from (compile_case(case, arch) for case, arch in jobs)
        return
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(min(workers, len(jobs)), mp_context=spawn) as pool:
        yield from pool.map(compile_case, *zip(*jobs))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--arch", type=int, nargs="+", default=[90], help="sm_<arch> targets: 80 86 89 90 (90)"
    )
    p.add_argument("--quick", action="store_true", help="three cases (cases(quick=True))")
    p.add_argument("--envelope", action="store_true", help="the envelope's corners instead")
    p.add_argument("--json", action="store_true", help="one JSON object per kernel")
    p.add_argument(
        "--jobs", type=int, default=None, help="processes compiling at once (the usable cores)"
    )
    args = p.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        raise SystemExit(f"triton_compile: --jobs must be >= 1, got {args.jobs}")
    if not triton_axis.INSTALLED:
        raise SystemExit("triton_compile: triton is not installed (pip install triton)")
    if triton_axis.interpreted():
        raise SystemExit("triton_compile: unset TRITON_INTERPRET (the interpreter compiles none)")
    import triton

    if not args.json:
        print(f"triton {triton.__version__}, torch {torch.__version__}")
        print(
            "| case | kernel | arch | stages | BLOCK_M | keys | warps | KiB shared | regs "
            "| stack B | mma | fits |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    bad = 0
    jobs = [
        (case, arch)
        for case in (envelope() if args.envelope else cases(args.quick))
        for arch in args.arch
    ]
    workers = args.jobs or len(os.sched_getaffinity(0))
    for (case, arch), builds in zip(jobs, _compile_all(jobs, workers)):
        for c in builds:
            bad += not c.fits
            if args.json:
                keys = ("kernel", "arch", "stages", "block_m", "keys", "warps", "shared")
                keys += ("registers", "mma")
                row = {k: getattr(c, k) for k in keys}
                print(json.dumps(row | {"case": str(case), "stack": c.stack}))
                continue
            print(
                f"| {case} | {c.kernel} | sm_{arch} | {c.stages} | {c.block_m} | {c.keys} "
                f"| {c.warps} "
                f"| {c.shared / 1024:.1f} "
                f"| {c.registers} | {c.stack} | {c.mma} | {'yes' if c.fits else 'NO'} |"
            )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
