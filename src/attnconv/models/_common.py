"""Helpers shared by the model files: config overrides with clear errors, image-size checks."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, TypeVar

import torch

C = TypeVar("C")


# a config field's annotation -> the values it takes (bool is no int nor float here)
_KINDS = {"int": numbers.Integral, "float": numbers.Real, "bool": bool, "str": str}


def check_option(model: str, name: str, kind: str, val: Any) -> None:
    """ValueError unless ``val`` fits the field annotation ``kind`` ("float", "bool | None",
    ...): a string eps or a "false" flag fails here, not later in a forward pass. Other
    annotations (tuples, tensors) are the model's to check."""
    base, _, rest = kind.partition(" | ")
    want = _KINDS.get(base)
    if want is None or (rest == "None" and val is None):
        return
    if not isinstance(val, want) or (want is not bool and isinstance(val, bool)):
        none = " or None" if rest == "None" else ""
        raise ValueError(
            f"{model}: {name} must be {'an' if base == 'int' else 'a'} {base}{none}, got {val!r}"
        )


def build_config(cfg_cls: type[C], model: str, defaults: dict[str, Any], overrides: dict) -> C:
    """``cfg_cls(**defaults | overrides)``; unknown overrides: ValueError listing known ones,
    a value of another type than its field's: ValueError naming it."""
    fields = {f.name: f.type for f in dataclasses.fields(cfg_cls)}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(
            f"{model}: unknown option(s) {', '.join(unknown)}; known: {', '.join(fields)}"
        )
    kwargs = {**defaults, **overrides}
    for name, val in kwargs.items():
        check_option(model, name, str(fields[name]), val)
    return cfg_cls(**kwargs)


def check_stages(model: str, widths, depths) -> None:
    """Per-stage widths and block counts of a ResNet: equal-length lists of ints >= 1."""
    for name, vals in (("widths", widths), ("depths", depths)):
        ok = isinstance(vals, (list, tuple)) and len(vals) > 0
        if not ok or any(
            isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1 for v in vals
        ):
            raise ValueError(f"{model}: {name} must be a list of ints >= 1, got {vals!r}")
    if len(widths) != len(depths):
        raise ValueError(f"{model}: widths {widths} and depths {depths} must match in length")


def check_images(
    x: torch.Tensor, in_chans: int, model: str, like: torch.nn.Module | None = None
) -> None:
    """x must be a float NCHW batch with ``in_chans`` channels and images of at least 1x1 (a
    batch of 0 runs: an empty output), of the dtype of the parameters of ``like`` (if given; any
    floating dtype under autocast)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{model}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4 or x.shape[1] != in_chans:
        raise ValueError(
            f"{model}: expected an NCHW image batch (B, {in_chans}, H, W), "
            f"got shape {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise TypeError(f"{model}: expected a floating-point image tensor, got {x.dtype}")
    if 0 in x.shape[2:]:
        raise ValueError(f"{model}: empty images, shape {tuple(x.shape)}")
    # the first parameter (a loop: torch 2.8's Dynamo cannot trace next(generator, None))
    p = None
    for q in like.parameters() if like is not None else ():
        p = q
        break
    if p is not None and x.dtype != p.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"{model}: images are {x.dtype} but the model's parameters {p.dtype}; cast one "
            f"(x.to({p.dtype}) or model.to({x.dtype}))"
        )


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
