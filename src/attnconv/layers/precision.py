"""Precision policy of the attention kernels, in one place: which dtype each computes in, the
upcast helpers and the autocast-off context.

- Position logits like the quadratic -alpha (d - Delta)^2 (Cordonnier et al. eq. 9) reach 1e5+
  and cancel: they are built in float32 at least (``hi``) whatever the layer's dtype.
- Softmax runs in float32 at least (``softmax_f32``): bfloat16 logits lose the max-subtraction.
- The query-blocked kernels (blocked.py) compute in float32, float64 stays (``kernel_dtype``).
- The fold, the shared bias and the Flex score_mod keep their large positional logits out of
  bfloat16: ``upcast`` q, k, v and run with autocast off (``no_autocast``).
"""

from __future__ import annotations

import functools
import weakref
from contextlib import contextmanager, nullcontext

import torch

LOW = (torch.bfloat16, torch.float16)


def hi(t: torch.Tensor) -> torch.Tensor:
    """float32 copy of a bfloat16/float16 tensor (parameters, queries), anything else as is."""
    return t.float() if t.dtype in LOW else t


def _hooks_free() -> bool:
    """No saved-tensor hooks of anyone else's are open (a user's activation checkpointing or CPU
    offload: only the innermost pair applies, so ours would take their tensors), hooks can be
    pushed, and no compiler is tracing."""
    autograd = torch._C._autograd
    top = getattr(autograd, "_top_saved_tensors_default_hooks", None)
    enabled = getattr(autograd, "_saved_tensors_hooks_is_enabled", None)
    if top is None or enabled is None or torch.compiler.is_compiling():
        return False
    return enabled() and top(False) is None


@contextmanager
def hi_kept_low(t: torch.Tensor):
    """``hi(t)`` for the block, where autograd keeps ``t`` in place of hi(t) or any view of it
    and makes the float32 copy again in the backward (exact: hi is a cast). A bfloat16 q read in
    float32 (the relative tables' logits) then holds no float32 copy from forward to backward:
    at the paper's content model, 368 MB a layer (docs/benchmarks.md). The plain ``hi`` where
    other saved-tensor hooks are open (``_hooks_free``); t or hi(t) changed in place before the
    backward is an error, as autograd's own check makes it."""
    high = hi(t)
    if high is t or not torch.is_grad_enabled() or not _hooks_free():
        yield high
        return
    # what identifies hi(t) and its views, no reference to it held
    key = (high.dtype, high.device, high.untyped_storage().data_ptr())
    version, layout, made = t._version, (t.shape, t.stride()), weakref.ref(high)

    def pack(x: torch.Tensor):
        if x.numel() and (x.dtype, x.device, x.untyped_storage().data_ptr()) == key:
            if x._version == 0:  # hi(t) as made: t can make it again
                return (x.size(), x.stride(), x.storage_offset())
        return x

    def unpack(x):
        if not isinstance(x, tuple):
            return x
        changed = (h := made()) is not None and h._version != 0  # hi(t) written after
        if changed or t._version != version or (t.shape, t.stride()) != layout:
            raise RuntimeError(
                "attnconv: a tensor the backward needs (the queries read in float32) was "
                "modified in place after the forward"
            )
        return hi(t).as_strided(*x)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield high


def kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """The blocked kernels' dtype: float64 stays, anything else (float32, bfloat16 under
    autocast) runs in float32 (the positional logits reach alpha H^2 and bfloat16 would round
    them)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def operand_dtype(dtype: torch.dtype) -> torch.dtype:
    """The fused CPU kernel's product operands (q, k, v, P, dS): bfloat16 (autocast's) stays, as
    the plain autocast path's products take it (each product's float32 sum rounded once); the
    axis logits, softmax and every sum in kernel_dtype. Any other dtype: kernel_dtype."""
    return torch.bfloat16 if dtype == torch.bfloat16 else kernel_dtype(dtype)


def softmax_f32(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim in at least float32 (bfloat16/float16 logits lose the
    max-subtraction's precision); the one place every attention path normalizes."""
    return torch.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))


def upcast(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """float32 copies of q, k, v when the first is bfloat16/float16 (attention whose
    positional logits bfloat16 would round), the tensors themselves otherwise."""
    return tuple(t.float() for t in ts) if ts[0].dtype in LOW else ts


def autocast_known(device_type: str) -> bool:
    """Whether autocast knows ``device_type`` (not ``meta``: shape inference, FLOP counting)."""
    if device_type in ("cpu", "cuda"):  # always (torch 2.8's Dynamo cannot trace the ask)
        return True
    known = getattr(torch.amp, "is_autocast_available", None)  # torch >= 2.4 (older: a list)
    return known(device_type) if known else device_type in ("cpu", "cuda", "xpu", "mps", "hpu")


def autocast_on(device_type: str) -> bool:
    """Autocast enabled on ``device_type``; False on a device autocast does not know, where
    asking would raise."""
    return autocast_known(device_type) and torch.is_autocast_enabled(device_type)


def autocast_dtype(device_type: str, default: torch.dtype) -> torch.dtype:
    """The dtype a matmul (``F.linear``, a conv) computes in on ``device_type``: autocast's when
    it is on, ``default`` otherwise (kernels that sum in float32 return in this dtype)."""
    return torch.get_autocast_dtype(device_type) if autocast_on(device_type) else default


def no_autocast(device_type: str, off: bool = True):
    """Autocast disabled on ``device_type`` (when ``off``): the kernel's own dtypes hold. A
    device autocast does not know has it off already."""
    off = off and autocast_known(device_type)
    return torch.autocast(device_type, enabled=False) if off else nullcontext()


def backward_without_autocast(backward):
    """Decorates the backward of a custom autograd function whose forward ran with autocast off:
    a backward called inside an autocast region (on CPU it runs on the caller's thread) runs
    with autocast off too, or its float32 products would be cast."""

    @functools.wraps(backward)
    def run(ctx, grad, *rest):
        with no_autocast(grad.device.type):
            return backward(ctx, grad, *rest)

    return run


def shared(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, Nh, T, d) -> (B|1, Nh|1, T, d) in ``dtype``, unit stride on the last axis (the kernels'
    loads): a batch or head axis expanded at stride 0 kept as one copy, one cast copy at most."""
    for d in (0, 1):
        if x.stride(d) == 0 and x.shape[d] > 1:
            x = x.narrow(d, 0, 1)
    fmt = torch.preserve_format if x.stride(-1) == 1 else torch.contiguous_format
    return x.to(dtype, memory_format=fmt)


def shared_sum(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The kernel's gradient g (B, Nh, T, d), accumulation dtype, for ``x`` (B|1, Nh|1, T, d):
    summed over the axes x shares before it is rounded to x's dtype."""
    dims = [d for d in (0, 1) if x.shape[d] < g.shape[d]]
    return (g.sum(dims, keepdim=True) if dims else g).to(x.dtype)
