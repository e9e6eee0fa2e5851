"""Helpers of the hypothesis fuzz tests (test_fuzz*.py, their docstring in test_fuzz.py): attempt
a call, expect a one-line error, compare the fast path with the reference (values and
gradients), draw images and bad arguments / inputs, check one layer."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

ERRORS = (ValueError, TypeError)
F64 = torch.float64


def fuzz(n: int):
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _event(label: str) -> None:
    if currently_in_test_context():
        event(label)


def attempt(fn, what: str = "call"):
    """fn() -> (result, None), or (None, error) for a ValueError/TypeError with a one-line
    message. Any other exception propagates and fails the test. ``what`` labels the outcome in
    hypothesis' statistics (pytest --hypothesis-show-statistics)."""
    try:
        out = fn()
        _event(f"{what}: ok")
        return out, None
    except ERRORS as e:
        _event(f"{what}: {type(e).__name__}")
        msg = str(e).strip()
        assert msg, f"{type(e).__name__} without a message"
        assert "\n" not in msg, f"{type(e).__name__} message is not one line: {msg!r}"
        return None, e


def expect_error(fn) -> BaseException:
    out, err = attempt(fn)
    assert err is not None, f"expected a ValueError/TypeError, the call returned {type(out)}"
    return err


def _grads(layer: nn.Module, x: torch.Tensor, out: torch.Tensor, g: torch.Tensor):
    params = [p for p in layer.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out, [x, *params], g, allow_unused=True)
    return [torch.zeros_like(t) if gr is None else gr for t, gr in zip([x, *params], grads)]


def assert_fast_equals_reference(fast: nn.Module, ref: nn.Module, x: torch.Tensor, **kw) -> None:
    """Same outputs and same gradients (input and every parameter) of two copies of a layer."""
    xf = x.detach().clone().requires_grad_(x.is_floating_point())
    xr = x.detach().clone().requires_grad_(x.is_floating_point())
    yf, yr = fast(xf, **kw), ref(xr, **kw)
    torch.testing.assert_close(yf, yr, rtol=1e-7, atol=1e-9)
    assert torch.isfinite(yf).all()
    g = torch.randn_like(yr)
    names = ["input"] + [n for n, p in ref.named_parameters() if p.requires_grad]
    for name, a, b in zip(names, _grads(fast, xf, yf, g), _grads(ref, xr, yr, g)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8, msg=lambda m, n=name: f"{n}: {m}")


def reference_copy(layer: nn.Module) -> nn.Module:
    ref = copy.deepcopy(layer)
    ref.backend = "reference"
    return ref


@st.composite
def image(draw, b, c, h, w, dtype=F64):
    """A (b, c, h, w) tensor in one of four memory layouts (the values do not depend on it)."""
    layout = draw(st.sampled_from(["contiguous", "channels_last", "transposed", "strided"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if layout == "transposed":
        return torch.randn(b, c, w, h, generator=gen, dtype=dtype).transpose(2, 3)
    if layout == "strided":
        return torch.randn(b, c, 2 * h, w, generator=gen, dtype=dtype)[:, :, ::2]
    x = torch.randn(b, c, h, w, generator=gen, dtype=dtype)
    return x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x


@st.composite
def perturb(draw, kw: dict, bad: dict) -> tuple[dict, str | None]:
    """kw unchanged half of the time, else with one argument replaced by a value from ``bad``."""
    if draw(st.booleans()):
        return kw, None
    name = draw(st.sampled_from(sorted(bad)))
    return kw | {name: draw(st.sampled_from(bad[name]))}, name


@st.composite
def perturb_input(draw, x: torch.Tensor):
    """x unchanged 2 times in 3, else a wrong type, dtype, rank, channel count or an empty one."""
    kind = draw(st.sampled_from([None] * 12 + list(BAD_INPUTS)))
    return (x, None) if kind is None else (BAD_INPUTS[kind](x), kind)


BAD_INPUTS = {
    "float32": lambda x: x.float(),
    "float16": lambda x: x.half(),
    "int": lambda x: x.long(),
    "bool": lambda x: x > 0,
    "complex": lambda x: x.to(torch.complex128),
    "rank-": lambda x: x[0],
    "rank+": lambda x: x[..., None],
    "channels": lambda x: torch.cat([x, x], 1),
    "empty": lambda x: x[:0],
    "empty-last": lambda x: x[..., :0],
    "list": lambda x: x.tolist(),
    "numpy": lambda x: x.detach().numpy(),
}
MODES = ["zeros", "replicate", "circular", "reflect"]
BAD_SIZE = [0, -1, 2.0, "2", None, True]


def check_layer(build, x, bad: str | None, bad_input: str | None, **kw) -> None:
    """The contract: a valid layer on a valid input works and fast == reference; otherwise it
    works and fast == reference, or the build/forward raises a clear error (and the reference
    path refuses the same input)."""
    layer, err = attempt(build, "build")
    if bad is None:
        assert err is None, f"valid configuration refused: {err}"
    if layer is None:
        return
    ref = reference_copy(layer)
    out, err = attempt(lambda: layer(x, **kw), "forward")
    if bad is None and bad_input is None:
        assert err is None, f"valid input refused: {err}"
    if err is not None:
        expect_error(lambda: ref(x, **kw))
        return
    assert_fast_equals_reference(layer, ref, x, **kw)
