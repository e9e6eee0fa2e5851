"""A Triton kernel's launch at the first rung that fits the GPU (kernels/triton_axis.py's and
kernels/triton_local.py's kernels, and the offline compile checks of triton_compile.py): the
rungs of software-pipelining depth and query block a launch steps down where the shared memory
of a block does not fit, the rung each kernel, compile-time values and device settled on, and a
launch's name and compile-time values in reports."""

from __future__ import annotations

import contextlib
import importlib.util

import torch

if importlib.util.find_spec("triton") is not None:
    import triton


def launch_name(kernel, meta: dict) -> str:
    """A launch's name in reports: the kernel's, the dQ kernel's delta pass told apart."""
    return kernel.__name__ + ("_delta" if meta.get("DELTA_PASS") else "")


def compile_options(meta: dict) -> tuple[dict, int]:
    """A launch's compile-time values (the kernel's constexpr parameters) and its num_warps."""
    return {k: v for k, v in meta.items() if k != "num_warps"}, meta["num_warps"]


# fused multiply-adds (a * b + c rounded once), as Triton 3.6 and 3.9 compile by default and as
# every tile and precision figure of the kernels was taken; Triton 3.10 turns the default off
FP_FUSION = True
STAGES = (3, 2, 1)  # software-pipelining depths tried in turn (Triton's NVIDIA default first)
_rung: dict[tuple, tuple[int, int]] = {}  # (kernel, compile-time values, device) -> what fit


def rungs(meta: dict) -> list[tuple[int, int]]:
    """(stages, BLOCK_M) a launch tries in turn: Triton's default pipelining, fewer stages,
    then half the query block at one stage, down to 16 (tl.dot's least)."""
    out, m = [(stages, meta["BLOCK_M"]) for stages in STAGES], meta["BLOCK_M"]
    while m > 16:
        m //= 2
        out.append((1, m))
    return out


def launch(kernel, grid, args: tuple, meta: dict) -> int:
    """kernel[grid](*args, **meta) at the first rung whose shared memory fits the GPU: a block
    can ask for more than sm_86/89's 99 KiB (RTX 30xx/40xx; kernels/triton_compile.py says
    which), and Triton's OutOfResources steps down the rungs, once per kernel, compile-time
    values and device. ``grid``: a tuple or a function of the compile-time values. Returns the
    query block it ran with (the backward starts from the forward's: one block shape a call)."""
    key = (kernel.__name__, *meta.items(), args[0].device)  # meta's order is the launch code's
    ladder = rungs(meta)
    first = ladder.index(_rung[key]) if key in _rung else 0

    def run(stages: int, block_m: int) -> int:
        m = dict(meta, BLOCK_M=block_m)  # num_warps among them: a launch option
        # Triton launches on the current device and its stream: make it the tensors' own (a
        # model on cuda:1 while cuda:0 is current)
        with torch.cuda.device(args[0].device) if args[0].is_cuda else contextlib.nullcontext():
            kernel[grid(m) if callable(grid) else grid](
                *args, **m, num_stages=stages, enable_fp_fusion=FP_FUSION
            )
        _rung[key] = (stages, block_m)
        return block_m

    for stages, block_m in ladder[first:-1]:
        try:
            return run(stages, block_m)
        except triton.runtime.errors.OutOfResources:
            continue
    return run(*ladder[-1])  # Triton's OutOfResources when even the last rung does not fit
