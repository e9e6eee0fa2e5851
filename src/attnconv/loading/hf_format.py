"""Hugging Face ``transformers`` ViT / DeiT folders (``save_pretrained``) <-> ours.

The folder holds ``config.json`` and ``model.safetensors`` (or ``pytorch_model.bin``, read with
``torch.load(weights_only=True)``). Names (``transformers/models/{vit,deit}/modeling_*.py``,
prefix ``vit.`` / ``deit.`` in the classification models, none in ``ViTModel``)::

    embeddings.cls_token   embeddings.distillation_token   embeddings.position_embeddings
    embeddings.patch_embeddings.projection
    encoder.layer.{i}.layernorm_before / .attention.attention.{query,key,value}
        / .attention.output.dense / .layernorm_after / .intermediate.dense / .output.dense
    layernorm   classifier | cls_classifier + distillation_classifier   (pooler: unused)

The config fixes LayerNorm eps (``layer_norm_eps``, 1e-12 for ViT), the heads, the image size;
Hugging Face resamples position embeddings bicubically without antialiasing
(``interpolate_pos_encoding``). ``DeiTForImageClassificationWithTeacher`` averages its two
heads; ``DeiTForImageClassification`` classifies the class token only (``dist_head=False``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from .source import Source, WeightsError, add_zero_qkv_biases

__all__ = ["matches", "read"]

_EMB = {
    "embeddings.cls_token": "cls_token",
    "embeddings.distillation_token": "dist_token",
    "embeddings.position_embeddings": "pos_embed",
    "embeddings.patch_embeddings.projection.weight": "patch_embed.weight",
    "embeddings.patch_embeddings.projection.bias": "patch_embed.bias",
    "layernorm.weight": "norm.weight",
    "layernorm.bias": "norm.bias",
}
_LAYER = {  # inside encoder.layer.{i}.
    "layernorm_before": "norm1",
    "attention.attention.query": "attn.q_proj",
    "attention.attention.key": "attn.k_proj",
    "attention.attention.value": "attn.v_proj",
    "attention.output.dense": "attn.out_proj",
    "layernorm_after": "norm2",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
}
_HEADS = {"classifier": "head", "cls_classifier": "head", "distillation_classifier": "head_dist"}
_DROPPED = {
    "pooler.": "the pooler (tanh layer, unused by the classifier)",
    "embeddings.mask_token": "the mask token",
}


def matches(state: dict) -> bool:
    return any(k.endswith("embeddings.patch_embeddings.projection.weight") for k in state)


def _config(folder: Path) -> dict:
    f = folder / "config.json"
    try:
        cfg = json.loads(f.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsError(f"{f}: not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise WeightsError(f"{f}: not a Hugging Face config (a JSON object)")
    kind = cfg.get("model_type")
    if kind not in ("vit", "deit"):
        raise WeightsError(
            f"{f}: wrong architecture: a Hugging Face {kind!r} model, not a ViT/DeiT "
            f"({', '.join(cfg.get('architectures') or [])})"
        )
    act = cfg.get("hidden_act", "gelu")
    if act != "gelu":
        raise WeightsError(f"{f}: hidden_act {act!r} unsupported (ours is the exact GELU, 'gelu')")
    return cfg


def read(folder: Path, file: Path, raw: dict[str, torch.Tensor]) -> Source:
    """Our names + the settings a Hugging Face ViT / DeiT folder fixes (``raw``: the tensors
    of its weights ``file``)."""
    cfg = _config(folder)
    if not matches(raw):
        raise WeightsError(
            f"{file}: wrong architecture: no ViT patch embedding among its keys "
            f"({', '.join(sorted(raw)[:3])} ...)"
        )
    out: dict[str, torch.Tensor] = {}
    unknown, notes = [], []
    for k, v in raw.items():
        base = re.sub(r"^(vit|deit)\.", "", k)
        m = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)", base)
        head = re.fullmatch(r"(\w+)\.(weight|bias)", base)
        dropped = next((what for pre, what in _DROPPED.items() if base.startswith(pre)), None)
        if base in _EMB:
            out[_EMB[base]] = v
        elif m and m.group(2) in _LAYER:
            out[f"blocks.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"] = v
        elif head and head.group(1) in _HEADS:
            out[f"{_HEADS[head.group(1)]}.{head.group(2)}"] = v
        elif dropped:
            if f"{dropped} dropped" not in notes:
                notes.append(f"{dropped} dropped")
        else:
            unknown.append(k)
    if unknown:
        raise WeightsError(f"{file}: unexpected Hugging Face keys {', '.join(unknown[:3])}")
    if not cfg.get("qkv_bias", True):
        add_zero_qkv_biases(out)
    size = cfg.get("image_size", 224)
    size = size if isinstance(size, int) else int(size[0])
    hidden = int(cfg.get("hidden_size", 768))
    settings = dict(
        class_token=True,
        global_pool="token",
        dist_head="head_dist.weight" in out or "dist_token" not in out,
        norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
        pos_embed_antialias=False,
        img_size=size,
        in_chans=int(cfg.get("num_channels", 3)),
        mlp_ratio=int(cfg.get("intermediate_size", 4 * hidden)) / hidden,
    )
    heads = cfg.get("num_attention_heads")
    return Source("hf", folder, out, settings, int(heads) if heads else None, notes)
