"""The one place that maps the string shorthand of a positional encoding (configs, CLI) and its
options to a ``PositionalEncoding`` (absolute.py, gaussian.py, relative.py); the attention
layer only asks the encoding for its typed term (terms.py)."""

from __future__ import annotations

from collections.abc import Callable

from ..checks import positive_int
from .absolute import AbsolutePositionalEncoding2d, NoEncoding
from .base import PositionalEncoding
from .gaussian import GeneralizedQuadraticEncoding, QuadraticEncoding
from .relative import RELATIVE_TERMS, LearnedRelativeEncoding, RelativeEncoding

# name -> (builder, the options it reads): one registry, filled by @register_encoding below
ENCODINGS: dict[str, tuple[Callable[..., PositionalEncoding], frozenset[str]]] = {}
# the options with a default that another encoding must leave as it is (``init_centers_std`` and
# ``init_alpha`` are not among them: a model passes its configuration whole)
DEFAULTS = {
    "hard": False,
    "learned_r": False,
    "relative_terms": RELATIVE_TERMS,
    "rel_dim": None,
    "head_keys": None,
}


def register_encoding(*names: str, options: tuple[str, ...] = ()):
    """Register ``builder(num_heads=, in_channels=, qk_dim=, content=, max_size=, **options,
    name=)`` under ``names`` (the string shorthand of configs and the CLI)."""

    def add(builder):
        for name in names:
            ENCODINGS[name] = (builder, frozenset(options))
        return builder

    return add


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
        positional.check_widths(in_channels=in_channels, qk_dim=qk_dim)
        enc = positional
    else:
        enc = _from_name(
            positional,
            num_heads=num_heads,
            in_channels=in_channels,
            qk_dim=qk_dim,
            content=content,
            max_size=max_size,
            hard=hard,
            init_centers_std=init_centers_std,
            init_alpha=init_alpha,
            relative_terms=relative_terms,
            learned_r=learned_r,
            rel_dim=rel_dim,
            head_keys=head_keys,
        )
    enc.check(content)
    return enc


def _from_name(positional: str, *, num_heads, in_channels, qk_dim, content, max_size, **options):
    if positional not in ENCODINGS:
        raise ValueError(f"positional must be one of {POSITIONALS}, got {positional!r}")
    builder, owned = ENCODINGS[positional]
    options["relative_terms"] = tuple(options["relative_terms"])  # a config's list too
    bad = [t for t in options["relative_terms"] if t not in RELATIVE_TERMS]
    if bad:
        raise ValueError(f"unknown relative_terms {bad}; choose from {RELATIVE_TERMS}")
    for opt, default in DEFAULTS.items():  # an option of another encoding is an error
        if opt not in owned and options[opt] != default:
            owners = [n for n, (_, o) in ENCODINGS.items() if opt in o]
            where = " or ".join(repr(n) for n in owners)
            what = "hard=True is only defined for" if opt == "hard" else f"{opt} only applies to"
            raise ValueError(f"{what} positional={where}")
    if options["rel_dim"] is not None:
        positive_int("rel_dim", options["rel_dim"])
    kept = {k: v for k, v in options.items() if k in owned}
    return builder(
        num_heads=num_heads,
        in_channels=in_channels,
        qk_dim=qk_dim,
        content=content,
        max_size=max_size,
        name=positional,
        **kept,
    )


@register_encoding("none")
def _none(*, num_heads, **_):
    return NoEncoding(num_heads)


@register_encoding("absolute_learned", "absolute_sinusoidal")
def _absolute(*, in_channels, max_size, name, **_):
    return AbsolutePositionalEncoding2d(
        in_channels, learned=name == "absolute_learned", max_size=max_size
    )


@register_encoding("relative", options=("relative_terms", "learned_r", "rel_dim"))
def _relative(*, num_heads, qk_dim, content, max_size, relative_terms, learned_r, rel_dim, **_):
    terms = set(relative_terms) - (set() if content else {"content_content"})
    if not terms:
        raise ValueError("positional='relative' with no term left (relative_terms/content)")
    terms = tuple(t for t in RELATIVE_TERMS if t in terms)
    return RelativeEncoding(
        num_heads, qk_dim, rel_dim or qk_dim, terms, learned=learned_r, max_size=max_size
    )


@register_encoding("relative_learned", options=("rel_dim", "head_keys"))
def _relative_learned(*, num_heads, qk_dim, content, max_size, rel_dim, head_keys, **_):
    return LearnedRelativeEncoding(
        num_heads,
        qk_dim,
        rel_dim or qk_dim,
        content=content,
        head_keys=head_keys,
        max_size=max_size,
    )


@register_encoding("quadratic", options=("hard", "init_centers_std", "init_alpha"))
def _quadratic(*, num_heads, hard, init_centers_std, init_alpha, **_):
    return QuadraticEncoding(
        num_heads, hard=hard, init_centers_std=init_centers_std, init_alpha=init_alpha
    )


@register_encoding("quadratic_generalized", options=("init_centers_std", "init_alpha"))
def _quadratic_generalized(*, num_heads, init_centers_std, init_alpha, **_):
    return GeneralizedQuadraticEncoding(
        num_heads, init_centers_std=init_centers_std, init_alpha=init_alpha
    )


POSITIONALS = tuple(ENCODINGS)  # the names, in registration order
