"""The named ViT and DeiT geometries (``attnconv.create_model(name)``): the CIFAR ViTs with 4x4
patches, and timm's / Hugging Face's ImageNet ViT-Ti/S/B/L/16 and DeiT-Ti/S/B (distilled too)."""

from __future__ import annotations

from ._common import build_config
from .registry import register_model
from .vit import VisionTransformer, ViTConfig

__all__ = [
    "vit_tiny_cifar",
    "vit_small_cifar",
    "vit_tiny_patch16_224",
    "vit_small_patch16_224",
    "vit_base_patch16_224",
    "vit_large_patch16_224",
    "deit_tiny_patch16_224",
    "deit_small_patch16_224",
    "deit_base_patch16_224",
    "deit_tiny_distilled_patch16_224",
    "deit_small_distilled_patch16_224",
    "deit_base_distilled_patch16_224",
]


def _vit(name: str, defaults: dict, num_classes: int, overrides: dict) -> VisionTransformer:
    defaults = {**defaults, "num_classes": num_classes}
    return VisionTransformer(build_config(ViTConfig, name, defaults, overrides))


_CIFAR = dict(img_size=32, patch_size=4, depth=12)


@register_model
def vit_tiny_cifar(num_classes: int = 10, **overrides) -> VisionTransformer:
    """ViT-Ti (192 wide, 12 blocks, 3 heads) on 32x32 with 4x4 patches (8x8 grid)."""
    return _vit("vit_tiny_cifar", dict(_CIFAR, embed_dim=192, num_heads=3), num_classes, overrides)


@register_model
def vit_small_cifar(num_classes: int = 10, **overrides) -> VisionTransformer:
    """ViT-S (384 wide, 12 blocks, 6 heads) on 32x32 with 4x4 patches (8x8 grid)."""
    return _vit("vit_small_cifar", dict(_CIFAR, embed_dim=384, num_heads=6), num_classes, overrides)


# ImageNet geometries of timm / Hugging Face (patch 16 at 224: a 14x14 grid). Their defaults are
# timm's (LayerNorm eps 1e-6, antialiased position-embedding resampling); a checkpoint loaded with
# ``checkpoint=`` brings its own (a Hugging Face config: eps 1e-12, no antialiasing).
_IMAGENET = dict(pos_embed_antialias=True)
_TINY = dict(_IMAGENET, embed_dim=192, depth=12, num_heads=3)
_SMALL = dict(_IMAGENET, embed_dim=384, depth=12, num_heads=6)
_BASE = dict(_IMAGENET, embed_dim=768, depth=12, num_heads=12)
_LARGE = dict(_IMAGENET, embed_dim=1024, depth=24, num_heads=16)
_DISTILLED = dict(dist_token=True)


@register_model
def vit_tiny_patch16_224(num_classes: int = 1000, **overrides) -> VisionTransformer:
    """ViT-Ti/16 at 224x224 (192 wide, 12 blocks, 3 heads; timm's geometry)."""
    return _vit("vit_tiny_patch16_224", _TINY, num_classes, overrides)


@register_model
def vit_small_patch16_224(num_classes: int = 1000, **overrides) -> VisionTransformer:
    """ViT-S/16 at 224x224 (384 wide, 12 blocks, 6 heads; timm's geometry)."""
    return _vit("vit_small_patch16_224", _SMALL, num_classes, overrides)


@register_model
def vit_base_patch16_224(num_classes: int = 1000, **overrides) -> VisionTransformer:
    """ViT-B/16 at 224x224 (768 wide, 12 blocks, 12 heads): 86.6M parameters at 1000 classes."""
    return _vit("vit_base_patch16_224", _BASE, num_classes, overrides)


@register_model
def vit_large_patch16_224(num_classes: int = 1000, **overrides) -> VisionTransformer:
    """ViT-L/16 at 224x224 (1024 wide, 24 blocks, 16 heads): 304.3M parameters at 1000 classes."""
    return _vit("vit_large_patch16_224", _LARGE, num_classes, overrides)


@register_model
def deit_tiny_patch16_224(num_classes: int = 1000, **overrides) -> VisionTransformer:
    """DeiT-Ti at 224x224: ViT-Ti/16's geometry (DeiT differs in training only)."""
    return _vit("deit_tiny_patch16_224", _TINY, num_classes, overrides)


@register_model
def deit_small_patch16_224(num_classes: int = 1000, **overrides) -> VisionTransformer:
    """DeiT-S at 224x224: ViT-S/16's geometry."""
    return _vit("deit_small_patch16_224", _SMALL, num_classes, overrides)


@register_model
def deit_base_patch16_224(num_classes: int = 1000, **overrides) -> VisionTransformer:
    """DeiT-B at 224x224: ViT-B/16's geometry."""
    return _vit("deit_base_patch16_224", _BASE, num_classes, overrides)


@register_model
def deit_tiny_distilled_patch16_224(num_classes: int = 1000, **overrides) -> VisionTransformer:
    """DeiT-Ti with the distillation token and head (DeiT sec. 5), 224x224."""
    return _vit("deit_tiny_distilled_patch16_224", {**_TINY, **_DISTILLED}, num_classes, overrides)


@register_model
def deit_small_distilled_patch16_224(num_classes: int = 1000, **overrides) -> VisionTransformer:
    """DeiT-S with the distillation token and head (DeiT sec. 5), 224x224."""
    return _vit(
        "deit_small_distilled_patch16_224", {**_SMALL, **_DISTILLED}, num_classes, overrides
    )


@register_model
def deit_base_distilled_patch16_224(num_classes: int = 1000, **overrides) -> VisionTransformer:
    """DeiT-B with the distillation token and head (DeiT sec. 5), 224x224."""
    return _vit("deit_base_distilled_patch16_224", {**_BASE, **_DISTILLED}, num_classes, overrides)
