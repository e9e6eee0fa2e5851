"""Vision Transformer (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021).

Eq. 1-4 of the ViT paper: z0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos,
z'_l = MSA(LN(z_{l-1})) + z_{l-1}, z_l = MLP(LN(z'_l)) + z'_l, y = LN(z_L^0) -> head.
The attention is ``attnconv.MultiHeadAttention`` (one shared kernel for the whole library).

Position embeddings are learned 1D (the paper's default) or fixed 2D sinusoidal (half the
channels encode the row, half the column). When the image size changes, learned embeddings
are resampled bicubically on the patch grid (the prefix tokens' embeddings are kept as is);
``pos_embed_antialias`` picks timm's antialiased kernel over Hugging Face's plain one.

DeiT (Touvron et al., "Training data-efficient image transformers & distillation through
attention", ICML 2021, sec. 5): ``dist_token`` adds a distillation token after the class token,
and with ``dist_head`` its own classifier; at inference the two heads' logits are averaged, and
in training too unless ``set_distilled_training()`` asks for them apart (timm's default, switch).
``global_pool="avg"`` classifies the mean of the patch tokens (timm's variant, with the final
LayerNorm after the pooling as ``fc_norm``). Pretrained timm / Hugging Face weights:
``attnconv.create_model(name, checkpoint=PATH)`` (``attnconv.loading``); the named geometries
(vit_tiny_cifar, ViT-Ti/S/B/L, DeiT) are in ``vit_zoo.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers.attention_map import AttentionMap
from ..layers.checks import finite_float
from ..layers.encodings.sinusoidal import sinusoid_2d
from ..layers.feedforward import FeedForward
from ..layers.mha import MultiHeadAttention
from ..memory import check_attention_maps
from ._common import check_images

__all__ = [
    "ViTConfig",
    "VisionTransformer",
    "sinusoidal_2d",
    "resample_pos_embed",
]

POS_EMBEDS = ("learned", "sinusoidal_2d")
GLOBAL_POOLS = ("token", "avg")


@dataclass
class ViTConfig:
    num_classes: int = 1000
    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    pos_embed: str = "learned"  # "learned" (1D) | "sinusoidal_2d" (fixed)
    dropout: float = 0.0  # after the position embeddings, in the MLP and projections
    attn_dropout: float = 0.0
    backend: str | None = None  # the attention's (functional.SEQUENCE_TABLE; None: its choice)
    class_token: bool = True
    dist_token: bool = False  # DeiT's distillation token (after the class token)
    dist_head: bool = True  # with dist_token: its own head, logits averaged with the class head
    global_pool: str = "token"  # "token" (class token) | "avg" (mean of the patch tokens)
    norm_eps: float = 1e-6  # LayerNorm eps (timm 1e-6; Hugging Face ViT configs say 1e-12)
    pos_embed_antialias: bool = False  # resampling kernel: timm antialiases, Hugging Face not


def sinusoidal_2d(grid_h: int, grid_w: int, dim: int) -> torch.Tensor:
    """(grid_h * grid_w, dim) fixed 2D encoding: [PE_1D(row) (dim/2), PE_1D(col) (dim/2)]."""
    if dim % 4 != 0:
        raise ValueError(f"2D sinusoidal position embeddings need embed_dim % 4 == 0, got {dim}")
    return sinusoid_2d(grid_h, grid_w, dim)  # row-major patches


def resample_pos_embed(
    pos_embed: torch.Tensor,
    old_grid: tuple[int, int],
    new_grid: tuple[int, int],
    num_prefix_tokens: int = 1,
    antialias: bool = False,
) -> torch.Tensor:
    """Bicubic resampling of (1, prefix + gh*gw, D) patch embeddings to a new grid.

    The prefix (class / distillation token) embeddings are kept unchanged. The arithmetic is
    timm's ``resample_abs_pos_embed`` (float32, ``antialias=True`` its default) and, with
    ``antialias=False``, Hugging Face's ``interpolate_pos_encoding`` (``align_corners=False``).
    """
    if tuple(old_grid) == tuple(new_grid):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    D = grid.shape[-1]
    grid = grid.reshape(1, old_grid[0], old_grid[1], D).permute(0, 3, 1, 2)  # (1, D, gh, gw)
    grid = F.interpolate(
        grid.float(), size=new_grid, mode="bicubic", align_corners=False, antialias=antialias
    )
    grid = grid.to(pos_embed.dtype).permute(0, 2, 3, 1).reshape(1, -1, D)  # (1, gh'*gw', D)
    return torch.cat([prefix, grid], dim=1)


def mlp_width(D: int, mlp_ratio: float) -> int:
    """timm's int(D * mlp_ratio), except that a product a float rounding puts just below an
    integer is that integer (a loader's ratio H / D gives back exactly H)."""
    h = D * mlp_ratio
    return round(h) if math.isclose(h, round(h), rel_tol=1e-9) else int(h)


class Block(nn.Module):
    """Pre-LN Transformer encoder block (ViT eq. 2-3)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        D = cfg.embed_dim
        self.norm1 = nn.LayerNorm(D, eps=cfg.norm_eps)
        self.attn = MultiHeadAttention(  # qkv_bias: q, k, v only; W^O keeps its bias (timm)
            D,
            cfg.num_heads,
            dropout=cfg.attn_dropout,
            bias=cfg.qkv_bias,
            out_bias=True,
            backend=cfg.backend,
        )
        self.drop = nn.Dropout(cfg.dropout)
        self.norm2 = nn.LayerNorm(D, eps=cfg.norm_eps)
        self.mlp = FeedForward(
            D, mlp_width(D, cfg.mlp_ratio), cfg.dropout, activation="gelu", out_dropout=True
        )

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        a = self.attn(self.norm1(x), return_attention=return_attention)
        a, attn = a if return_attention else (a, None)
        x = x + self.drop(a)  # (B, T, D)
        x = x + self.mlp(self.norm2(x))
        return (x, attn) if return_attention else x


class VisionTransformer(nn.Module):
    """ViT classifier over NCHW images; class token, learned 1D or 2D sinusoidal positions.

    Tokens: [class token][distillation token] patches, ``num_prefix_tokens`` = number of the
    first two present.

    ``forward(x, return_attention=True)`` returns (logits, [AttentionMap per block]), the
    probabilities (B, heads, prefix + N, prefix + N): the prefix tokens first, then the patches
    row-major.
    Inputs of another size than ``img_size`` (multiples of the patch size) are accepted:
    the position embeddings are resampled on the fly (``set_img_size`` does it once).
    """

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        if cfg.pos_embed not in POS_EMBEDS:
            raise ValueError(f"pos_embed must be one of {POS_EMBEDS}, got {cfg.pos_embed!r}")
        if cfg.img_size % cfg.patch_size != 0:
            raise ValueError(
                f"img_size {cfg.img_size} is not a multiple of patch_size {cfg.patch_size}"
            )
        if cfg.embed_dim % cfg.num_heads != 0:
            raise ValueError(
                f"embed_dim ({cfg.embed_dim}) must be divisible by num_heads ({cfg.num_heads})"
            )
        if cfg.global_pool not in GLOBAL_POOLS:
            raise ValueError(f"global_pool must be one of {GLOBAL_POOLS}, got {cfg.global_pool!r}")
        if cfg.global_pool == "token" and not cfg.class_token:
            raise ValueError('global_pool="token" needs class_token=True (or global_pool="avg")')
        if cfg.dist_token and not (cfg.class_token and cfg.global_pool == "token"):
            raise ValueError("dist_token needs the class token and global_pool='token' (DeiT)")
        finite_float("mlp_ratio", cfg.mlp_ratio, positive=True)
        self.cfg = cfg
        self.num_prefix_tokens = int(cfg.class_token) + int(cfg.dist_token)
        D, P = cfg.embed_dim, cfg.patch_size
        self.patch_embed = nn.Conv2d(cfg.in_chans, D, P, stride=P)  # linear map E of patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.dist_token else None
        self.grid = (cfg.img_size // P, cfg.img_size // P)
        n, npre = self.grid[0] * self.grid[1], self.num_prefix_tokens
        if cfg.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, npre + n, D))
        else:  # fixed; the prefix tokens get a zero encoding
            pe = torch.cat([torch.zeros(npre, D), sinusoidal_2d(*self.grid, D)])[None]
            self.register_buffer("pos_embed", pe, persistent=False)
        self.pos_drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.depth)])
        avg = cfg.global_pool == "avg"  # timm: the final norm moves after the pooling
        self.norm = nn.Identity() if avg else nn.LayerNorm(D, eps=cfg.norm_eps)
        self.fc_norm = nn.LayerNorm(D, eps=cfg.norm_eps) if avg else nn.Identity()
        self.head = nn.Linear(D, cfg.num_classes)
        self.head_dist = nn.Linear(D, cfg.num_classes) if cfg.dist_token and cfg.dist_head else None
        self.num_features = D
        self.distilled_training = False  # DeiT: train the two heads apart (set_distilled_training)
        self._init_weights()

    def set_distilled_training(self, enable: bool = True) -> None:
        """DeiT's hard-distillation training (sec. 5, timm's switch): in train mode ``forward``
        returns the class head's and the distillation head's logits apart, (B, classes) each,
        for a loss on the labels and one on the teacher's; in eval mode their mean as always."""
        if enable and self.head_dist is None:
            raise ValueError(
                "set_distilled_training needs the distillation head (a deit_*_distilled_*)"
            )
        self.distilled_training = enable

    @property
    def attention_grid(self) -> tuple[int, int]:
        return self.grid

    def _init_weights(self) -> None:
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if self.dist_token is not None:
            nn.init.trunc_normal_(self.dist_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:  # q, k, v with qkv_bias=False
                    nn.init.zeros_(m.bias)
        w = self.patch_embed.weight
        nn.init.trunc_normal_(w, std=math.sqrt(1.0 / w[0].numel()))
        nn.init.zeros_(self.head.weight)

    def _pos_embed_for(self, grid: tuple[int, int]) -> torch.Tensor:
        if grid == self.grid:
            return self.pos_embed
        if not isinstance(self.pos_embed, nn.Parameter):  # fixed sinusoid: computed anew
            pe = sinusoidal_2d(*grid, self.cfg.embed_dim).to(self.pos_embed)
            return torch.cat([self.pos_embed[:, : self.num_prefix_tokens], pe[None]], dim=1)
        return resample_pos_embed(
            self.pos_embed, self.grid, grid, self.num_prefix_tokens, self.cfg.pos_embed_antialias
        )

    @torch.no_grad()
    def set_img_size(self, img_size: int | tuple[int, int]) -> None:
        """Resample the position embeddings once for a new default image size."""
        h, w = (img_size, img_size) if isinstance(img_size, int) else img_size
        grid = self._grid_of(h, w)
        pe = self._pos_embed_for(grid).detach().clone()
        if isinstance(self.pos_embed, nn.Parameter):
            self.pos_embed = nn.Parameter(pe)
        else:
            self.register_buffer("pos_embed", pe, persistent=False)
        self.grid = grid
        if h == w:
            self.cfg.img_size = h

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Loading learned position embeddings saved at another (square) image size resamples
        them to this model's grid (bicubic, prefix tokens kept, ``pos_embed_antialias``)."""
        key = prefix + "pos_embed"
        pe = state_dict.get(key)
        if (
            isinstance(self.pos_embed, nn.Parameter)
            and isinstance(pe, torch.Tensor)
            and pe.dim() == 3
            and pe.shape != self.pos_embed.shape
        ):
            n = pe.shape[1] - self.num_prefix_tokens
            side = math.isqrt(n)
            if side * side != n:
                raise ValueError(
                    f"{key}: cannot resample {n} patch embeddings (not a square grid) to "
                    f"{self.grid[0]}x{self.grid[1]}"
                )
            state_dict[key] = resample_pos_embed(
                pe, (side, side), self.grid, self.num_prefix_tokens, self.cfg.pos_embed_antialias
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _grid_of(self, h: int, w: int) -> tuple[int, int]:
        P = self.cfg.patch_size
        if h % P or w % P:
            raise ValueError(
                f"image size {h}x{w} is not a multiple of the patch size {P} "
                f"(this model expects {self.cfg.img_size}x{self.cfg.img_size} by default)"
            )
        return (h // P, w // P)

    def forward_features(self, x: torch.Tensor, return_attention: bool = False):
        check_images(x, self.cfg.in_chans, "vit", self)
        grid = self._grid_of(x.shape[2], x.shape[3])
        if return_attention:  # the maps' size refused before any of them is computed
            t = self.num_prefix_tokens + grid[0] * grid[1]
            shape = (x.shape[0], self.cfg.num_heads, t, t)
            size = x.element_size() if x.is_floating_point() else 4
            where = f"vit on {x.shape[0]} image(s) of {x.shape[2]}x{x.shape[3]}"
            check_attention_maps([shape] * len(self.blocks), size, where)
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, N, D), row-major patches
        tokens = [t for t in (self.cls_token, self.dist_token) if t is not None]
        prefix = [t.expand(x.shape[0], -1, -1) for t in tokens]  # (B, 1, D) each
        x = torch.cat([*prefix, x], dim=1)  # (B, prefix + N, D)
        x = self.pos_drop(x + self._pos_embed_for(grid))
        attns = []
        for blk in self.blocks:
            if return_attention:
                x, a = blk(x, return_attention=True)
                attns.append(AttentionMap(a, grid, self.num_prefix_tokens))  # (B, nh, 1+N, 1+N)
            else:
                x = blk(x)
        x = self.norm(x)
        return (x, attns) if return_attention else x

    def forward_head(self, feats: torch.Tensor) -> torch.Tensor:
        if self.cfg.global_pool == "avg":
            return self.head(self.fc_norm(feats[:, self.num_prefix_tokens :].mean(1)))
        logits = self.head(feats[:, 0])  # class token -> (B, classes)
        if self.head_dist is None:
            return logits
        dist = self.head_dist(feats[:, 1])  # distillation token -> (B, classes)
        if self.distilled_training and self.training:  # DeiT sec. 5: each head its own loss
            return logits, dist
        return (logits + dist) / 2  # DeiT at inference: mean of the two heads

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        if return_attention:
            feats, attns = self.forward_features(x, return_attention=True)
            return self.forward_head(feats), attns
        return self.forward_head(self.forward_features(x))
