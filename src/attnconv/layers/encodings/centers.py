"""The Gaussian head centres Delta of a model's quadratic layers (Cordonnier et al. 2020, eq. 9),
found once for training logs and analysis alike."""

from __future__ import annotations

import torch
import torch.nn as nn


def center_layers(model: nn.Module) -> list[nn.Module]:
    """Innermost submodules with ``attention_centers()``, in registration (input -> output)
    order: wrappers (a converted convolution) delegate to the attention layer inside them."""
    mods = [
        m
        for m in model.modules()
        if m is not model and callable(getattr(m, "attention_centers", None))
    ] or ([model] if callable(getattr(model, "attention_centers", None)) else [])
    return [
        m for m in mods if not any(o is not m and any(o is s for s in m.modules()) for o in mods)
    ]


def _centered(model: nn.Module) -> list[tuple[nn.Module, torch.Tensor]]:
    """(layer, its (Nh, 2) centres as float32 on CPU) for every layer of ``center_layers`` whose
    encoding has centres (``attention_centers()`` raising ValueError: skipped)."""
    out = []
    for m in center_layers(model):
        try:
            c = torch.as_tensor(m.attention_centers()).detach().float().cpu()
        except (ValueError, NotImplementedError):
            continue
        if c.dim() != 2 or c.shape[1] != 2:
            raise ValueError(
                f"{type(m).__name__}.attention_centers() must return (Nh, 2), got {tuple(c.shape)}"
            )
        out.append((m, c))
    return out


def head_centers(model: nn.Module) -> list[torch.Tensor]:
    """Per quadratic layer, its (Nh, 2) (row, col) head centres (float32, CPU); layers whose
    encoding has no centres (``attention_centers()`` raises ValueError) are skipped."""
    return [c for _, c in _centered(model)]


def head_alphas(model: nn.Module) -> list[torch.Tensor | None]:
    """Per layer of ``head_centers``, its (Nh,) isotropic precisions alpha (eq. 9: logits
    -alpha ||delta - Delta||^2), or None for an encoding without one (generalized quadratic)."""
    alphas = [
        getattr(getattr(m, "positional_encoding", None), "alpha", None) for m, _ in _centered(model)
    ]
    return [None if a is None else a.detach().float().cpu() for a in alphas]
