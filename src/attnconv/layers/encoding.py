"""The one place that maps the string shorthand of a positional encoding (configs, CLI) and its
options to a ``PositionalEncoding`` (positional.py, gaussian.py, relative.py); the attention layer
only asks the encoding for its typed term (terms.py)."""

from __future__ import annotations

from .checks import positive_int
from .positional import (
    AbsolutePositionalEncoding2d,
    GeneralizedQuadraticEncoding,
    NoEncoding,
    PositionalEncoding,
    QuadraticEncoding,
)
from .relative import RELATIVE_TERMS, LearnedRelativeEncoding, RelativeEncoding

POSITIONALS = (
    "none",
    "absolute_learned",
    "absolute_sinusoidal",
    "relative",
    "relative_learned",
    "quadratic",
    "quadratic_generalized",
)


def build_encoding(
    positional: str | PositionalEncoding,
    *,
    num_heads: int,
    in_channels: int,
    qk_dim: int,
    content: bool,
    max_size: int = 64,
    hard: bool = False,
    init_centers_std: float = 2.0,
    init_alpha: float = 0.5,
    relative_terms: tuple[str, ...] = RELATIVE_TERMS,
    learned_r: bool = False,
    rel_dim: int | None = None,
    head_keys: bool | None = None,
) -> PositionalEncoding:
    """The encoding named ``positional`` with its options checked (each option belongs to one
    encoding; giving it to another is an error), or ``positional`` itself when it is already a
    ``PositionalEncoding`` (the typed form). The initial values ``init_centers_std`` and
    ``init_alpha`` are the exception: the quadratic encodings read them, the others leave them,
    so a model passes its configuration whole."""
    if isinstance(positional, PositionalEncoding):
        if getattr(positional, "num_heads", num_heads) != num_heads:
            raise ValueError(
                f"the encoding has {positional.num_heads} heads, the layer {num_heads}"
            )
        enc = positional
    else:
        enc = _from_name(positional, num_heads=num_heads, in_channels=in_channels,
                         qk_dim=qk_dim, content=content, max_size=max_size, hard=hard,
                         init_centers_std=init_centers_std, init_alpha=init_alpha,
                         relative_terms=relative_terms, learned_r=learned_r,
                         rel_dim=rel_dim, head_keys=head_keys)  # fmt: skip
    enc.check(content)
    return enc


def _from_name(positional: str, *, num_heads, in_channels, qk_dim, content, max_size, hard,
               init_centers_std, init_alpha, relative_terms, learned_r, rel_dim,
               head_keys):  # fmt: skip
    if positional not in POSITIONALS:
        raise ValueError(f"positional must be one of {POSITIONALS}, got {positional!r}")
    bad = [t for t in relative_terms if t not in RELATIVE_TERMS]
    if bad:
        raise ValueError(f"unknown relative_terms {bad}; choose from {RELATIVE_TERMS}")
    if hard and positional != "quadratic":
        raise ValueError("hard=True is only defined for positional='quadratic'")
    if learned_r and positional != "relative":
        raise ValueError("learned_r only applies to positional='relative'")
    if tuple(relative_terms) != RELATIVE_TERMS and positional != "relative":
        raise ValueError("relative_terms only applies to positional='relative'")
    if rel_dim is not None and positional not in ("relative", "relative_learned"):
        raise ValueError("rel_dim only applies to positional='relative' or 'relative_learned'")
    if rel_dim is not None:
        positive_int("rel_dim", rel_dim)
    if head_keys is not None and positional != "relative_learned":
        raise ValueError("head_keys only applies to positional='relative_learned'")
    if positional == "none":
        return NoEncoding(num_heads)
    if positional.startswith("absolute"):
        learned = positional == "absolute_learned"
        return AbsolutePositionalEncoding2d(in_channels, learned=learned, max_size=max_size)
    if positional == "relative":
        terms = set(relative_terms) - (set() if content else {"content_content"})
        if not terms:
            raise ValueError("positional='relative' with no term left (relative_terms/content)")
        terms = tuple(t for t in RELATIVE_TERMS if t in terms)
        return RelativeEncoding(num_heads, qk_dim, rel_dim or qk_dim, terms, learned=learned_r,
                                max_size=max_size)  # fmt: skip
    if positional == "relative_learned":
        return LearnedRelativeEncoding(num_heads, qk_dim, rel_dim or qk_dim, content=content,
                                       head_keys=head_keys, max_size=max_size)  # fmt: skip
    if positional == "quadratic":
        return QuadraticEncoding(num_heads, hard=hard, init_centers_std=init_centers_std,
                                 init_alpha=init_alpha)  # fmt: skip
    return GeneralizedQuadraticEncoding(num_heads, init_centers_std=init_centers_std)
