"""Old checkpoints keep loading: the parameters the layers renamed, as data.

Each row of ``UPGRADES`` names a parameter of an older parametrization, its name now and how its
value converts. A module that once had the old name declares its rows in its constructor
(``upgrade_on_load(self, ALPHA_TO_SPREAD)``), so a plain ``model.load_state_dict(old_state)``
upgrades; loaders that check names before ``load_state_dict`` (loading/checkpoint.py) call
``upgrade_state_dict``. One generic hook, one table: a new rename is one row. The rows stay in
``layers`` because the layers' own ``load_state_dict`` applies them (and layers never import
``loading``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn as nn


class Rename(NamedTuple):
    old: str  # the parameter's name in older checkpoints
    new: str  # its name now
    convert: Callable[[str, torch.Tensor], torch.Tensor]  # (old key, old value) -> new value


def _sqrt_two_alpha(key: str, alpha: torch.Tensor) -> torch.Tensor:
    """The quadratic encoding before alpha was parametrized by s, alpha = s^2 / 2: s = sqrt(2 alpha)
    (none for a negative alpha)."""
    if bool((alpha < 0).any()):
        raise ValueError(
            f"{key}: a negative alpha {alpha.min().item():g} (from a checkpoint of the old "
            "direct parametrization) has no spread s with alpha = s^2 / 2"
        )
    return torch.sqrt(2 * alpha)


def _transpose(key: str, factor: torch.Tensor) -> torch.Tensor:
    """Generalized encoding's former factor L (Sigma^-1 = L^T L): spread A = L^T (A A^T)."""
    return factor.transpose(-1, -2).contiguous()


ALPHA_TO_SPREAD = Rename("alpha", "spread", _sqrt_two_alpha)  # QuadraticEncoding
FACTOR_TO_SPREAD = Rename("precision_factor", "spread", _transpose)  # GeneralizedQuadratic...
# the submodule name the rows stand under in a model's state dict -> the rows
UPGRADES = {"positional_encoding": (ALPHA_TO_SPREAD, FACTOR_TO_SPREAD)}


def _apply(rows: tuple[Rename, ...], module, state_dict: dict, prefix: str, *args) -> None:
    """The load_state_dict pre-hook: each old name under ``prefix`` (and no new one) converted."""
    for row in rows:
        old, new = prefix + row.old, prefix + row.new
        if old in state_dict and new not in state_dict:
            state_dict[new] = row.convert(old, state_dict.pop(old))


def upgrade_on_load(module: nn.Module, *rows: Rename) -> None:
    """``module.load_state_dict`` upgrades ``rows`` from then on (a picklable hook)."""
    module.register_load_state_dict_pre_hook(functools.partial(_apply, rows))


def upgrade_state_dict(state_dict: dict) -> dict:
    """A copy of ``state_dict`` with every old name of ``UPGRADES`` replaced by its new one (for
    loaders that check names before ``load_state_dict``)."""
    out = dict(state_dict)
    for where, rows in UPGRADES.items():
        for row in rows:
            suffix = f"{where}.{row.old}"
            for key in [k for k in state_dict if k.endswith(suffix)]:
                _apply((row,), None, out, key[: -len(row.old)])
    return out
