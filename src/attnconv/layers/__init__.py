"""Attention layers and positional encodings (NCHW modules) and the functional kernels."""

from .functional import attention_probs, scaled_dot_product_attention

__all__ = ["attention_probs", "scaled_dot_product_attention"]
