"""Model registry: ``create_model(name, num_classes=..., **overrides)`` and ``list_models()``."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable

import torch.nn as nn

from ..layers.checks import refuse_retired

_MODELS: dict[str, Callable[..., nn.Module]] = {}


def register_model(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Decorator: register a model factory under its function name.

    Args:
        fn: a function that builds the model from keyword arguments; its ``__name__`` becomes
            the model's name.

    Returns:
        ``fn`` itself.

    Raises:
        ValueError: a model of that name is already registered.
    """
    if fn.__name__ in _MODELS:
        raise ValueError(f"model {fn.__name__!r} registered twice")
    _MODELS[fn.__name__] = fn
    return fn


def list_models(pattern: str | None = None) -> list[str]:
    """The names ``create_model`` takes.

    Args:
        pattern: a shell-style filter, e.g. ``"sasa_*"`` or ``"*vit*"`` (None: all).

    Returns:
        Every registered model name (matching ``pattern``), sorted.
    """
    return sorted(n for n in _MODELS if pattern is None or fnmatch.fnmatchcase(n, pattern))


def check_model_args(name: str, kwargs: dict) -> None:
    """ValueError for an unknown model name (with close matches) or a size that is not a
    positive int: a clear error here, not a crash in a constructor."""
    if name not in _MODELS:
        if "." in name:  # MODEL.TAG: a pretrained name (attnconv.catalog)
            raise ValueError(
                f"unknown model {name!r}: a pretrained name MODEL.TAG takes pretrained=True "
                "(attnconv.list_pretrained() names them)"
            )
        close = difflib.get_close_matches(name, list(_MODELS), n=3, cutoff=0.5)
        some = close or list_models()[:3]
        hint = f"did you mean {', '.join(some)}?" if close else f"e.g. {', '.join(some)};"
        raise ValueError(
            f"unknown model {name!r} ({hint} {len(_MODELS)} models in all: attnconv.list_models())"
        )
    for key, val in kwargs.items():
        if key in _SIZES and val is not None:
            if not isinstance(val, int) or isinstance(val, bool) or not 1 <= val < 2**31:
                raise ValueError(f"{name}: {key} must be a positive int (< 2**31), got {val!r}")


def create_model(name: str, **kwargs) -> nn.Module:
    """The model ``name`` built with ``kwargs``, freshly initialised.

    Args:
        name: a registered model (``list_models()``).
        **kwargs (Any): the model's options (e.g. ``num_classes``, sizes); an unknown name or
            option is one ValueError naming the closest ones; a size given as None is the
            model's default. Weights (``checkpoint=``) are
            loaded by ``attnconv.create_model`` (``attnconv.loading``).

    Returns:
        The model, an ``nn.Module``.
    """
    if "checkpoint" in kwargs:
        raise TypeError(
            "attnconv.models.create_model builds untrained models; load weights with "
            "attnconv.create_model(name, checkpoint=PATH)"
        )
    refuse_retired(kwargs, f"create_model({name!r})")
    check_model_args(name, kwargs)
    # a size of None is the model's default (tgt_vocab_size=None has its own meaning)
    kwargs = {k: v for k, v in kwargs.items() if v is not None or k not in _DEFAULT_IF_NONE}
    return _MODELS[name](**kwargs)


_SIZES = {
    "num_classes",
    "in_chans",
    "img_size",
    "width",
    "depth",
    "num_layers",
    "num_heads",
    "patch_size",
    "embed_dim",
    "hidden_size",
    "kernel_size",
    "downsample",
    "max_size",
    "stem_heads",
    "stem_kernel_size",
    "stem_mixtures",
    "d_model",
    "d_ff",
    "ff_size",
    "max_len",
    "num_encoder_layers",
    "num_decoder_layers",
    "src_vocab_size",
    "tgt_vocab_size",
}
_DEFAULT_IF_NONE = _SIZES - {"tgt_vocab_size"}
