"""The fused CPU kernel of content attention with row/column positional logits and attention
dropout (fused_axis.cpp), built on first use with torch's C++ extension loader (one module with
SASA's local window kernel, fused_local.cpp, and the hidden dropout of dropout.py, dropout.cpp):

    y = (softmax_k(scale q.k + R[q, k1] + C[q, k2]) o M / (1 - p)) v   (Cordonnier et al. eq. 9)

One task per (image, head) over the cores, query blocks held in L2, the dropout mask M redrawn
from ``functional.dropped_links``' counter hash in forward and backward: no (B, Nh, T, T) tensor
is stored or streamed through memory (the dense path keeps logits, probabilities, the mask and
their gradients). ``available()`` says whether the extension built (a C++ compiler and ninja);
the plan (plan.py) runs ``dense_dropout`` otherwise. The plain equations beside it:
``axis_attention_reference`` with ``dropped_links``' mask.
"""

from __future__ import annotations

import os
import sys
from functools import cache
from pathlib import Path

import torch
from torch.autograd.function import once_differentiable

from ..first_order import compiling, first_order_only
from ..functional import drop_threshold, dropout_seed, dropped_links, seed_tensor
from ..precision import (
    backward_without_autocast,
    kernel_dtype,
    no_autocast,
    operand_dtype,
    shared,
    shared_sum,
)
from . import build

# two translation units compiled side by side: the Python bindings, and the three kernels as
# one unit (kernels.cpp includes them: ATen's headers parsed once)
_HERE = Path(__file__).parent
SOURCES = tuple(_HERE / f for f in ("bindings.cpp", "kernels.cpp"))
HEADERS = tuple(
    _HERE / f
    for f in (
        "fused_axis.cpp",
        "fused_local.cpp",
        "dropout.cpp",
        "subnormals.cpp",
        "hash.h",
        "parallel.h",
    )
)
DISABLE = "ATTNCONV_NO_FUSED"  # set to 1: never build or run the fused kernel
# OpenMP: without it ATen's at::parallel_for compiles to a plain loop on the calling thread (its
# pragma is in the header); linked as libgomp.so.1, the runtime torch already loaded (its own
# thread pool and torch.set_num_threads). Other platforms: the kernels run on one thread.
OPENMP = ("-fopenmp",) if sys.platform.startswith("linux") else ()
EXTENSION = build.Extension(
    "attnconv_fused_axis",
    SOURCES,
    HEADERS,
    flags=("-O3", "-march=native", "-fopenmp-simd", *OPENMP),
    ldflags=OPENMP,
    disable_var=DISABLE,
)


@cache
def extension():
    """The compiled module (forward, backward), or None when it cannot be built (one line says
    why): built once per machine, CPU and version into torch's extension cache (build.py: never
    a wait without bound, never a damaged build loaded), then imported in a second."""
    if os.environ.get(DISABLE) == "1":
        return None
    return build.load(EXTENSION)


# a compiler calls it once while tracing and keeps the answer: Dynamo never reads the build
# cache, the CPU's flags or the environment inside a forward
@torch.compiler.assume_constant_result
def available() -> bool:
    return extension() is not None


class _FusedAxis(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, q, k, v, q_axis, h: int, w: int, scale: float, p: float, seed: int, per_image: bool
    ):
        args = (h, w, scale, p, seed, drop_threshold(p), per_image)
        ctx.full = (*q.shape[:2], *v.shape[2:])  # v may be (B|1, Nh|1, T, dv): shared
        y, mx, inv = extension().forward(q, k, v.expand(ctx.full), q_axis, *args)
        ctx.save_for_backward(q, k, v, q_axis, mx, inv)
        ctx.args = args
        return y  # (B, T, Nh, Dv), q_axis's dtype

    @staticmethod
    @once_differentiable
    @backward_without_autocast
    def backward(ctx, dy):
        q, k, v, q_axis, mx, inv = ctx.saved_tensors
        dy = dy.to(q.dtype).contiguous()
        vf = v.expand(ctx.full)
        dq, dk, dv, dqa = extension().backward(dy, q, k, vf, q_axis, mx, inv, *ctx.args)
        dv = shared_sum(dv, v)  # summed over what v shares in q_axis's dtype, rounded once
        return dq.to(q.dtype), dk.to(k.dtype), dv, dqa, None, None, None, None, None, None


def axis_attention_fused(
    q,
    k,
    v,
    q_axis,
    h: int,
    w: int,
    scale: float,
    p: float = 0.0,
    per_image: bool = True,
    seed: int | None = None,
):
    """q, k (B, Nh, T, dk), v (B, Nh, T, dv) (heads may share values: stride 0), q_axis
    (B|1, Nh, T, H + W) -> (B, T, Nh, dv) in kernel_dtype (float32; float64 stays); attention
    dropout p with the links of ``dropped_links(Nh, T, B if per_image else None, p, seed=seed)``
    (seed: drawn from the default generator when None). First derivative only.

    A bfloat16 q (autocast) keeps q, k and v (cast once where the heads share it) bfloat16: the
    operands of the kernel's five products (bf16 GEMMs, each product rounded once to bfloat16, as
    the plain autocast path rounds them), the axis logits, softmax, mask and every sum float32."""
    b, nh, t = q.shape[:3]
    if q_axis.shape[-2:] != (h * w, h + w) or t != h * w:
        raise ValueError(f"q_axis {tuple(q_axis.shape)} must be (B, Nh, T={h * w}, H+W={h + w})")
    if not available():
        raise RuntimeError(f"attnconv: the fused kernel is not built ({DISABLE}=1 or no compiler)")
    if compiling():  # the seed a tensor of the graph (no .item())
        seed = seed_tensor(seed if p > 0 or seed is not None else 0)
    else:
        seed = (dropout_seed() if p > 0 else 0) if seed is None else seed
    dt = kernel_dtype(q.dtype)
    ops = operand_dtype(q.dtype)  # the products' operands
    q, k = q.to(ops), k.to(ops)
    v = v if v.dtype == ops else shared(v, ops)  # (B|1, Nh|1, T, dv): one cast copy
    q_axis = q_axis.to(dt).expand(b, nh, t, h + w).contiguous()
    q, k, v, q_axis = first_order_only(
        "the fused axis attention (backend='fused')", q, k, v, q_axis
    )
    with no_autocast(q.device.type):
        args = (q, k, v, q_axis, h, w, scale, p, seed, per_image)
        if compiling():  # the same kernel as one custom op (kernels/ops.py)
            return torch.ops.attnconv.fused_axis(*args)[0]
        return _FusedAxis.apply(*args)


def axis_attention_reference(
    q,
    k,
    v,
    q_axis,
    h: int,
    w: int,
    scale: float,
    p: float = 0.0,
    per_image: bool = True,
    seed: int | None = None,
):
    """The plain equations of ``axis_attention_fused``: the dense (B, Nh, T, T) logits, softmax,
    the links of ``dropped_links`` removed and the rest scaled by 1 / (1 - p), @ v."""
    b, nh, t = q.shape[:3]
    bias = (q_axis[..., :h, None] + q_axis[..., None, h:]).flatten(-2)  # (B|1, Nh, T, T)
    probs = torch.softmax(scale * q @ k.transpose(-2, -1) + bias, -1)
    if p > 0:
        seed = dropout_seed() if seed is None else seed
        dropped = dropped_links(nh, t, b if per_image else None, p, q.device, seed=seed)
        probs = probs.masked_fill(dropped, 0.0) / (1.0 - p)
    return (probs @ v).transpose(1, 2)
