"""Theorem 1 as a tool (Cordonnier et al., ICLR 2020, sec. 3): convolution <-> attention.

``conv_to_attention(conv)`` (nn.Conv1d/nn.Conv2d -> ConvAttention1d/2d), ``attention_to_conv``
(the reverse), ``mhsa_to_conv`` (a bare hard MultiHeadSelfAttention2d -> nn.Conv2d) and
``convert_model(model)`` (every convolution of a model, each checked against its own forward;
``register_conv_rule`` for convolution subclasses that tracing cannot read: rules.py).
"""

from .geometry import ConvGeometry, conv_geometry, heads_to_kernel, kernel_to_heads, low_rank_heads
from .inverse import attention_to_conv, mhsa_to_conv
from .model import convert_model, converted_layers, unconverted_layers
from .modules import ConvAttention, ConvAttention1d, ConvAttention2d, conv_to_attention
from .rules import CONV_RULES, ConvSpec, UnsupportedConv, conv_spec, register_conv_rule

__all__ = [
    "CONV_RULES",
    "ConvSpec",
    "UnsupportedConv",
    "conv_spec",
    "register_conv_rule",
    "unconverted_layers",
    "ConvAttention",
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
