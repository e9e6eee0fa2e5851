"""Bottleneck ResNet-26/38/50 and their Stand-Alone Self-Attention versions (Ramachandran et al.,
NeurIPS 2019, sec. 4.1).

Every 3x3 convolution of the bottlenecks is replaced by LocalSelfAttention2d (k = 7, 8 heads,
relative positions); stride 2 is a 2x2 average pool after the attention. Stems: the ResNet conv
stem (7x7/2 conv, BN, ReLU, 3x3/2 max pool) or the attention stem (spatially-aware values,
4x4 window, 4 mixtures, BN, ReLU, 4x4 max pool). Depths: 26 = [1, 2, 4, 1], 38 = [2, 3, 5, 2],
50 = [3, 4, 6, 3]. ``*_cifar`` models use a small stem (3x3/1 conv, or the attention stem
without pooling) for 32x32 inputs. Paper parameter counts (1000 classes): baselines
13.7M / 19.6M / 25.6M, attention 10.3M / 14.1M / 18.0M.

Attention maps: ``local_attention_maps(x)`` returns, per attention layer (input -> output
order), the window probabilities (B, nh, H*W, k*k); ``forward(x, return_attention=True)`` turns
them into ``AttentionMap``s of dense (B, nh, T, T) probabilities on each layer's grid (rows =
queries, row-major), refused before any layer runs when they cannot fit in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers.attention_map import AttentionMap
from ..layers.checks import set_backend
from ..layers.local import LocalSelfAttention2d, local_to_dense
from ..layers.stem import AttentionStem2d
from ..memory import check_attention_maps
from ._common import build_config, check_images, check_stages
from .registry import register_model

DEPTHS = {26: (1, 2, 4, 1), 38: (2, 3, 5, 2), 50: (3, 4, 6, 3)}


@dataclass
class SASAResNetConfig:
    num_classes: int = 1000
    in_chans: int = 3
    depths: tuple[int, ...] = (3, 4, 6, 3)  # bottlenecks per stage
    widths: tuple[int, ...] = (64, 128, 256, 512)  # bottleneck widths; block output = 4x
    spatial: str = "attention"  # "attention" (SASA) or "conv" (3x3 baseline)
    stem: str = "attention"  # "attention" or "conv"
    small_stem: bool = False  # CIFAR: stride-1 stem, no pooling
    kernel_size: int = 7  # spatial extent k of the attention layers
    num_heads: int = 8
    positional: str = "relative"
    logits: str = "qk+qr"
    padding: str = "mask"
    stem_kernel_size: int = 4
    stem_mixtures: int = 4
    stem_heads: int = 8
    backend: str | None = None  # set on every attention layer that takes it (set_backend)
    zero_init_residual: bool = True  # last BN of every block starts at 0 (Goyal et al. 2017)
    img_size: int = 224


class Bottleneck(nn.Module):
    """1x1 conv - (3x3 conv | k x k local attention) - 1x1 conv, BN after each, + shortcut."""

    expansion = 4

    def __init__(self, in_chans: int, width: int, stride: int, cfg: SASAResNetConfig) -> None:
        super().__init__()
        out = width * self.expansion
        self.conv1 = nn.Conv2d(in_chans, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        if cfg.spatial == "attention":
            self.conv2 = LocalSelfAttention2d(
                width,
                width,
                cfg.num_heads,
                cfg.kernel_size,
                stride,
                cfg.positional,
                cfg.logits,
                cfg.padding,
            )
        else:
            self.conv2 = nn.Conv2d(width, width, 3, stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        if cfg.zero_init_residual:
            nn.init.zeros_(self.bn3.weight)
        self.shortcut = nn.Identity()
        if stride != 1 or in_chans != out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_chans, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor, maps: list | None = None) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))  # (B, width, H, W)
        if maps is not None and isinstance(self.conv2, LocalSelfAttention2d):
            h, w = y.shape[-2:]  # the attention's grid, before its stride pooling
            y, attn = self.conv2(y, return_attention=True)
            maps.append((attn, h, w))
        else:
            y = self.conv2(y)  # (B, width, H/s, W/s)
        y = F.relu(self.bn2(y))
        y = self.bn3(self.conv3(y))  # (B, 4 width, H/s, W/s)
        return F.relu(y + self.shortcut(x))


class SASAResNet(nn.Module):
    """Bottleneck ResNet with convolutional or local-attention spatial layers. NCHW -> logits."""

    num_prefix_tokens = 0

    def __init__(self, cfg: SASAResNetConfig) -> None:
        super().__init__()
        for name, val, ok in (
            ("spatial", cfg.spatial, ("attention", "conv")),
            ("stem", cfg.stem, ("attention", "conv")),
        ):
            if val not in ok:
                raise ValueError(f"{name} must be one of {ok}, got {val!r}")
        check_stages("sasa_resnet", cfg.widths, cfg.depths)
        self.cfg = cfg
        c0 = cfg.widths[0]
        if cfg.stem == "attention":
            pool = 1 if cfg.small_stem else 4
            self.stem = AttentionStem2d(
                cfg.in_chans,
                c0,
                cfg.stem_heads,
                cfg.stem_kernel_size,
                cfg.stem_mixtures,
                pool,
                padding=cfg.padding,
            )
        elif cfg.small_stem:
            self.stem = nn.Sequential(
                nn.Conv2d(cfg.in_chans, c0, 3, 1, 1, bias=False), nn.BatchNorm2d(c0), nn.ReLU()
            )
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(cfg.in_chans, c0, 7, 2, 3, bias=False),
                nn.BatchNorm2d(c0),
                nn.ReLU(),
                nn.MaxPool2d(3, 2, 1),
            )
        stages, c = [], c0
        for i, (w, d) in enumerate(zip(cfg.widths, cfg.depths)):
            blocks = []
            for j in range(d):
                blocks.append(Bottleneck(c, w, 2 if (i > 0 and j == 0) else 1, cfg))
                c = w * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.layers = nn.Sequential(*stages)
        self.num_features = c
        self.fc = nn.Linear(c, cfg.num_classes)
        self.attention_grids = self._grids(cfg.img_size, cfg.img_size)
        s = cfg.img_size // (1 if cfg.small_stem else 4) // 2 ** (len(cfg.widths) - 1)
        self.attention_grid = self.attention_grids[0] if self.attention_grids else (s, s)
        if cfg.backend is not None:
            set_backend(self, cfg.backend)

    def _grids(self, h: int, w: int) -> list[tuple[int, int]]:
        """(h, w) of each attention layer's maps for an h x w input."""
        grids = []
        if self.cfg.stem == "attention":
            grids.append((h, w))
            pool = 1 if self.cfg.small_stem else 4
            h, w = h // pool, w // pool  # its max pool
        elif not self.cfg.small_stem:  # a 7x7/2 conv, then a 3x3/2 max pool: ceil(H/4)
            h, w = (h + 3) // 4, (w + 3) // 4
        if self.cfg.spatial == "attention":
            for i, d in enumerate(self.cfg.depths):
                for j in range(d):
                    grids.append((h, w))  # a strided block attends before its 2x2 pooling
                    if i > 0 and j == 0:
                        h, w = (h + 1) // 2, (w + 1) // 2  # (ceil_mode)
        return grids

    def check_maps(self, x: torch.Tensor) -> None:
        """The dense maps of ``forward(x, return_attention=True)`` refused in one line, before
        any layer runs, when they cannot fit in memory (size needed and the bound)."""
        check_images(x, self.cfg.in_chans, "sasa_resnet", self)
        grids = self._grids(*x.shape[-2:])
        stem = self.cfg.stem == "attention"
        heads = [self.cfg.stem_heads] * stem + [self.cfg.num_heads] * (len(grids) - stem)
        shapes = [(x.shape[0], nh, h * w, h * w) for nh, (h, w) in zip(heads, grids)]
        where = f"sasa_resnet on {x.shape[0]} image(s) of {x.shape[2]}x{x.shape[3]}"
        hint = "use smaller images, fewer at a time, or model.local_attention_maps(x) (windows)"
        check_attention_maps(shapes, x.element_size(), where, hint=hint)

    def _features(self, x: torch.Tensor, maps: list | None) -> torch.Tensor:
        check_images(x, self.cfg.in_chans, "sasa_resnet", self)
        if maps is not None and isinstance(self.stem, AttentionStem2d):
            h, w = x.shape[-2:]
            x, attn = self.stem(x, return_attention=True)
            maps.append((attn, h, w))
        else:
            x = self.stem(x)  # (B, 64, H/4, W/4), or (B, 64, H, W) with the small stem
        for stage in self.layers:
            for block in stage:
                x = block(x, maps)
        return x  # (B, 4 * widths[-1], H/32, W/32)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self._features(x, None)

    def forward_head(self, feats: torch.Tensor) -> torch.Tensor:
        return self.fc(feats.mean(dim=(2, 3)))  # global average pool -> (B, classes)

    def local_attention_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Window probabilities (B, nh, H*W, k*k) of every attention layer, input -> output."""
        maps: list = []
        self._features(x, maps)
        return [m for m, _, _ in maps]

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        if not return_attention:
            return self.forward_head(self._features(x, None))
        self.check_maps(x)
        maps: list = []
        logits = self.forward_head(self._features(x, maps))
        dense = []
        for attn, h, w in maps:
            kk = attn.shape[-1]
            dense.append(AttentionMap(local_to_dense(attn, h, w, int(round(kk**0.5))), (h, w)))
        return logits, dense


def _register(name: str, depth: int, spatial: str, stem: str, cifar: bool) -> None:
    defaults = dict(depths=DEPTHS[depth], spatial=spatial, stem=stem)
    if cifar:
        defaults.update(num_classes=10, small_stem=True, img_size=32)

    def factory(num_classes: int = 10 if cifar else 1000, **overrides) -> SASAResNet:
        cfg = build_config(
            SASAResNetConfig, name, {**defaults, "num_classes": num_classes}, overrides
        )
        return SASAResNet(cfg)

    kind = "convolutional baseline" if spatial == "conv" else f"SASA, {stem} stem"
    size = "CIFAR (small stem, 32x32)" if cifar else "ImageNet (224x224)"
    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = f"Bottleneck ResNet-{depth}, {kind}, {size}."
    globals()[name] = register_model(factory)


for _d in (26, 38, 50):
    for _cifar in (False, True):
        _sfx = "_cifar" if _cifar else ""
        _register(f"resnet{_d}{_sfx}", _d, "conv", "conv", _cifar)
        _register(f"sasa_resnet{_d}{_sfx}", _d, "attention", "attention", _cifar)
        _register(f"sasa_resnet{_d}_convstem{_sfx}", _d, "attention", "conv", _cifar)
