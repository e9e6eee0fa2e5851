"""Shared by the pretrained-weights tests: small random Hugging Face ViTs / DeiTs saved with
``save_pretrained``, random state dicts in timm's key layout (``timm/models/vision_transformer.py``,
``deit.py``; timm itself needs torchvision, not installable here) and timm's forward pass written
from the raw tensors in float64, with its ``resample_abs_pos_embed`` arithmetic (bicubic,
antialias=True)."""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from attnconv import create_model

D, DEPTH, HEADS, P = 32, 2, 4, 8  # small geometry: fast tests
SMALL = dict(embed_dim=D, depth=DEPTH, num_heads=HEADS, patch_size=P)


def randomize(module: torch.nn.Module, seed: int = 0, std: float = 0.3) -> None:
    """Random weights large enough that attention is far from uniform."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def images(n: int, size: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def load(name: str, path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_model(name, checkpoint=path, **{**SMALL, **kw})


def hf_config(cls_name: str, **kw):
    import transformers

    cfg = getattr(transformers, cls_name)(
        hidden_size=D,
        num_hidden_layers=DEPTH,
        num_attention_heads=HEADS,
        intermediate_size=4 * D,
        image_size=32,
        patch_size=P,
        **kw,
    )
    cfg._attn_implementation = "eager"  # output_attentions needs the eager kernel
    return cfg


def hf_save(model, path):
    randomize(model)
    model.eval().save_pretrained(path)
    return model


def hf_run(model, x, **kw):
    with torch.no_grad():
        out = model(x, output_attentions=True, interpolate_pos_encoding=x.shape[-1] != 32, **kw)
    return out


def timm_state(
    *, grid: int = 4, distilled: bool = False, pool: str = "token", classes: int = 5, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A random state dict with timm's ViT / DeiT key names and shapes."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=0.3):
        return torch.randn(*shape, generator=g) * std

    cls = pool == "token"
    prefix = int(cls) + int(distilled)
    sd = {"pos_embed": r(1, prefix + grid * grid, D, std=1.0)}
    if cls:
        sd["cls_token"] = r(1, 1, D)
    if distilled:
        sd["dist_token"] = r(1, 1, D)
    sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"] = r(D, 3, P, P, std=0.1), r(D)
    for i in range(DEPTH):
        b = f"blocks.{i}."
        for name, shape in (
            ("norm1", (D,)),
            ("attn.qkv", (3 * D, D)),
            ("attn.proj", (D, D)),
            ("norm2", (D,)),
            ("mlp.fc1", (4 * D, D)),
            ("mlp.fc2", (D, 4 * D)),
        ):
            sd[b + name + ".weight"] = 1 + r(*shape) if len(shape) == 1 else r(*shape)
            sd[b + name + ".bias"] = r(shape[0])
    norm = "norm" if cls else "fc_norm"
    sd[norm + ".weight"], sd[norm + ".bias"] = 1 + r(D), r(D)
    sd["head.weight"], sd["head.bias"] = r(classes, D), r(classes)
    if distilled:
        sd["head_dist.weight"], sd["head_dist.bias"] = r(classes, D), r(classes)
    return sd


def timm_resample(posemb, new_size, num_prefix_tokens):
    """timm.layers.pos_embed.resample_abs_pos_embed (bicubic, antialias=True), as written there."""
    hw = int(math.sqrt(posemb.shape[1] - num_prefix_tokens))
    prefix, posemb = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    dim, dtype = posemb.shape[-1], posemb.dtype
    posemb = posemb.float().reshape(1, hw, hw, -1).permute(0, 3, 1, 2)
    posemb = F.interpolate(posemb, size=new_size, mode="bicubic", antialias=True)
    posemb = posemb.permute(0, 2, 3, 1).reshape(1, -1, dim).to(dtype)
    return torch.cat([prefix, posemb], dim=1)


def timm_reference(sd, x, *, eps=1e-6):
    """timm's VisionTransformer(Distilled).forward in float64 from the raw tensors; returns
    (logits, [attention (B, nh, T, T) per block])."""
    sd = {k: v.double() for k, v in sd.items()}
    x = x.double()
    B = x.shape[0]
    t = F.conv2d(x, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=P)
    grid = t.shape[-2:]
    t = t.flatten(2).transpose(1, 2)  # (B, N, D)
    prefix = [sd[k].expand(B, -1, -1) for k in ("cls_token", "dist_token") if k in sd]
    pe = sd["pos_embed"]
    if pe.shape[1] != len(prefix) + grid[0] * grid[1]:
        pe = timm_resample(sd["pos_embed"].float(), tuple(grid), len(prefix)).double()
    t = torch.cat([*prefix, t], dim=1) + pe

    def ln(h, name):
        return F.layer_norm(h, (D,), sd[name + ".weight"], sd[name + ".bias"], eps=eps)

    attns = []
    for i in range(DEPTH):
        b = f"blocks.{i}."
        h = ln(t, b + "norm1")
        qkv = F.linear(h, sd[b + "attn.qkv.weight"], sd.get(b + "attn.qkv.bias"))  # qkv_bias
        q, k, v = qkv.reshape(B, -1, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)  # (B, nh, T, hs)
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D // HEADS), dim=-1)
        attns.append(a)
        o = (a @ v).transpose(1, 2).reshape(B, -1, D)
        t = t + F.linear(o, sd[b + "attn.proj.weight"], sd[b + "attn.proj.bias"])
        h = ln(t, b + "norm2")
        h = F.linear(
            F.gelu(F.linear(h, sd[b + "mlp.fc1.weight"], sd[b + "mlp.fc1.bias"])),
            sd[b + "mlp.fc2.weight"],
            sd[b + "mlp.fc2.bias"],
        )
        t = t + h
    if "fc_norm.weight" in sd:  # global_pool="avg": mean of the patch tokens, then fc_norm
        feat = ln(t[:, len(prefix) :].mean(1), "fc_norm")
        return F.linear(feat, sd["head.weight"], sd["head.bias"]), attns
    t = ln(t, "norm")
    logits = F.linear(t[:, 0], sd["head.weight"], sd["head.bias"])
    if "head_dist.weight" in sd:
        logits = (logits + F.linear(t[:, 1], sd["head_dist.weight"], sd["head_dist.bias"])) / 2
    return logits, attns
