"""Theorem 1 as a tool (Cordonnier et al., ICLR 2020, sec. 3): convolution <-> attention.

``conv_to_attention(conv)`` (nn.Conv1d/nn.Conv2d -> ConvAttention1d/2d), ``attention_to_conv``
(the reverse), ``mhsa_to_conv`` (a bare hard MultiHeadSelfAttention2d -> nn.Conv2d) and
``convert_model(model)`` (every convolution of a model).
"""

from .geometry import ConvGeometry, conv_geometry, heads_to_kernel, kernel_to_heads, low_rank_heads
from .modules import (
    ConvAttention1d,
    ConvAttention2d,
    attention_to_conv,
    conv_to_attention,
    convert_model,
    converted_layers,
    mhsa_to_conv,
)

__all__ = [
    "ConvAttention1d",
    "ConvAttention2d",
    "ConvGeometry",
    "attention_to_conv",
    "conv_geometry",
    "conv_to_attention",
    "convert_model",
    "converted_layers",
    "heads_to_kernel",
    "kernel_to_heads",
    "low_rank_heads",
    "mhsa_to_conv",
]
