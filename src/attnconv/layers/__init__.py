"""Attention layers and positional encodings (NCHW modules) and the functional kernels, in rooms
that import downward only (tests/test_package_graph.py):

- the layers on top: mhsa2d.py (MultiHeadSelfAttention2d), local.py (SASA), stem.py, mha.py,
  feedforward.py, dropout.py, attention_map.py;
- encodings/: the positional encodings, their typed logit terms and the registry of their names;
- kernels/: every attention kernel, and plan.py, the one place that picks each layer's kernel;
- the floor every room uses: functional.py, precision.py, checks.py, first_order.py, scripting.py.
"""

from .functional import attention_probs, scaled_dot_product_attention

__all__ = ["attention_probs", "scaled_dot_product_attention"]
