"""The positional encodings of an image attention layer, one module each, and their registry.

- base.py: what every encoding gives the layer (``PositionalEncoding``), and the pixel grid;
- terms.py: the typed positional term of the logits (axis, fold, Gaussian, shift, none);
- absolute.py (eq. 7), relative.py (eq. 8, sec. 4.3), gaussian.py (eq. 9), sinusoidal.py;
- registry.py: the string names of configs and the CLI (``@register_encoding``);
- upgrade.py: old checkpoints' renamed parameters; centers.py: a model's Gaussian centres.
"""

from .absolute import AbsolutePositionalEncoding2d, NoEncoding
from .base import PositionalEncoding
from .gaussian import GeneralizedQuadraticEncoding, QuadraticEncoding
from .registry import ENCODINGS, POSITIONALS, build_encoding, register_encoding
from .relative import LearnedRelativeEncoding, RelativeEncoding

__all__ = [
    "ENCODINGS",
    "POSITIONALS",
    "AbsolutePositionalEncoding2d",
    "GeneralizedQuadraticEncoding",
    "LearnedRelativeEncoding",
    "NoEncoding",
    "PositionalEncoding",
    "QuadraticEncoding",
    "RelativeEncoding",
    "build_encoding",
    "register_encoding",
]
