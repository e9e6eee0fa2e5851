"""``convert_model``: every convolution of a network -> its self-attention equivalent
(Cordonnier et al. 2020, Theorem 1), each checked against the module's own forward (rules.py);
what cannot be reproduced is refused with its path, or kept and listed."""

from __future__ import annotations

import copy
import warnings

import torch
import torch.nn as nn

from attnconv.layers.checks import refuses_retired
from attnconv.progress import Progress

from .modules import ConvAttention, conv_to_attention
from .rules import UnsupportedConv

ON_UNSUPPORTED = ("error", "keep")


@refuses_retired
def convert_model(
    model: nn.Module,
    *,
    alpha: float | None = None,
    head_dim: int | None = None,
    backend: str | None = None,
    inplace: bool = False,
    on_unsupported: str = "error",
    progress: bool = False,
) -> nn.Module:
    """Replace every convolution (nn.Conv1d / nn.Conv2d and their subclasses) of ``model`` by
    its attention equivalent, each checked against the module's own forward (rules.py).
    Transposed and 3-D convolutions, uninitialized lazy ones and any the check refuses are
    unsupported: handled by ``on_unsupported``.

    Args:
        model: the network; a convolution already converted is left as it is.
        alpha: as ``conv_to_attention``'s (None: hard, exact).
        head_dim: as ``conv_to_attention``'s (None: exact).
        backend: as ``conv_to_attention``'s.
        inplace: convert ``model`` itself instead of a deep copy.
        on_unsupported: ``"error"`` (a convolution the conversion cannot reproduce raises one
            ValueError naming its path and class) or ``"keep"`` (it stays as it is;
            ``unconverted_layers(model)`` lists those, with the reason).
        progress: show a bar over the layers (attnconv.progress).

    Returns:
        The converted model: an all-attention network whose outputs equal the original's
        (exactly for ``alpha=None, head_dim=None``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert_model expects an nn.Module, got {type(model).__name__}")
    if on_unsupported not in ON_UNSUPPORTED:
        raise ValueError(f"on_unsupported must be one of {ON_UNSUPPORTED}, got {on_unsupported!r}")
    if not inplace:
        model = _deepcopy(model)
    kept: list[tuple[str, str, str]] = []

    def convert(path: str, conv: nn.Module) -> nn.Module:
        try:
            if not isinstance(conv, (nn.Conv1d, nn.Conv2d)):  # ConvTranspose*d, Conv3d
                raise UnsupportedConv(
                    "only nn.Conv1d / nn.Conv2d convert: transposed and 3-D convolutions are "
                    "not supported"
                )
            return conv_to_attention(conv, alpha=alpha, head_dim=head_dim, backend=backend)
        except UnsupportedConv as e:
            where = f"{path or '(root)'} ({type(conv).__name__})"
            if on_unsupported == "error":
                raise UnsupportedConv(
                    f"cannot convert {where}: {e}; pass on_unsupported='keep' to leave it"
                ) from None
            kept.append((path, type(conv).__name__, str(e)))
            return conv

    if _convertible(model):  # the root itself cannot be swapped in place
        out = convert("", model)
        out.attnconv_unconverted = kept
        return out
    converted: dict[int, nn.Module] = {}  # id(conv) -> module (a shared conv stays shared)
    names = {id(m): n for n, m in model.named_modules()}
    n_convs = len({id(m) for m in model.modules() if _convertible(m)})
    bar = Progress(n_convs, "convert", unit="layer", leave=False, enabled=progress)
    with warnings.catch_warnings(), bar:
        warnings.simplefilter("ignore")  # one summary warning below instead of one per layer
        for parent in list(model.modules()):
            for child_name, child in list(parent._modules.items()):  # shared convs repeat here
                if _convertible(child):
                    if id(child) not in converted:
                        path = ".".join(p for p in (names.get(id(parent), ""), child_name) if p)
                        converted[id(child)] = convert(path, child)
                        bar.update(1)
                    setattr(parent, child_name, converted[id(child)])
    model.attnconv_unconverted = kept
    worst = max(
        (m.rank_error for m in converted.values() if isinstance(m, ConvAttention)), default=0.0
    )
    if worst > 0:
        warnings.warn(
            f"convert_model: head_dim={head_dim} is below some kernels' rank; worst relative "
            f"kernel error {worst:.3g} (see each module's .rank_error)",
            stacklevel=2,
        )
    if kept:
        warnings.warn(
            f"convert_model: {len(kept)} convolution(s) kept as they are: "
            + "; ".join(f"{p} ({c}): {r}" for p, c, r in kept[:3]),
            stacklevel=2,
        )
    return model


def unconverted_layers(model: nn.Module) -> list[tuple[str, str, str]]:
    """(path, class, reason) of every convolution ``convert_model(..., on_unsupported="keep")``
    left as it was.

    Args:
        model: a model returned by ``convert_model``.

    Returns:
        One ``(path, class name, reason)`` per convolution left unconverted; empty when every
        one was converted (or the model never went through ``convert_model``).
    """
    return list(getattr(model, "attnconv_unconverted", []))


def converted_layers(model: nn.Module) -> list[tuple[str, ConvAttention]]:
    """(name, module) of every ConvAttention2d/1d in a converted model, in module order.

    Args:
        model: any module; usually one returned by ``convert_model``.

    Returns:
        One ``(name, module)`` per ``ConvAttention2d`` / ``ConvAttention1d``, as
        ``named_modules`` lists them.
    """
    return [(n, m) for n, m in model.named_modules() if isinstance(m, ConvAttention)]


def _deepcopy(model: nn.Module) -> nn.Module:
    """copy.deepcopy, past the tensors it refuses: a weight that ``torch.nn.utils.prune`` or the
    old ``weight_norm`` computes in a forward pre-hook (not a graph leaf) is copied detached, as
    the hook recomputes it at every forward."""
    memo = {
        id(v): v.detach().clone()
        for m in model.modules()
        for v in vars(m).values()
        if isinstance(v, torch.Tensor) and not v.is_leaf
    }
    return copy.deepcopy(model, memo)


def _convertible(m: nn.Module) -> bool:
    """A convolution not converted yet (a converted one is an nn.Conv1d/Conv2d too): every
    ``_ConvNd``, so that transposed and 3-D ones are refused or kept, never passed silently."""
    return isinstance(m, nn.modules.conv._ConvNd) and not isinstance(m, ConvAttention)
