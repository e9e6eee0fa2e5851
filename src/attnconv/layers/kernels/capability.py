"""What each kernel can run, apart from which one the plan would pick (rows.py): each function
reads a table's case (plan.Case, tables.LocalCase) and returns None where the kernel runs it,
else why not in one line. The tables' rows carry them as ``can_run``; the kernels check nothing
again once chosen.

- ``fused_built``: the C++ CPU kernels (fused.py): a CPU, the extension built, not traced by an
  export (torch.compile runs them as the custom ops of ops.py);
- ``flex_installed``: FlexAttention (torch 2.5 or later);
- ``triton_axis_fits`` / ``triton_window_fits``: the Triton kernels (triton_axis.py,
  triton_local.py): triton installed, CUDA or its interpreter, the dtypes, shape limits and the
  GPU's shared memory (triton_compile.fit: a compile outside the tested envelope, cached);
- ``window_maskable``: what FlexAttention's and Triton's window kernels take of SASA's layers
  (the border masked, no returned maps, no mixed values).
"""

from __future__ import annotations

import importlib.util
from typing import NamedTuple

import torch

from . import fused, triton_axis, triton_compile, triton_local

FLEX = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def fused_built(c: NamedTuple) -> str | None:
    if c.device != "cpu":
        return f"the fused C++ kernels run on a CPU, not {c.device}"
    if c.tracing and not c.compiled:
        return "an export cannot trace into the C++ extension"
    if not fused.available():
        return "the C++ kernels are not built (attnconv build-kernels)"
    return None


def flex_installed(c: NamedTuple) -> str | None:
    return None if FLEX else f"FlexAttention needs torch 2.5 or later, not {torch.__version__}"


def _like(c: NamedTuple, *shape: int) -> torch.Tensor:
    """A tensor of the case's dtype and device with ``shape``, holding one element (stride 0):
    what the Triton checks read of q and v (shape, dtype, device), no memory."""
    dtype = c.dtype or torch.float32
    return torch.empty((), dtype=dtype, device=c.device).expand(*shape)


def triton_here(c: NamedTuple) -> str | None:
    """Whether the Triton kernels run at all for ``c``: installed, on CUDA or its interpreter."""
    if not triton_axis.INSTALLED:
        return "triton is not installed (pip install triton)"
    if c.device != "cuda" and not triton_axis.interpreted():
        return f"the Triton kernels run on CUDA (or under TRITON_INTERPRET=1), not {c.device}"
    return None


def _sized(c: NamedTuple) -> bool:
    """Whether the case's sizes can be checked here: an input given (t > 0) on a device this
    machine has (a layer asked of CUDA on a machine without one: installed and device alone)."""
    return c.t > 0 and (c.device != "cuda" or torch.cuda.is_available())


def triton_axis_fit(c: NamedTuple) -> triton_compile.Fit:
    """triton_compile's ``Fit`` of the axis kernel for ``c`` (plan.Case): why it cannot run, or
    the query block its kernels share on this GPU."""
    why = triton_here(c)
    if why or not _sized(c):
        return triton_compile.Fit(why)
    q, v = _like(c, c.batch, c.heads, c.t, c.dk), _like(c, c.batch, c.heads, c.t, c.dv)
    why = triton_axis.unsupported(q, v, c.h, c.w)
    if why:
        return triton_compile.Fit(why)
    return triton_compile.fit(q, v, c.h, c.w, c.p_drop, c.per_image, c.grad)


def triton_axis_fits(c: NamedTuple) -> str | None:
    return triton_axis_fit(c).why


def window_maskable(c: NamedTuple) -> str | None:
    """The window kernels of FlexAttention and Triton: the border masked, no returned maps, one
    value map per key (not the attention stem's spatially-aware values)."""
    if c.padding != "mask":
        return f'it takes padding="mask", not {c.padding!r}'
    if c.maps:
        return "it returns no attention maps"
    if c.mix:
        return "it takes no spatially-aware values (the attention stem's)"
    return None


def triton_window_fit(c: NamedTuple) -> triton_compile.Fit:
    """``Fit`` of the Triton window kernel for ``c`` (tables.LocalCase)."""
    why = window_maskable(c)
    why = why or triton_here(c)
    if why or not _sized(c):  # no input given: what the layer and the device say
        return triton_compile.Fit(why)
    # triton_local reads (B, Nh, d, H, W) maps
    q = _like(c, c.batch, c.heads, c.dk, c.h, c.w)
    v = _like(c, c.batch, c.heads, c.dv, c.h, c.w)
    why = triton_local.unsupported(q, v, c.h, c.w, c.padding, c.kernel_size)
    if why:
        return triton_compile.Fit(why)
    qs, vs = q.flatten(3).mT, v.flatten(3).mT  # (B, nh, T, d) views, as the kernel's
    return triton_compile.fit(qs, vs, c.h, c.w, 0.0, True, c.grad, c.kernel_size)


def triton_window_fits(c: NamedTuple) -> str | None:
    return triton_window_fit(c).why


def flex_window(c: NamedTuple) -> str | None:
    return flex_installed(c) or window_maskable(c)
