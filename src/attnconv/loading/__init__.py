"""Loading weights into the models: attnconv checkpoints (``checkpoint``), timm / Hugging
Face ViT / DeiT weights (``pretrained``) and the reference code's checkpoints (``reference``).
``attnconv.models`` builds modules; this package fills them. ``attnconv.create_model`` is
:func:`create_model` here.

    model = attnconv.create_model("deit_tiny_patch16_224", checkpoint="deit_tiny/")
    model, info = load_model("runs/sa_quadratic")  # an attnconv run or checkpoint folder
"""

from __future__ import annotations

from pathlib import Path

import torch.nn as nn

from attnconv.catalog import PretrainedError, list_pretrained, pretrained_info
from attnconv.models import check_model_args
from attnconv.models import create_model as build_model

from .checkpoint import CheckpointError, load_model
from .pretrained import load_pretrained, model_kwargs
from .reference import load_reference_checkpoint
from .source import WeightsError

__all__ = [
    "CheckpointError",
    "PretrainedError",
    "list_pretrained",
    "pretrained_info",
    "WeightsError",
    "create_model",
    "load_model",
    "load_pretrained",
    "load_reference_checkpoint",
    "model_kwargs",
]


def create_model(
    name: str,
    *,
    pretrained: bool = False,
    checkpoint: str | Path | None = None,
    **kwargs,
) -> nn.Module:
    """The model ``name`` built with ``kwargs``; with ``pretrained=True`` the shipped weights
    of a pretrained name (``list_pretrained()``), with ``checkpoint`` (an attnconv checkpoint, a
    timm state dict or a Hugging Face ViT/DeiT folder) its weights; loaded ones in eval mode.

        model = attnconv.create_model("sa_quadratic.cifar10_grid_long", pretrained=True)

    Args:
        name: a registered model name (``list_models()``); with ``pretrained=True`` a shipped
            name ``MODEL.TAG`` (``list_pretrained()``), or MODEL for its default tag.
        pretrained: load the shipped weights of ``name`` (checked against its card's sha256).
        checkpoint: weights to load: an attnconv checkpoint, a timm state dict or a Hugging Face
            ViT/DeiT folder; None builds the model with fresh weights.
        **kwargs (Any): the model's constructor arguments (size, classes, ...); with weights
            they override the settings the weights fix (``backend=`` say, never a shape).

    Returns:
        The model (in eval mode when loaded with weights).
    """
    if pretrained:
        if checkpoint is not None:
            raise ValueError(f"{name}: pretrained=True or checkpoint=PATH, not both")
        from attnconv.catalog import pretrained_folder

        return load_model(pretrained_folder(name), **kwargs)[0]
    if checkpoint is None:
        return build_model(name, **kwargs)
    check_model_args(name, kwargs)  # a bad name or size is said before any file is read
    return load_pretrained(name, checkpoint, **kwargs)
