"""Attention maps of a converted CNN (``attnconv convert``, Theorem 1), in the analysis contract.

A converted network's layers are ``ConvAttention2d`` modules: position-only quadratic attention
over the *padded* input of each convolution. ``ConvertedAttentionView(model)`` runs the model
and returns, per converted layer (input -> output order), an ``AttentionMap`` of the attention
of every query pixel of that layer's input over the input's pixels: the (1, Nh, Hp*Wp, Hp*Wp)
probabilities of the layer cropped to the unpadded image, queries and keys alike
((1, Nh, h*w, h*w) on the layer's h x w grid; a head whose key falls in the padding has an empty
row there). Hard heads give one-hot maps on the kernel's grid. ``attention_grid`` is the input
image's size; ``layer_names`` are the converted modules' names. Maps that cannot fit in memory
are refused in one line (the size needed and the bound) before the first of them is computed.

A model with attention maps of its own (a ViT whose patch embedding was converted) keeps them:
the converted patch embedding's map comes first (it makes the tokens), then the model's own
maps, each on its own grid ("layer 1", ...). Converted convolutions elsewhere in such a model
(between its attention layers) have no known place in depth among its maps: the converted
layers' maps alone then, as for a CNN.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn as nn

from attnconv.convert import ConvAttention2d, converted_layers
from attnconv.layers.attention_map import AttentionMap
from attnconv.memory import check_attention_maps


class ConvertedAttentionView(nn.Module):
    """``forward(x, return_attention=True) -> (logits, maps)`` for a converted network."""

    num_prefix_tokens = 0

    def __init__(self, model: nn.Module, image_size: tuple[int, int] = (32, 32)):
        super().__init__()
        self.model = model
        named = [(n, m) for n, m in converted_layers(model) if m.geometry.ndim == 2]
        self.named = named
        self.layers = [m for _, m in named]
        self.layer_names = [n for n, _ in named]  # module names label the layers (maps.layer_names)
        if not self.layers:
            raise ValueError(f"{type(model).__name__} has no converted 2-D convolution")
        self.attention_grid = tuple(image_size)
        # a model's own maps ([] for a CNN) are kept when its patch embedding is the only
        # converted layer: it runs before every attention layer. Converted convolutions elsewhere
        # have no known place in depth among its maps: the converted layers alone then.
        embed = getattr(model, "patch_embed", None)
        returns_maps = "return_attention" in inspect.signature(model.forward).parameters
        self.own = returns_maps and all(m is embed for m in self.layers)
        grid = getattr(model, "attention_grid", None)
        if self.own and grid is not None:  # the model's token grid: the position-embedding figure
            self.position_tokens = (tuple(grid), int(getattr(model, "num_prefix_tokens", 0)))

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        sizes: dict[int, tuple[int, int]] = {}
        hooks = [
            m.register_forward_pre_hook(lambda mod, a: sizes.__setitem__(id(mod), a[0].shape[-2:]))
            for m in self.layers
        ]
        try:
            out = self.model(x, return_attention=True) if self.own else self.model(x)
        finally:
            for h in hooks:
                h.remove()
        own: list = []  # the model's own AttentionMaps
        if self.own and isinstance(out, tuple) and len(out) == 2:
            out, own = out
        if not return_attention:
            return out
        ran = [(n, m) for n, m in self.named if id(m) in sizes]
        check_maps(x, [(m, *sizes[id(m)]) for _, m in ran])
        conv = [
            AttentionMap(
                layer_maps(m, *sizes[id(m)]), sizes[id(m)], 0, output_queries(m, *sizes[id(m)])
            )
            for _, m in ran
        ]
        if own:  # converted layers' names, then the model's own ("layer 1", ...)
            self.layer_names = [n for n, _ in ran] + [f"layer {i + 1}" for i in range(len(own))]
        return out, conv + list(own)


def check_maps(x: torch.Tensor, layers: list[tuple[ConvAttention2d, int, int]]) -> None:
    """The converted layers' maps (1, Nh, h*w, h*w) on their h x w inputs, each computed over
    the padded input first: one line before any is computed when they cannot fit in memory."""
    kept, padded = [], []
    for m, h, w in layers:
        nh, (hp, wp) = m.attention.num_heads, m.geometry.padded_size(h, w)
        kept.append((1, nh, h * w, h * w))
        padded.append((1, nh, hp * wp, hp * wp))
    if kept:
        size = max(4, next(layers[0][0].attention.out_proj.parameters()).element_size())
        where = f"the converted layers on {x.shape[0]} image(s) of {x.shape[-2]}x{x.shape[-1]}"
        check_attention_maps(kept, size, where, computing=padded)


@torch.no_grad()
def layer_maps(module: ConvAttention2d, h: int, w: int) -> torch.Tensor:
    """(1, Nh, h*w, h*w): the layer's attention over its padded h x w input, cropped to it."""
    g, attn = module.geometry, module.attention
    left, _, top, _ = g.pad_for(h, w)
    hp, wp = g.padded_size(h, w)
    dt, dev = attn.out_proj.weight.dtype, attn.out_proj.weight.device
    probs = attn.attention_probs(torch.zeros(1, g.in_channels, hp, wp, dtype=dt, device=dev))
    nh = probs.shape[1]
    p = probs.reshape(nh, hp, wp, hp, wp)[:, top : top + h, left : left + w]
    p = p[:, :, :, top : top + h, left : left + w]  # (Nh, h, w, h, w)
    return p.reshape(1, nh, h * w, h * w)


def output_queries(module: ConvAttention2d, h: int, w: int) -> torch.Tensor:
    """(h*w,) bool: the pixels of the h x w input that are the convolution's output queries,
    the ones geometry.crop keeps of the padded image (anchor + o * stride); a strided or
    unpadded conv's other queries read pixels the conv never combines (clamped at the border,
    or between strides)."""
    g = module.geometry
    left, _, top, _ = g.pad_for(h, w)
    hp, wp = g.padded_size(h, w)
    at = g.crop(torch.arange(hp * wp).view(1, 1, hp, wp), h, w).reshape(-1)  # padded indices
    r, c = at // wp - top, at % wp - left  # on the unpadded input
    inside = (r >= 0) & (r < h) & (c >= 0) & (c < w)  # an output query in the padding: no pixel
    queries = torch.zeros(h * w, dtype=torch.bool)
    queries[(r * w + c)[inside]] = True
    return queries
