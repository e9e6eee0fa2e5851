"""The Triton kernels (triton_axis.py, and SASA's window through them, triton_local.py) as
``torch.library`` custom ops: what a ``torch.compile``'d forward calls.

Eager runs ``triton_axis._TritonAxis`` as before. While torch.compile traces
(``first_order.compiling``), ``triton_axis.attention`` calls ``attnconv::triton_axis`` instead,
with a fake (the shapes and dtypes the kernels return) and its backward, itself an op
(``attnconv::triton_axis_backward``): Dynamo and AOTAutograd see one opaque call each way and
run the same launches as the eager Function (``triton_axis.run_forward``, ``run_backward``).

Why ``custom_op`` and not ``torch.library.triton_op`` with ``wrap_triton``, which would show the
kernels to Inductor: a launch steps down its rungs where a GPU's shared memory refuses a block
(``triton_axis.launch``: Triton's OutOfResources caught at the launch, the rung remembered), and
the backward runs at the query block the forward ran with, a value only the launch knows;
wrap_triton traces one launch of a fixed configuration, and it takes a ``triton.jit`` function,
which the interpreter (``TRITON_INTERPRET=1``, how the tests run without a GPU) replaces.

The seed is a 0-dim int64 tensor (``functional.seed_tensor``, drawn in the graph): the links
dropped are the eager ones under one seed. The forward returns the query block it ran with as a
0-dim int64 tensor (on the CPU), which its backward reads.
"""

from __future__ import annotations

import torch
from torch.library import custom_op

from ..precision import no_autocast, shared_sum
from . import triton_axis

ARGS = (
    "SymInt h, SymInt w, float scale, float p, Tensor seed, bool per_image, int? block_m, "
    "int window, SymInt[] bh"
)
INPUTS = "Tensor q, Tensor k, Tensor v, Tensor q_axis"


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rows(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``xs`` with unit stride on the last axis, as the kernels load them (the strides of the
    others are read, stride 0 kept): what eager's ``precision.shared`` gives, whatever layout a
    compiler hands the op."""
    return tuple(x if x.stride(-1) == 1 else x.contiguous() for x in xs)


@custom_op(
    "attnconv::triton_axis",
    mutates_args=(),
    schema=f"({INPUTS}, {ARGS}) -> (Tensor, Tensor, Tensor)",
)
def triton_axis_op(q, k, v, q_axis, h, w, scale, p, seed, per_image, block_m, window, bh):
    """y (B, T, Nh, dv), the rows' max and 1 / sum (2, B, Nh, T), the query block it ran with."""
    args = (h, w, scale, p, int(seed), per_image, block_m, window, bh)
    with no_autocast(q.device.type), torch.no_grad():
        y, stats, block = triton_axis.run_forward(*_rows(q, k, v, q_axis), *args)
    return y, stats, torch.tensor(block, dtype=torch.int64)


@triton_axis_op.register_fake
def _(q, k, v, q_axis, h, w, scale, p, seed, per_image, block_m, window, bh):
    b, nh = bh
    t = q.shape[2]
    y = q.new_empty(b, t, nh, v.shape[-1])
    stats = q.new_empty(2, b, nh, t, dtype=_acc(q.dtype))
    return y, stats, torch.empty((), dtype=torch.int64)


@custom_op(
    "attnconv::triton_axis_backward",
    mutates_args=(),
    schema=f"(Tensor dy, {INPUTS}, Tensor stats, Tensor block, {ARGS}) "
    "-> (Tensor, Tensor, Tensor, Tensor)",
)
def triton_axis_backward(dy, q, k, v, q_axis, stats, block, h, w, scale, p, seed, per_image,
                         block_m, window, bh):  # fmt: skip
    """dq, dk, dv (B, Nh, T, d) and d q_axis (B, Nh, T, H + W; a window's (B, Nh, T, 2k)), in
    the accumulation dtype, at the full (B, Nh)."""
    args = (h, w, scale, p, int(seed), per_image, block_m, window, bh)
    xs = _rows(q, k, v, q_axis)
    dy, stats = dy.contiguous(), stats.contiguous()
    with no_autocast(q.device.type), torch.no_grad():
        return triton_axis.run_backward(dy, *xs, stats, int(block), *args)


@triton_axis_backward.register_fake
def _(dy, q, k, v, q_axis, stats, block, h, w, scale, p, seed, per_image, block_m, window, bh):
    b, nh = bh
    t, acc = q.shape[2], _acc(q.dtype)
    na = 2 * window if window else h + w
    return tuple(
        q.new_empty(b, nh, t, n, dtype=acc) for n in (q.shape[3], q.shape[3], v.shape[3], na)
    )


def _setup(ctx, inputs, output):
    q, k, v, q_axis, *ctx.args = inputs
    seed = ctx.args[4]
    ctx.args[4] = None  # the seed travels as a saved tensor
    ctx.save_for_backward(q, k, v, q_axis, output[1], output[2], seed)


def _backward(ctx, dy, _dstats, _dblock):
    q, k, v, q_axis, stats, block, seed = ctx.saved_tensors
    args = list(ctx.args)
    args[4] = seed
    dy = dy.to(q.dtype).contiguous()
    grads = triton_axis_backward(dy, q, k, v, q_axis, stats, block, *args)
    needs = ctx.needs_input_grad[:4]
    grads = (shared_sum(g, x) if n else None for g, x, n in zip(grads, (q, k, v, q_axis), needs))
    return (*grads, *(None,) * 9)


triton_axis_op.register_autograd(_backward, setup_context=_setup)
