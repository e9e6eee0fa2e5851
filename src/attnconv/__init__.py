"""attnconv: self-attention for vision on PyTorch.

Layers are NCHW ``nn.Module``s; ``attnconv.convert`` turns convolutions into attention
(Cordonnier et al., ICLR 2020, Theorem 1); ``create_model`` builds the papers' models.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it (imported lazily so `import attnconv` stays cheap)
_EXPORTS = {
    "MultiHeadSelfAttention2d": "attnconv.layers.mhsa2d",
    "MultiHeadAttention": "attnconv.layers.mha",
    "SinusoidalPositionalEncoding": "attnconv.layers.mha",
    "LocalSelfAttention2d": "attnconv.layers.local",
    "AttentionStem2d": "attnconv.layers.stem",
    "AttentionMap": "attnconv.layers.attention_map",
    "set_backend": "attnconv.layers.checks",
    "create_model": "attnconv.loading",
    "list_models": "attnconv.models",
    "scaled_dot_product_attention": "attnconv.layers.functional",
    # the typed positional encodings (layers/encodings/, one module each)
    "PositionalEncoding": "attnconv.layers.encodings",
    "NoEncoding": "attnconv.layers.encodings",
    "AbsolutePositionalEncoding2d": "attnconv.layers.encodings",
    "QuadraticEncoding": "attnconv.layers.encodings",
    "GeneralizedQuadraticEncoding": "attnconv.layers.encodings",
    "RelativeEncoding": "attnconv.layers.encodings",
    "LearnedRelativeEncoding": "attnconv.layers.encodings",
    # checkpoint loading: its home is this one line
    "load_model": "attnconv.loading",
    # torch.export for inference, one line for what cannot export
    "export_model": "attnconv.exporting",
    "ExportUnsupported": "attnconv.exporting",
    # what ships beside the code: recipes and pretrained weights with cards (torch-free)
    "list_pretrained": "attnconv.catalog",
    "pretrained_info": "attnconv.catalog",
    "list_recipes": "attnconv.catalog",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'attnconv' has no attribute {name!r}")
