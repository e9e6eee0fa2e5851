"""The fully-attentional CIFAR network of Cordonnier, Loukas, Jaggi (ICLR 2020), sec. 4.

A BERT encoder on pixels (reference code epfml/attention-cnn): 2x2 space-to-depth of the 32x32
image (16x16x12), Linear(12, 400), then 6 post-LayerNorm layers of

    a = MHSA(x)                                   (eq. 1-2: 9 heads over the raw 400-d input,
                                                   Wval Wout = one Linear(9*400, 400))
    x = LayerNorm(x + Dropout(Dense(a)))          (BERT self-output, 400x400)
    x = LayerNorm(x + Dropout(W2 GELU(W1 x)))     (feed-forward 400 -> 512 -> 400)

mean pooling over pixels and Linear(400, classes). Positional encodings (sec. 4.2-4.3):
quadratic (eq. 9, isotropic Gaussian per head), its generalized form (learned PSD precision),
learned relative (position-only) and learned relative + content.
Table 1 parameters at 10 classes: 12.1M / 12.3M / 29.5M (these models: 12.09M, 12.28M, 29.48M).
Learned relative + content comes twice: ``sa_learned_content`` (q.k + q.r, the later upstream
layer, Table 1's size) and ``sa_learned_content_runs`` (q.k + per-head keys' w.r, the layer of
the reference's paper-run commit 9ffaa30, 29.60M).
Width, depth, heads, feed-forward size and input downsampling are overridable.

Initialisation and parametrization follow the reference code, not BERT's paper: PyTorch's
default Linear init, N(0, 1) learned relative tables, Gaussian spreads s with alpha = s^2 / 2
(``init="bert"`` gives BERT's N(0, 0.02) instead). ``reference_port.py`` maps a reference
checkpoint's parameters onto these models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers.attention_map import AttentionMap
from ..layers.dropout import HashDropout
from ..layers.mhsa2d import MultiHeadSelfAttention2d
from ..memory import check_attention_maps
from ._common import build_config, check_images
from .registry import register_model

__all__ = [
    "SACifarConfig",
    "SelfAttentionCifar",
    "sa_quadratic",
    "sa_quadratic_generalized",
    "sa_learned",
    "sa_learned_content",
    "sa_learned_content_runs",
]

# "reference": what epfml/attention-cnn's BertImage does (it never calls BERT's
#   init_bert_weights): PyTorch's default Linear init, learned relative tables N(0, 1) as
#   nn.Embedding; "bert": BERT's init_bert_weights, Linear N(0, 0.02) with zero bias and the
#   tables N(0, 0.02) (this project's init before; kept to compare).
INITS = ("reference", "bert")


@dataclass
class SACifarConfig:
    num_classes: int = 10
    img_size: int = 32
    in_chans: int = 3
    downsample: int = 2  # space-to-depth factor: 32x32x3 -> 16x16x12
    hidden_size: int = 400
    num_layers: int = 6
    num_heads: int = 9
    ff_size: int = 512
    dropout: float = 0.1  # hidden dropout (BERT hidden_dropout_prob)
    attn_dropout: float = 0.1  # on the attention probabilities
    # "batch": one (Nh, T, T) mask per step shared by the batch, as the reference's Gaussian layer
    # (position-only models); "sample": a mask per image (content models always)
    attn_dropout_mask: str = "batch"
    positional: str = "quadratic"  # any MultiHeadSelfAttention2d positional
    content: bool = False
    # learned relative: per-head keys read the tables (w_h . r, unscaled; the position-only
    # layer, and with content the paper-run commit's); None: head keys iff content is False
    head_keys: bool | None = None
    max_size: int | None = None  # side of learned tables; default img_size // downsample
    init_centers_std: float = 2.0  # Delta ~ N(0, 2^2 I) pixels (reference init)
    init_alpha: float = 0.5  # alpha = s^2 / 2, s init sqrt(2 init_alpha) (1 + N(0, 0.01^2))
    init: str = "reference"  # "reference": the reference code's init; "bert": BERT's (see INITS)
    init_std: float = 0.02  # BERT initializer_range (init="bert" only)
    layer_norm_eps: float = 1e-12
    backend: str | None = None  # the attention layers' (kernels/plan.py; None: its choice)


class SALayer(nn.Module):
    """One BERT layer on an (H, W, B, D) pixel grid (sequence-first, channels-last: every
    Linear, LayerNorm and the attention's GEMMs read it in place), attention by
    MultiHeadSelfAttention2d."""

    def __init__(self, cfg: SACifarConfig, max_size: int) -> None:
        super().__init__()
        D = cfg.hidden_size
        # the Gaussian's initial values go whole: the factory (encodings/registry.py) gives them
        # to the encodings that have them
        extra = {"init_centers_std": cfg.init_centers_std, "init_alpha": cfg.init_alpha}
        if cfg.head_keys is not None:  # relative_learned only (build_encoding checks)
            extra["head_keys"] = cfg.head_keys
        self.attn = MultiHeadSelfAttention2d(
            D,
            D,
            cfg.num_heads,
            positional=cfg.positional,
            content=cfg.content,
            dropout=cfg.attn_dropout,
            dropout_mask="sample" if cfg.content else cfg.attn_dropout_mask,
            backend=cfg.backend,
            value="identity",  # each head attends over the raw D-d input; out_proj = Wval Wout
            max_size=max_size,
            **extra,
        )
        self.attn_dense = nn.Linear(D, D)  # BERT self-output dense
        self.norm1 = nn.LayerNorm(D, eps=cfg.layer_norm_eps)
        self.fc1 = nn.Linear(D, cfg.ff_size)
        self.fc2 = nn.Linear(cfg.ff_size, D)
        self.norm2 = nn.LayerNorm(D, eps=cfg.layer_norm_eps)
        self.drop = HashDropout(cfg.dropout)  # nn.Dropout's law, a counter-hash mask

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        probs = None
        if return_attention:  # the NCHW path that returns the probabilities
            a, probs = self.attn(x.permute(2, 3, 0, 1), return_attention=True)
            a = a.permute(2, 3, 0, 1)  # (H, W, B, D)
        else:
            a = self.attn.forward_tokens(x)  # (H, W, B, D)
        x = self.norm1(x + self.drop(self.attn_dense(a)))  # post-LN
        x = self.norm2(x + self.drop(self.fc2(F.gelu(self.fc1(x)))))
        return x, probs


class SelfAttentionCifar(nn.Module):
    """Cordonnier et al.'s network: NCHW images -> logits.

    ``forward(x, return_attention=True)`` -> (logits, [AttentionMap per layer]), probabilities
    (B or 1, Nh, T, T) over the T = (H/ds)*(W/ds) pixels of the downsampled grid, row-major.
    ``forward_features`` -> (B, D, H/ds, W/ds); ``forward_head`` mean-pools and classifies.
    ``attention_centers()`` -> (layers, Nh, 2) head centres Delta in pixels (quadratic).
    """

    num_prefix_tokens = 0

    def __init__(self, cfg: SACifarConfig) -> None:
        super().__init__()
        for name in ("downsample", "hidden_size", "num_layers", "num_heads", "ff_size"):
            if getattr(cfg, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
        if cfg.img_size % cfg.downsample != 0:
            raise ValueError(
                f"img_size {cfg.img_size} is not a multiple of downsample {cfg.downsample}"
            )
        if cfg.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {cfg.init!r}")
        self.cfg = cfg
        grid = cfg.img_size // cfg.downsample
        self.attention_grid = (grid, grid)
        self.max_size = cfg.max_size or grid
        self.embed = nn.Linear(cfg.in_chans * cfg.downsample**2, cfg.hidden_size)  # 12 -> 400
        self.layers = nn.ModuleList([SALayer(cfg, self.max_size) for _ in range(cfg.num_layers)])
        self.head = nn.Linear(cfg.hidden_size, cfg.num_classes)
        self.num_features = cfg.hidden_size
        if cfg.init == "bert":  # "reference": the modules' own init is the reference code's
            self._init_bert()

    def _init_bert(self) -> None:
        """BERT's init_bert_weights: Linear N(0, 0.02), zero bias; learned tables N(0, 0.02)."""
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for name, p in self.named_parameters():
            if name.endswith(("rel_row", "rel_col")):
                nn.init.normal_(p, std=std)

    def _check(self, x: torch.Tensor) -> None:
        check_images(x, self.cfg.in_chans, "sa_cifar", self)
        h, w, ds = x.shape[2], x.shape[3], self.cfg.downsample
        if h % ds or w % ds:
            raise ValueError(
                f"image size {h}x{w} is not a multiple of the space-to-depth factor {ds}"
            )
        tables = self.layers[0].attn.positional_encoding.learned_size  # None: any size
        if tables is not None and max(h, w) > self.max_size * ds:
            s = self.max_size * ds
            raise ValueError(
                f"image size {h}x{w} is too large for the learned positional tables of this "
                f"model: it expects images up to {s}x{s} (build it with img_size or max_size "
                "larger)"
            )

    def forward_features(self, x: torch.Tensor, return_attention: bool = False):
        self._check(x)
        if return_attention:  # the maps' size refused before any of them is computed
            t = (x.shape[2] // self.cfg.downsample) * (x.shape[3] // self.cfg.downsample)
            b = x.shape[0] if self.cfg.content else 1  # position only: one map for every image
            shape = (b, self.cfg.num_heads, t, t)
            size = x.element_size() if x.is_floating_point() else 4
            where = f"sa_cifar on {x.shape[0]} image(s) of {x.shape[2]}x{x.shape[3]}"
            check_attention_maps([shape] * len(self.layers), size, where)
        b, c, h, w = x.shape
        ds = self.cfg.downsample  # (torch returns an empty batch unshuffled, of the input's shape)
        x = F.pixel_unshuffle(x, ds) if b else x.reshape(0, c * ds * ds, h // ds, w // ds)
        x = self.embed(x.permute(2, 3, 0, 1))  # (h, w, B, D)
        attns = []
        for layer in self.layers:
            x, a = layer(x, return_attention)
            attns.append(None if a is None else AttentionMap(a, x.shape[0:2]))
        feats = x.permute(2, 3, 0, 1)  # (B, D, h, w)
        return (feats, attns) if return_attention else feats

    def forward_head(self, feats: torch.Tensor) -> torch.Tensor:
        return self.head(feats.mean(dim=(2, 3)))  # mean pooling over pixels

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        if return_attention:
            feats, attns = self.forward_features(x, return_attention=True)
            return self.forward_head(feats), attns
        return self.forward_head(self.forward_features(x))

    def attention_centers(self) -> torch.Tensor:
        """(layers, Nh, 2) (row, col) centres Delta of every quadratic head, in pixels of the
        downsampled grid."""
        return torch.stack([layer.attn.attention_centers() for layer in self.layers])


def _sa(name: str, num_classes: int, defaults: dict, overrides: dict) -> SelfAttentionCifar:
    defaults = {**defaults, "num_classes": num_classes}
    return SelfAttentionCifar(build_config(SACifarConfig, name, defaults, overrides))


@register_model
def sa_quadratic(num_classes: int = 10, **overrides) -> SelfAttentionCifar:
    """Quadratic (isotropic Gaussian) encoding, position only: Table 1 "SA quadratic", 12.1M."""
    return _sa("sa_quadratic", num_classes, {"positional": "quadratic"}, overrides)


@register_model
def sa_quadratic_generalized(num_classes: int = 10, **overrides) -> SelfAttentionCifar:
    """Generalized quadratic encoding (learned PSD precision per head), position only."""
    defaults = {"positional": "quadratic_generalized"}
    return _sa("sa_quadratic_generalized", num_classes, defaults, overrides)


@register_model
def sa_learned(num_classes: int = 10, **overrides) -> SelfAttentionCifar:
    """Learned relative encoding, position only: Table 1 "SA learned relative", 12.3M."""
    defaults = {"positional": "relative_learned", "content": False}
    return _sa("sa_learned", num_classes, defaults, overrides)


@register_model
def sa_learned_content(num_classes: int = 10, **overrides) -> SelfAttentionCifar:
    """Learned relative encoding + content: Table 1 "SA learned relative + content", 29.5M."""
    defaults = {"positional": "relative_learned", "content": True}
    return _sa("sa_learned_content", num_classes, defaults, overrides)


@register_model
def sa_learned_content_runs(num_classes: int = 10, **overrides) -> SelfAttentionCifar:
    """Learned relative + content as the reference code's paper-run commit computes it
    (epfml/attention-cnn 9ffaa30, the commit of runs/*/run.sh; models/bert.py
    ``Learned2DRelativeSelfAttention`` with ``use_attention_data=True``, position_encoding_size
    -1): logits q.k / sqrt(D) + w_row_h . r_row(delta1) + w_col_h . r_col(delta2), the
    position-only layer's per-head keys and D-wide tables (2m-1, D), unscaled, added to the
    content term; q, k D wide per head (biased Linear(D, Nh*D)). ``sa_learned_content`` is the
    later upstream layer instead (``query_positional_score``: q.k + q.r, the query reading
    (2m-1, D/2) tables, all / sqrt(D)), Table 1's 29.5M; this one has 29.60M."""
    defaults = {"positional": "relative_learned", "content": True, "head_keys": True}
    return _sa("sa_learned_content_runs", num_classes, defaults, overrides)
