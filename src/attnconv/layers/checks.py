"""Argument and input checks shared by the public layers: one clear ValueError/TypeError line.

``positive_int`` for sizes (channels, heads, kernel sizes), ``check_tensor`` for the tensor a
layer's forward receives (a floating tensor of the layer's parameter dtype, no size 0 but the
batch's: a batch of 0 gives an empty output, as PyTorch's layers do). Found
by tests/test_fuzz.py: without them wrong dtypes, empty tensors and zero/float sizes surfaced as
RuntimeError/ZeroDivisionError/AttributeError from deep inside PyTorch.
"""

from __future__ import annotations

import functools
import math

import torch


def finite_float(name: str, val, *, positive: bool = False) -> float:
    """``val`` as a float if it is a finite real number (> 0 with ``positive``, else >= 0),
    else ValueError naming ``name``: inf / nan initial values give all-NaN outputs."""
    try:
        v = float(val)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a real number, got {val!r}") from None
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise ValueError(
            f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {val!r}"
        )
    return v


def positive_int(name: str, val) -> int:
    """``val`` if it is an int >= 1 (not a bool), else ValueError naming ``name``."""
    if not isinstance(val, int) or isinstance(val, bool) or val < 1:
        raise ValueError(f"{name} must be a positive int, got {val!r}")
    return val


def check_tensor(
    x, dtype: torch.dtype | None, *, name: str = "input", allow_empty: bool = False
) -> None:
    """x must be a floating-point tensor of dtype ``dtype`` (the layer's parameters; None or an
    active autocast: any floating dtype) with no size 0 but its first (the batch: a batch of 0
    runs; ``allow_empty``: any size 0)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be floating-point, got dtype {x.dtype}")
    if x.numel() == 0 and not allow_empty and (x.dim() < 2 or 0 in x.shape[1:]):
        raise ValueError(
            f"{name} is empty: shape {tuple(x.shape)} (only the batch may be 0: it gives an "
            "empty output)"
        )
    if dtype is not None and x.dtype != dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"{name} dtype {x.dtype} differs from the layer's parameters ({dtype}); cast the "
            f"input (x.to({dtype})) or the layer (layer.to({x.dtype}))"
        )


def check_maps(layer, shape: tuple[int, ...], x: torch.Tensor) -> None:
    """A layer's ``return_attention`` probabilities of ``shape``, for x (B, C, H, W), refused in
    one line (the size needed and the bound) before any of them is computed when they cannot fit
    in memory (``attnconv.memory.check_attention_maps``; at least float32 probabilities)."""
    from attnconv.memory import check_attention_maps

    b, _, h, w = x.shape
    where = f"{type(layer).__name__} on {b} image(s) of {h}x{w}"
    check_attention_maps([shape], max(x.element_size(), 4), where)


def check_window(q, k, v, rel_row, rel_col, kernel_size) -> None:
    """The local window kernel's tensors must agree (kernels/window.py): k q's (B, nh, d, H, W),
    v (B, nh, [M,] dv, H, W), rel_row / rel_col (k, d // 2) and (k, d - d // 2); else one
    ValueError line (the C++ kernel reads its inputs by q's sizes: past a smaller one)."""
    ks = positive_int("kernel_size", kernel_size)
    b, nh, d, h, w = q.shape
    v_fits = v.dim() in (5, 6) and v.shape[:2] == (b, nh) and v.shape[-2:] == (h, w)
    if (k is not None and k.shape != q.shape) or not v_fits:
        got = ", ".join(str(None if t is None else tuple(t.shape)) for t in (q, k, v))
        raise ValueError(f"k must be q's (B, nh, d, H, W), v (B, nh, [M,] dv, H, W); got {got}")
    tables = [None if t is None else tuple(t.shape) for t in (rel_row, rel_col)]
    if tables != [None, None] and tables != [(ks, d // 2), (ks, d - d // 2)]:
        raise ValueError(
            f"rel_row, rel_col must be ({ks}, {d // 2}), ({ks}, {d - d // 2}), got {tables}"
        )


# the spellings that went, each with the ``backend`` that says it now
RETIRED = {
    "impl": "backend='reference' for the plain equations, or no backend for the plan's choice",
    "fused": "backend='fused' for the fused C++ CPU kernel",
    "compiled": "no option: the plan reads torch.compile itself",
}


def refuse_retired(options: dict, where: str) -> None:
    """One TypeError line when ``options`` (a call's keywords) holds a retired spelling of the
    one knob (``RETIRED``), naming the ``backend`` to pass instead."""
    for name, instead in RETIRED.items():
        if name in options:
            raise TypeError(f"{where}: {name}= is gone, one knob names every kernel: {instead}")


def refuses_retired(fn):
    """``fn`` refusing the retired spellings of its ``backend`` in one line (refuse_retired)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        refuse_retired(kwargs, fn.__name__)
        return fn(*args, **kwargs)

    return call


def backend_of(backend: str | None, backends: tuple[str, ...]) -> str | None:
    """A layer's one knob, ``backend`` (None: its plan's choice), checked against its names."""
    if backend is not None and backend not in backends:
        raise ValueError(f"backend must be None or one of {backends}, got {backend!r}")
    return backend


class BackendKnob:
    """The one kernel knob of an attention layer: ``backend`` (None: the plan's choice, kernels/
    plan.py or functional.SEQUENCE_TABLE; ``"reference"``: the plain equations; else one of
    ``BACKENDS``). A retired spelling (``impl=``, ``fused=``, ``compiled=``) given to the
    constructor, or ``impl`` read or set, is one line naming the backend to use."""

    BACKENDS: tuple[str, ...] = ("reference",)

    def __new__(cls, *args, **kwargs):
        refuse_retired(kwargs, cls.__name__)
        return super().__new__(cls)

    @property
    def backend(self) -> str | None:
        return self._backend

    @backend.setter
    def backend(self, value: str | None) -> None:
        self._backend = self.check_backend(backend_of(value, self.BACKENDS))

    def check_backend(self, value: str | None) -> str | None:
        """A layer's own refusal of a valid name (MultiHeadSelfAttention2d: triton missing)."""
        return value

    def _retired_impl(self, value) -> None:
        refuse_retired({"impl": value}, type(self).__name__)

    impl = property(None, _retired_impl)  # set: one line naming the backend (no getter)


def set_backend(model, backend: str | None) -> int:
    """Set ``backend`` on every attention layer of ``model`` that takes it (its ``BACKENDS``;
    None: back to the plan's choice); layers that do not take it keep theirs (the attention
    stem has no Triton path). Returns how many were set; a name no layer takes is one line."""
    layers = [m for m in model.modules() if isinstance(m, BackendKnob)]
    takes = [m for m in layers if backend is None or backend in m.BACKENDS]
    if backend is not None and not takes:
        names = sorted({b for m in layers for b in m.BACKENDS})
        raise ValueError(
            f"backend {backend!r}: no attention layer of {type(model).__name__} takes it"
            + (f" (they take {', '.join(names)})" if names else " (it has none)")
        )
    for m in takes:
        m.backend = backend
    return len(takes)
