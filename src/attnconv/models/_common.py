"""Helpers shared by the model files: config overrides with clear errors, image-size checks."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch

C = TypeVar("C")


def build_config(cfg_cls: type[C], model: str, defaults: dict[str, Any], overrides: dict) -> C:
    """``cfg_cls(**defaults | overrides)``; unknown overrides: ValueError listing known ones."""
    names = [f.name for f in dataclasses.fields(cfg_cls)]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ValueError(
            f"{model}: unknown option(s) {', '.join(unknown)}; known: {', '.join(names)}"
        )
    return cfg_cls(**{**defaults, **overrides})


def check_images(
    x: torch.Tensor, in_chans: int, model: str, like: torch.nn.Module | None = None
) -> None:
    """x must be a non-empty float NCHW batch with ``in_chans`` channels, of the dtype of the
    parameters of ``like`` (if given; any floating dtype under autocast)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{model}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4 or x.shape[1] != in_chans:
        raise ValueError(
            f"{model}: expected an NCHW image batch (B, {in_chans}, H, W), "
            f"got shape {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise TypeError(f"{model}: expected a floating-point image tensor, got {x.dtype}")
    if x.numel() == 0:
        raise ValueError(f"{model}: empty image batch, shape {tuple(x.shape)}")
    p = next(like.parameters(), None) if like is not None else None
    if p is not None and x.dtype != p.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"{model}: images are {x.dtype} but the model's parameters {p.dtype}; cast one "
            f"(x.to({p.dtype}) or model.to({x.dtype}))"
        )


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
