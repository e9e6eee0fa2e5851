"""timm's ``VisionTransformer`` / ``VisionTransformerDistilled`` state dict <-> ours.

timm (pytorch-image-models, ``timm/models/vision_transformer.py``, ``deit.py``) names::

    cls_token (1, 1, D)   dist_token (1, 1, D)   pos_embed (1, prefix + N, D)
    patch_embed.proj.{weight,bias}
    blocks.{i}.norm1 / .attn.qkv (3D, D) rows [q; k; v] / .attn.proj / .norm2 / .mlp.fc1 / .mlp.fc2
    norm (global_pool="token")  or  fc_norm (global_pool="avg", norm is Identity)
    head   head_dist (distilled)

timm's defaults this format implies: LayerNorm eps 1e-6, exact GELU, position embeddings
resampled with ``resample_abs_pos_embed`` (bicubic, ``antialias=True``). Layer scale, register
tokens, q/k norms, ``no_embed_class`` and attention pooling have no counterpart here and are
refused by name.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from .source import Source, WeightsError, add_zero_qkv_biases

__all__ = ["matches", "read", "to_timm"]

_TOP = {
    "patch_embed.proj.weight": "patch_embed.weight",
    "patch_embed.proj.bias": "patch_embed.bias",
}
_BLOCK = {  # timm -> ours inside blocks.{i}. (qkv is split separately)
    "norm1": "norm1",
    "attn.proj": "attn.out_proj",
    "norm2": "norm2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
_UNSUPPORTED = {  # key pattern -> what it is
    r"\.ls\d\.": "layer scale (init_values)",
    r"^reg_token$": "register tokens",
    r"\.(q|k)_norm\.": "q/k norms",
    r"^attn_pool\.": "attention pooling (global_pool='map')",
    r"^norm_pre\.": "a pre-norm (CLIP-style)",
}


def matches(state: dict) -> bool:
    return "patch_embed.proj.weight" in state and any(k.endswith(".attn.qkv.weight") for k in state)


def read(state: dict[str, torch.Tensor], path: Path) -> Source:
    """Our names + the settings a timm ViT / DeiT state dict fixes."""
    for pat, what in _UNSUPPORTED.items():
        hit = [k for k in state if re.search(pat, k)]
        if hit:
            raise WeightsError(f"{path}: wrong architecture: timm ViT with {what} ({hit[0]})")
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for k, v in state.items():
        m = re.fullmatch(r"blocks\.(\d+)\.(.+)\.(weight|bias)", k)
        if k in _TOP:
            out[_TOP[k]] = v
        elif k in ("cls_token", "dist_token", "pos_embed"):
            out[k] = v
        elif re.fullmatch(r"(norm|fc_norm|head|head_dist)\.(weight|bias)", k):
            out[k] = v
        elif m and m.group(2) == "attn.qkv":
            if v.shape[0] % 3:
                raise WeightsError(f"{path}: {k} has {v.shape[0]} rows, not 3 x width")
            for proj, part in zip(("q_proj", "k_proj", "v_proj"), v.chunk(3, dim=0)):
                out[f"blocks.{m.group(1)}.attn.{proj}.{m.group(3)}"] = part.contiguous()
        elif m and m.group(2) in _BLOCK:
            out[f"blocks.{m.group(1)}.{_BLOCK[m.group(2)]}.{m.group(3)}"] = v
        else:
            unknown.append(k)
    if unknown:
        raise WeightsError(f"{path}: unexpected timm keys {', '.join(unknown[:3])}")
    if "pos_embed" not in out:
        raise WeightsError(f"{path}: timm ViT without pos_embed (missing key)")
    avg = "fc_norm.weight" in out
    qkv_bias = any(k.endswith("attn.q_proj.bias") for k in out)
    if not qkv_bias:
        add_zero_qkv_biases(out)
    num_prefix = int("cls_token" in out) + int("dist_token" in out)
    n = out["pos_embed"].shape[1] - num_prefix
    side = int(round(n**0.5))
    if side * side != n:
        raise WeightsError(
            f"{path}: pos_embed has {n} patch positions after {num_prefix} prefix tokens, not a "
            "square grid (a timm no_embed_class model?)"
        )
    patch = int(out["patch_embed.weight"].shape[-1])
    settings = dict(
        class_token="cls_token" in out,
        global_pool="avg" if avg else "token",
        dist_head="head_dist.weight" in out or "dist_token" not in out,
        norm_eps=1e-6,
        pos_embed_antialias=True,
        img_size=side * patch,
        in_chans=int(out["patch_embed.weight"].shape[1]),
    )
    fc1 = out.get("blocks.0.mlp.fc1.weight")
    if fc1 is not None:
        settings["mlp_ratio"] = fc1.shape[0] / fc1.shape[1]
    return Source("timm", path, out, settings)


def to_timm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our ``VisionTransformer`` state dict in timm's names (q, k, v fused into qkv)."""
    inv_top = {v: k for k, v in _TOP.items()}
    inv_block = {v: k for k, v in _BLOCK.items()}
    out = {}
    for k, v in state.items():
        m = re.fullmatch(r"blocks\.(\d+)\.(.+)\.(weight|bias)", k)
        if k in inv_top:
            out[inv_top[k]] = v
        elif m and m.group(2) == "attn.q_proj":
            i, wb = m.group(1), m.group(3)
            parts = [state[f"blocks.{i}.attn.{p}.{wb}"] for p in ("q_proj", "k_proj", "v_proj")]
            out[f"blocks.{i}.attn.qkv.{wb}"] = torch.cat(parts, dim=0)
        elif m and m.group(2) in ("attn.k_proj", "attn.v_proj"):
            continue
        elif m:
            out[f"blocks.{m.group(1)}.{inv_block[m.group(2)]}.{m.group(3)}"] = v
        else:
            out[k] = v
    return out
