"""What a convolution module really computes, as a plain convolution, and the check that the
conversion reproduces it (Theorem 1 on the networks people train).

Model zoos subclass ``nn.Conv2d`` with their own ``forward``: TensorFlow-style "SAME" padding
computed per input size, weight standardization (with eps and a gain) applied to the weight in
``forward``, ``torch.nn.utils.parametrize`` weights. Reading ``conv.weight`` / ``conv.padding``
of such a module converts the wrong function. So:

- ``conv_spec(module)`` returns the ``ConvSpec`` (effective weight, bias, geometry). A rule in
  ``CONV_RULES`` (keyed by class; ``register_conv_rule`` adds one for your own subclass) decides;
  plain ``nn.Conv1d`` / ``nn.Conv2d`` (parametrized or not) read their attributes. Any other
  subclass is *traced*: its ``forward`` runs on probe inputs of several sizes under a
  ``TorchFunctionMode`` that records the one ``F.conv1d/conv2d`` call (its weight as computed:
  standardization and gains folded in) and an ``F.pad`` of the input before it. Padding that is
  the same at every size is static; padding that follows TensorFlow's "SAME" formula at every size
  becomes ``ConvGeometry.dynamic_same``; anything else is refused (``UnsupportedConv``).
- ``check_conversion(original, converted)`` compares the two modules' outputs on probe inputs
  (odd, even and non-square sizes the module accepts) and raises ``UnsupportedConv`` naming the
  largest relative difference: a conversion is accepted only if it matches.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize
from torch.overrides import TorchFunctionMode

from .geometry import ConvGeometry, _resolve_padding, conv_geometry


class UnsupportedConv(ValueError):
    """A convolution module whose function the conversion cannot reproduce (a ValueError).

    Its message says what cannot be reproduced; ``convert_model`` puts the module's path and
    class before it.
    """


@dataclass(frozen=True)
class ConvSpec:
    """A plain convolution: ``weight`` as the forward uses it ((Cout, Cin/g, Kh, Kw) or
    (Cout, Cin/g, K)), ``bias`` (Cout,) or None, and the geometry (padding included).

    Args:
        weight: the effective kernel (Cout, Cin/g, Kh, Kw), or (Cout, Cin/g, K) for a Conv1d:
            standardization, gains and parametrizations already applied.
        bias: the (Cout,) bias, or None.
        geometry: channels, kernel size, stride, dilation, groups and padding.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    geometry: ConvGeometry


ConvRule = Callable[[nn.Module], ConvSpec]
CONV_RULES: dict[type, ConvRule] = {}


def register_conv_rule(cls: type, rule: ConvRule | None = None):
    """Register ``rule(module) -> ConvSpec`` for modules of exactly class ``cls`` (usable as a
    decorator: ``@register_conv_rule(MyConv)``). Registered rules win over tracing.

    Args:
        cls: the module class the rule reads (subclasses of it are not matched).
        rule: ``rule(module) -> ConvSpec``; None to use the call as a decorator.

    Returns:
        (Callable): ``rule``, or with ``rule=None`` a decorator that registers the function it
            wraps.
    """
    if rule is None:
        return lambda r: register_conv_rule(cls, r)
    CONV_RULES[cls] = rule
    return rule


def plain_spec(conv: nn.Module) -> ConvSpec:
    """nn.Conv1d / nn.Conv2d read as they are (a parametrized weight evaluates on access)."""
    bias = conv.bias.detach() if conv.bias is not None else None
    return ConvSpec(conv.weight.detach(), bias, conv_geometry(conv))


register_conv_rule(nn.Conv1d, plain_spec)
register_conv_rule(nn.Conv2d, plain_spec)


def _ndim(module: nn.Module) -> int:
    return 1 if isinstance(module, nn.Conv1d) else 2


def _probe_kind(module: nn.Module) -> tuple[torch.dtype, torch.device | None]:
    """dtype and device of the probe inputs: the module's parameters' (float32 if none)."""
    p = next(module.parameters(), None)
    dt = p.dtype if p is not None and p.is_floating_point() else torch.float32
    return dt, (p.device if p is not None else None)


def probe_sizes(module: nn.Module) -> list[tuple[int, ...]]:
    """Odd, even and non-square input sizes a little larger than the module's dilated kernel
    and its padding (reflect / circular padding needs an input larger than the pad), covering
    every remainder modulo its stride up to 3."""
    k, s, d = (tuple(getattr(module, a)) for a in ("kernel_size", "stride", "dilation"))
    span = max(dd * (kk - 1) + 1 for kk, dd in zip(k, d))
    pad = getattr(module, "padding", 0)  # "same" pads less than the span, "valid" not at all
    pad = 0 if isinstance(pad, str) else max((pad,) if isinstance(pad, int) else pad, default=0)
    a = max(span, int(pad) + 1) + 2 * max(s) + 1
    if _ndim(module) == 1:
        return [(a,), (a + 1,), (a + 2,)]
    return [(a, a + 1), (a + 1, a + 3), (a + 2, a)]


def probe_input(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """A random probe from its own generator: converting never moves the global RNG (a seeded
    run draws the same numbers after a conversion as without one)."""
    gen = torch.Generator().manual_seed(sum(shape))
    return torch.randn(shape, generator=gen, dtype=dtype).to(device)


class _Tracer(TorchFunctionMode):
    """Records the F.pad and convolution calls of one forward."""

    def __init__(self):
        super().__init__()
        self.pads: list[tuple[torch.Tensor, torch.Tensor, dict]] = []  # (input, output, args)
        self.convs: list[tuple[torch.Tensor, dict]] = []  # (output, bound args)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is F.pad:
            names = ("input", "pad", "mode", "value")
            self.pads.append((args[0], out, {**dict(zip(names, args)), **kwargs}))
        elif func in (F.conv2d, F.conv1d):
            names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
            self.convs.append((out, {**dict(zip(names, args)), **kwargs}))
        return out


def _trace_once(module: nn.Module, x: torch.Tensor):
    """(conv args, explicit pad (l, r, t, b), pad mode) of ``module(x)``; UnsupportedConv when
    the forward is not one convolution of x (possibly padded)."""
    tracer = _Tracer()
    with torch.no_grad(), tracer:
        y = module(x)
    convs = [c for c in tracer.convs if c[0] is y]
    if len(tracer.convs) != 1 or not convs:
        raise UnsupportedConv(
            f"its forward makes {len(tracer.convs)} convolution calls, and the output must be "
            "exactly one convolution's"
        )
    args = convs[0][1]
    src, pad, mode = args["input"], (0, 0, 0, 0), "zeros"
    if src is not x:
        found = [p for p in tracer.pads if p[1] is src and p[0] is x]
        if not found:
            raise UnsupportedConv("its forward transforms the input before the convolution")
        p = found[0][2]
        amounts = tuple(int(v) for v in p["pad"])
        if len(amounts) not in (2, 4) or min(amounts) < 0:
            raise UnsupportedConv(f"unsupported input padding {amounts}")
        pad = amounts + (0, 0) if len(amounts) == 2 else amounts
        m = p.get("mode") or "constant"
        if m == "constant" and p.get("value") not in (None, 0, 0.0):
            raise UnsupportedConv(f"constant padding with value {p.get('value')}")
        mode = "zeros" if m == "constant" else m
    return args, pad, mode


def traced_spec(module: nn.Module) -> ConvSpec:
    """The ConvSpec of a Conv1d/Conv2d subclass from its own forward on probe inputs."""
    ndim, cin = _ndim(module), module.in_channels
    dt, dev = _probe_kind(module)
    runs = []
    for size in probe_sizes(module):
        x = probe_input((1, cin, *size), dt, dev)
        try:
            runs.append((size, *_trace_once(module, x)))
        except UnsupportedConv:
            raise
        except Exception:  # noqa: BLE001 - a size the module refuses
            continue
    if not runs:
        raise UnsupportedConv("its forward fails on every probe input size")
    args = runs[0][1]
    w = args["weight"].detach()
    b = args.get("bias")
    for _, a, _, _ in runs[1:]:
        if not torch.equal(a["weight"], args["weight"]):
            raise UnsupportedConv("its effective weight changes with the input")
    k = tuple(w.shape[2:]) if ndim == 2 else (1, w.shape[2])

    def pair(v, lead: int = 1):  # 2-D form; Conv1d's row axis gets ``lead``
        v = (v,) * ndim if isinstance(v, int) else tuple(v)
        return tuple(int(t) for t in v) if ndim == 2 else (lead, int(v[0]))

    stride, dilation = pair(args.get("stride", 1)), pair(args.get("dilation", 1))
    conv_pad = args.get("padding", 0)
    ns = SimpleNamespace(padding=conv_pad if isinstance(conv_pad, str) else pair(conv_pad, 0))
    static = _resolve_padding(ns, k, dilation, 2)
    pads = [r[2] for r in runs]
    modes = {r[3] for r in runs}
    geom = ConvGeometry(
        in_channels=cin,
        out_channels=w.shape[0],
        kernel=k,
        stride=stride,
        dilation=dilation,
        pad=static,
        padding_mode="zeros",
        groups=int(args.get("groups", 1)),
        ndim=ndim,
        padding=conv_pad,
    )
    if all(pd == pads[0] for pd in pads):  # static explicit padding
        if any(pads[0]) and any(static) and modes != {"zeros"}:
            raise UnsupportedConv("mixed explicit and built-in padding of different modes")
        total = tuple(a + c for a, c in zip(pads[0], static))
        geom = replace(geom, pad=total, padding_mode=modes.pop())
    elif (
        modes == {"zeros"}
        and not any(static)
        and all(pd == _tf_same(size, geom) for (size, *_), pd in zip(runs, pads))
    ):
        geom = replace(geom, pad=(0, 0, 0, 0), dynamic_same=True)
    else:
        raise UnsupportedConv(
            "its padding changes with the input size and is not TensorFlow's 'SAME'"
        )
    return ConvSpec(w, b.detach() if b is not None else None, geom)


def _tf_same(size: tuple[int, ...], g: ConvGeometry) -> tuple[int, int, int, int]:
    """The padding TensorFlow's "SAME" gives geometry ``g`` at input ``size``."""
    hw = (1, size[0]) if g.ndim == 1 else size
    return replace(g, dynamic_same=True).pad_for(*hw)


def conv_spec(module: nn.Module) -> ConvSpec:
    """The plain convolution ``module`` computes (see the module docstring).

    Args:
        module: an ``nn.Conv1d`` / ``nn.Conv2d``, a subclass of one, or a module of a class with
            a registered rule.

    Returns:
        Its effective weight, bias and geometry.

    Raises:
        UnsupportedConv: no rule reads the module and its forward is not one convolution of
            its (padded) input.
    """
    cls = parametrize.type_before_parametrizations(module)
    rule = CONV_RULES.get(cls)
    hooked = bool(module._forward_pre_hooks or module._forward_hooks)  # e.g. old weight_norm
    if rule is not None and not (hooked and rule is plain_spec):
        return rule(module)
    if not isinstance(module, (nn.Conv1d, nn.Conv2d)):
        raise UnsupportedConv(f"no conversion rule for {cls.__name__}")
    return traced_spec(module)


class SpecConv(nn.Module):
    """A ConvSpec run as the plain convolution it describes (F.conv2d on the padded input)."""

    def __init__(self, spec: ConvSpec):
        super().__init__()
        self.spec, self.in_channels = spec, spec.geometry.in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, w = self.spec.geometry, self.spec.weight
        x2, w2 = (x, w) if g.ndim == 2 else (x.unsqueeze(2), w.unsqueeze(2))
        y = F.conv2d(g.pad_input(x2), w2, self.spec.bias, g.stride, 0, g.dilation, g.groups)
        return y if g.ndim == 2 else y.squeeze(2)


def _tolerance(dtype: torch.dtype) -> float:
    return {torch.float64: 1e-9, torch.float32: 1e-4}.get(dtype, 3e-2)


@torch.no_grad()
def check_conversion(original: nn.Module, converted: nn.Module, what: str = "conversion") -> float:
    """Largest relative output difference (max |diff| / max |y|) over the probe sizes the
    original accepts; UnsupportedConv if any exceeds the dtype's tolerance (1e-4 in float32)
    or a shape differs."""
    dt, dev = _probe_kind(original)
    worst, tried = 0.0, 0
    for size in probe_sizes(original):
        x = probe_input((2, original.in_channels, *size), dt, dev)
        try:
            ref = original(x)
        except Exception:  # noqa: BLE001 - a size the module refuses
            continue
        tried += 1
        got = converted(x)
        if got.shape != ref.shape:
            raise UnsupportedConv(
                f"the {what} gives shape {tuple(got.shape)} where the module gives "
                f"{tuple(ref.shape)} for input {tuple(x.shape)}"
            )
        scale = ref.abs().max().item()
        rel = (got - ref).abs().max().item() / scale if scale > 0 else 0.0
        worst = max(worst, rel if math.isfinite(rel) else math.inf)
        if not rel <= _tolerance(dt):
            raise UnsupportedConv(
                f"the {what} differs from the module's own forward by {rel:.2g} (relative) "
                f"on input {tuple(x.shape)}"
            )
    if not tried:
        raise UnsupportedConv("its forward fails on every probe input size")
    return worst
