"""Checkpoint upgrades of the quadratic encodings' parameters (gaussian.py registers the hooks;
checkpoint loaders that check names before ``load_state_dict`` call ``upgrade_state_dict``)."""

from __future__ import annotations

import torch


def _alpha_to_spread(module, state_dict, prefix, *args) -> None:
    """Load checkpoints written before alpha was parametrized by s: spread = sqrt(2 alpha)."""
    old, new = prefix + "alpha", prefix + "spread"
    if old in state_dict and new not in state_dict:
        alpha = state_dict.pop(old)
        if bool((alpha < 0).any()):
            raise ValueError(
                f"{old}: a negative alpha {alpha.min().item():g} (from a checkpoint of the old "
                "direct parametrization) has no spread s with alpha = s^2 / 2"
            )
        state_dict[new] = torch.sqrt(2 * alpha)


def _factor_to_spread(module, state_dict, prefix, *args) -> None:
    """Generalized encoding checkpoints of the former L (Sigma^-1 = L^T L): spread A = L^T."""
    old, new = prefix + "precision_factor", prefix + "spread"
    if old in state_dict and new not in state_dict:
        state_dict[new] = state_dict.pop(old).transpose(-1, -2).contiguous()



def upgrade_state_dict(state_dict: dict) -> dict:
    """A copy of ``state_dict`` with every quadratic encoding's old ``alpha`` / ``precision_factor``
    entry replaced by its ``spread`` (for loaders that check names before ``load_state_dict``)."""
    out = dict(state_dict)
    for key in [k for k in state_dict if k.endswith("positional_encoding.alpha")]:
        _alpha_to_spread(None, out, key[: -len("alpha")])
    for key in [k for k in state_dict if k.endswith("positional_encoding.precision_factor")]:
        _factor_to_spread(None, out, key[: -len("precision_factor")])
    return out
