"""Theorem 1 as a tool (Cordonnier et al., ICLR 2020, sec. 3): convolution <-> attention."""

from .geometry import ConvGeometry, conv_geometry, heads_to_kernel, kernel_to_heads, low_rank_heads

__all__ = ["ConvGeometry", "conv_geometry", "heads_to_kernel", "kernel_to_heads", "low_rank_heads"]
