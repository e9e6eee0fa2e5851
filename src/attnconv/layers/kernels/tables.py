"""The smaller kernel tables of kernels/plan.py (which re-exports them; plan.choose reads each):
the k x k window attention's (``LOCAL_TABLE``), the hidden dropout's mask (``DROPOUT_TABLE``)
and a converted convolution's forward (``CONVERTED_TABLE``)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..rows import Row
from . import fused
from .capability import flex_window, fused_built, triton_window_fits


class LocalCase(NamedTuple):
    """What LOCAL_TABLE reads: the backend override, the device, the border, whether the maps
    are returned, whether a compiler traces the forward (no C++ extension call then, but for
    torch.compile, ``compiled``: the custom op of ops.py), the dtype q, k, v compute in
    (autocast's) and the number of pixels (0: no input given); the attention stem's mixed
    values (``mix``) and the sizes the Triton window kernel's limits read."""

    backend: str | None = None
    device: str = "cpu"
    padding: str = "mask"
    maps: bool = False
    tracing: bool = False
    dtype: torch.dtype | None = None
    t: int = 0
    transformed: bool = False  # inside a torch.func transform
    compiled: bool = False  # torch.compile traces (not an export)
    mix: bool = False  # spatially-aware values (the attention stem's)
    kernel_size: int = 1
    batch: int = 1
    heads: int = 1
    dk: int = 1
    dv: int = 1
    h: int = 1
    w: int = 1
    grad: bool = True  # a backward follows


# On CUDA the window function from this many pixels in float32, Flex below: set by
# benchmarks/results/cuda_layers_local.md, measured by `attnconv bench --suite cuda -- --only
# local` (docs/benchmarks.md, "On a GPU"); sizes between 28x28 and 56x56 were not measured.
WINDOW_CUDA_MIN_T = 56 * 56


def _window_beats_flex(c: LocalCase) -> bool:
    return c.backend is None and c.dtype == torch.float32 and c.t >= WINDOW_CUDA_MIN_T


# kernels/window.py's local_attention ("reference": unfold; "fused": the C++ window kernel of
# fused_local.cpp; "window": the Python window function), flex.flex_local_attention or
# triton_local.local_attention_triton
LOCAL_TABLE = (
    Row(
        "reference",
        lambda c: c.backend == "reference" or c.transformed,
        "any",
        'backend="reference", or a torch.func transform: unfold',
    ),
    Row(
        "triton",
        lambda c: c.backend == "triton",
        'padding="mask"',
        'backend="triton" (triton_local.py), no returned maps',
        'padding="mask" and no returned attention maps',
        triton_window_fits,
    ),
    Row(
        "flex",
        lambda c: (
            (c.device == "cuda" if c.backend is None else c.backend == "flex")
            and not _window_beats_flex(c)
        ),
        'padding="mask"',
        'CUDA (or backend="flex"), no returned maps; not float32 from WINDOW_CUDA_MIN_T '
        "pixels (the window function measured faster there)",
        'padding="mask" and no returned attention maps',
        flex_window,
    ),
    Row(
        "fused",
        lambda c: c.backend in (None, "fused"),
        "any",
        "CPU, extension built, not exported",
        "a CPU, with the C++ kernels built (attnconv build-kernels), not exported",
        fused_built,
    ),
    Row("window", lambda c: True, "any", "otherwise: the Python window kernel"),
)


class DropoutCase(NamedTuple):
    """What DROPOUT_TABLE reads: the device, and whether the module HashDropout asks (it keeps
    torch's own dropout off the CPU) or the function hash_dropout (the hash on every device)."""

    device: str = "cpu"
    module: bool = False
    transformed: bool = False  # inside a torch.func transform


DROPOUT_TABLE = (
    Row(
        "torch",
        lambda c: c.module and c.device != "cpu",
        "HashDropout",
        "off the CPU: torch's fused dropout (the hash's integer passes cost more there)",
    ),
    Row(
        "fused",
        lambda c: c.device == "cpu" and not c.transformed,
        "any",
        "CPU, extension built (dropout.cpp), not in a torch.func transform",
        "",
        lambda c: None if fused.available() else "the C++ kernels are not built",
    ),
    Row("reference", lambda c: True, "any", "otherwise: hash_dropout_reference"),
)


class ConvertedCase(NamedTuple):
    """What CONVERTED_TABLE reads: hard heads (one-hot attention), the attention's backend, the
    maps returned, an export or torch.compile tracing the forward (the shift reads indices as
    Python ints), and whether a head's shift clamps at the border (only known for hard
    heads)."""

    hard: bool = False
    backend: str | None = None
    maps: bool = False
    exporting: bool = False  # or compiled: the shift reads the centres as Python ints
    clamped: bool = False


CONVERTED_TABLE = (
    Row(
        "attention",
        lambda c: not c.hard or c.backend == "reference" or c.maps or c.exporting,
        "any",
        'soft heads, backend="reference", returned maps, or an export or torch.compile',
    ),
    Row(
        "one_conv",
        lambda c: not c.clamped,
        "hard heads",
        "no clamped border: Lemma 1's sum as one convolution (head_conv.py)",
    ),
    Row("head_mix", lambda c: True, "hard heads", "otherwise: channel mixes of shifted slices"),
)
