"""The checks every command that loads weights makes (``attnconv eval``, ``analyze``,
``explore``, ``convert`` and ``attnconv.load_model``): non-finite weights refused in one line
(their accuracy would be a constant prediction's, their figures NaN), and weights stored in
another floating dtype than float32 (float64, float16, bfloat16) run cast to float32, said in one
line (the commands feed float32 images)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn as nn

from .source import WeightsError


def nonfinite(weights: Mapping[str, torch.Tensor]) -> list[str]:
    """The names of the floating tensors of ``weights`` holding a NaN or an infinity."""
    return [
        n for n, t in weights.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]


def check_finite(
    weights: Mapping[str, torch.Tensor], where: str, error: type[ValueError] = WeightsError
) -> None:
    """``error`` (one line, naming up to three tensors) if a weight is not finite."""
    bad = nonfinite(weights)
    if bad:
        raise error(
            f"{where}: the checkpoint holds non-finite weights ({', '.join(bad[:3])}"
            f"{', ...' if len(bad) > 3 else ''}): refused (nothing to evaluate, analyze or "
            "convert); use an earlier checkpoint"
        )


def as_float32(model: nn.Module, where: str) -> tuple[nn.Module, str]:
    """(``model`` with every floating weight in float32, the line that says it was cast, or "" if
    it already was). A checkpoint saved after ``.double()`` or ``.half()`` then runs on the
    float32 images every command feeds."""
    dtypes = {t.dtype for t in model.state_dict().values() if t.is_floating_point()}
    other = sorted(str(d).removeprefix("torch.") for d in dtypes - {torch.float32})
    if not other:
        return model, ""
    return model.float(), f"{where}: weights stored as {', '.join(other)}, run cast to float32"
