"""Bring your own weights: ``attnconv.create_model(name, checkpoint=PATH, **overrides)``.

PATH is one of, told apart by what the files hold (never by their extension):

- an attnconv run folder / checkpoint folder (``attnconv.loading.checkpoint``);
- a timm-format ViT / DeiT state dict, one file (safetensors, or a torch zip read with
  ``torch.load(weights_only=True)``; a file that needs full unpickling is refused): ``timm_format``;
- a Hugging Face ``transformers`` ViT / DeiT folder (``config.json`` + ``model.safetensors`` or
  ``pytorch_model.bin``): ``hf_format``; a timm hub folder (the same files, timm's keys) is
  read as timm.

Each format module maps its tensors to our ``VisionTransformer`` names and reads the settings the
checkpoint fixes (class / distillation token, pooling, LayerNorm eps, image size, resampling
kernel). The registry name fixes the geometry (width, depth, heads, patch size); a checkpoint
that does not fit it is refused with one line naming the first few offending keys.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn as nn

from attnconv.models import create_model
from attnconv.models.vit import VisionTransformer
from attnconv.warn import warn

from . import hf_format, timm_format
from .checkpoint import load_model
from .source import Source, WeightsError, read_tensors
from .weights_check import check_finite

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # in a Hugging Face / timm hub folder


def read_source(path: str | Path) -> Source | None:
    """The timm or Hugging Face checkpoint at ``path``; None for an attnconv checkpoint."""
    p = Path(path)
    if not p.exists():
        raise WeightsError(f"{p}: no such file or folder")
    if p.is_dir():
        if not (p / "config.json").is_file() or (p / "checkpoint.json").is_file():
            return None  # an attnconv run / checkpoint folder (its loader checks the rest)
        files = [p / n for n in WEIGHT_FILES if (p / n).is_file()]
        if not files:
            sharded = any(p.glob("*.index.json"))
            why = "sharded weights (*.index.json) are not supported" if sharded else "no weights"
            raise WeightsError(f"{p}: {why}; expected {' or '.join(WEIGHT_FILES)}")
        state = read_tensors(files[0])
        if timm_format.matches(state):  # a timm hub folder: its config.json is timm's
            return timm_format.read(state, files[0])
        return hf_format.read(p, files[0], state)
    if p.name in ("checkpoint.json", *WEIGHT_FILES) and (
        (p.parent / "checkpoint.json").is_file() or (p.parent / "config.json").is_file()
    ):
        return read_source(p.parent)
    state = read_tensors(p)
    if timm_format.matches(state):
        return timm_format.read(state, p)
    if hf_format.matches(state):
        raise WeightsError(
            f"{p}: Hugging Face ViT weights without their config.json; give the folder "
            "holding both (save_pretrained writes it)"
        )
    raise WeightsError(
        f"{p}: wrong architecture: not a ViT/DeiT state dict (keys {_first(sorted(state))})"
    )


def _first(names, n: int = 3) -> str:
    names = list(names)
    return ", ".join(names[:n]) + (" ..." if len(names) > n else "")


def _check_fit(model: nn.Module, src: Source, name: str) -> None:
    """Missing / unexpected / mis-shaped keys: one WeightsError listing the first few."""
    own = model.state_dict()
    if "pos_embed" not in own:  # fixed sinusoidal positions: nothing to load there
        raise WeightsError(f"{src.path}: {name} has fixed position embeddings (pos_embed=...)")
    missing = [k for k in own if k not in src.state]
    unexpected = [k for k in src.state if k not in own]
    wrong = [
        f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}"
        for k, v in src.state.items()
        if k in own and k != "pos_embed" and v.shape != own[k].shape
    ]
    pe = src.state.get("pos_embed")
    if pe is not None and (pe.dim() != 3 or pe.shape[-1] != own["pos_embed"].shape[-1]):
        wrong.insert(0, f"pos_embed {tuple(pe.shape)} vs {tuple(own['pos_embed'].shape)}")
    parts = []
    if missing:
        parts.append(f"missing {_first(missing)}")
    if unexpected:
        parts.append(f"unexpected {_first(unexpected)}")
    if wrong:
        parts.append(f"mis-shaped {_first(wrong, 2)}")
    if parts:
        raise WeightsError(
            f"{src.path}: {src.format} weights don't fit {name} ({'; '.join(parts)})"
        )


def load_pretrained(name: str, checkpoint: str | Path, **overrides) -> nn.Module:
    """``create_model(name, **overrides)`` with the weights of ``checkpoint`` (eval mode).

    Settings the checkpoint fixes (class / distillation token, pooling, LayerNorm eps, its
    image size, the resampling kernel of its library, its number of classes) are the
    defaults; ``overrides`` win (one given as None is the checkpoint's). ``img_size`` other
    than the checkpoint's resamples the position embeddings as the source library does;
    another ``num_classes`` drops the checkpoint's head (a warning says so); another patch
    size is refused.

    Args:
        name: a registered model name (a ViT for timm / Hugging Face weights).
        checkpoint: a timm state dict, a Hugging Face ViT/DeiT folder, or an attnconv
            checkpoint.
        **overrides (Any): ``create_model`` arguments that win over the checkpoint's settings.

    Returns:
        The model with the checkpoint's weights, in eval mode.

    Raises:
        WeightsError: another architecture, patch size or number of heads than ``name``.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}  # None: the checkpoint's
    src = read_source(checkpoint)
    if src is None:
        return load_model(checkpoint, model_name=name, **overrides)[0]
    with torch.device("meta"):  # what `name` builds, before giving it the ViT settings
        probe = create_model(name, **overrides)
    if not isinstance(probe, VisionTransformer):
        raise WeightsError(
            f"{src.path}: wrong architecture: {src.format} ViT/DeiT weights, but {name} is "
            f"a {type(probe).__name__}"
        )
    cfg = probe.cfg  # the geometry: the name's with the overrides
    p_src = int(src.state["patch_embed.weight"].shape[-1])
    if p_src != cfg.patch_size:
        raise WeightsError(
            f"{src.path}: patch size change refused: the checkpoint has {p_src}x{p_src} "
            f"patches, {name} {cfg.patch_size}x{cfg.patch_size} (pass patch_size={p_src})"
        )
    if src.num_heads is not None and src.num_heads != cfg.num_heads:
        raise WeightsError(
            f"{src.path}: the checkpoint has {src.num_heads} heads, {name} {cfg.num_heads} "
            f"(pass num_heads={src.num_heads})"
        )
    has_dist = "dist_token" in src.state
    if has_dist != cfg.dist_token:
        hint = "a distilled DeiT name (deit_*_distilled_*)" if has_dist else "a non-distilled name"
        raise WeightsError(
            f"{src.path}: wrong architecture: the checkpoint {'has' if has_dist else 'has no'} "
            f"distillation token, {name} {'has' if cfg.dist_token else 'has none'}; use {hint}"
        )
    kwargs = {**src.settings, **overrides}
    if "num_classes" not in overrides:
        kwargs["num_classes"] = src.num_classes or 1000
    model = create_model(name, **kwargs)
    cfg = model.cfg
    notes, heads = list(src.notes), ("head.", "head_dist.")
    n_src, n = src.num_classes, cfg.num_classes
    if n_src is not None and n_src != n:
        src.state = {k: v for k, v in src.state.items() if not k.startswith(heads)}
        notes.append(f"its {n_src}-class head dropped for a new {n}-class one")
    elif n_src is None:
        notes.append(f"it has no classifier; the {n}-class head is freshly initialised")
    own = model.state_dict()
    fresh = {k: own[k] for k in own if k.startswith(heads) and k not in src.state}
    src.state = {**src.state, **fresh}
    _check_fit(model, src, name)
    check_finite(src.state, str(src.path))  # as every loader: no NaN weights run
    model.load_state_dict(src.state, strict=True)
    if notes:
        warn(f"{src.path}: {'; '.join(notes)}")
    return model.eval()


def model_kwargs(model: VisionTransformer) -> dict:
    """Every config field of a loaded model: the ``create_model`` arguments that rebuild it
    without the source checkpoint (what an attnconv checkpoint of it stores).

    Args:
        model: a ``VisionTransformer`` (e.g. one ``load_pretrained`` returned).

    Returns:
        Its config as a dict of ``create_model`` keyword arguments.
    """
    return dataclasses.asdict(model.cfg)
