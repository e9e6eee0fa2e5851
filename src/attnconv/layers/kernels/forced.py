"""A layer's forced ``backend`` that does not run, said in one plain line (plan.py's tables):
what the asked kernel needs or why it cannot run here, and what the layer has, or the kernel
the table puts first for it; the result is the same, the kernel not the one asked for."""

from __future__ import annotations

from typing import NamedTuple

from ...warn import warn
from ..encodings.terms import AxisTerm, FoldTerm, GaussianTerm, NoTerm, ShiftTerm, Term
from ..first_order import transforms_active
from ..rows import KERNEL_WORDS, Row

# backend="fold" is "no blocked kernel": the shared bias still serves fixed logits in inference
_ALSO_FORCED = {("fold", "shared_bias")}


TERM_WORDS = {
    AxisTerm: "row and column logits",
    GaussianTerm: "Gaussian logits (a quadratic encoding)",
    ShiftTerm: "one-pixel hard heads",
    FoldTerm: "logits folded into q and k",
    NoTerm: "no positional logits",
}


def term_words(term: Term) -> str:
    """What a layer's positional term is, in words (for the warnings)."""
    for kind, words in TERM_WORDS.items():  # (a loop: torch 2.8's Dynamo takes no next() default)
        if isinstance(term, kind):
            return words
    return type(term).__name__


def warn_if_passed_over(
    case: NamedTuple, chosen: str, table: tuple[Row, ...], have: str = ""
) -> None:
    """One warning line, in plain words, when the ``backend`` of ``case`` names a kernel of
    ``table`` that does not run (``chosen`` does: a correct result, not the kernel asked for;
    "flex_gaussian" is "flex"'s, "blocked_gaussian" "blocked"'s): why it cannot run, what it
    needs that the layer lacks (``have``: what the layer has), or the kernel the table puts
    first for it. Inside a torch.func transform every layer runs plain torch ops whatever its
    backend: nothing to say."""
    backend = case.backend
    row = None
    for r in table:  # (a loop: torch 2.8's Dynamo takes no default in next() of a generator)
        row = r if r.name == backend else row
    if row is None or chosen.startswith(backend) or (backend, chosen) in _ALSO_FORCED:
        return
    if transforms_active():
        return
    asked, runs = KERNEL_WORDS.get(backend, backend), KERNEL_WORDS.get(chosen, chosen)
    names = [r.name for r in table]
    if names.index(chosen) < names.index(backend):  # an earlier row serves the layer first
        why = f"{runs} serves this layer before {asked} would" + (f" ({have})" if have else "")
    else:
        cannot = row.can_run(case) if row.when(case) else None
        lacks = f"cannot run here: {cannot}" if cannot else f"needs {row.needs or row.term}"
        why = f"{asked} {lacks}" + (f", and {have}" if have and not cannot else "")
        why += f"; {runs} runs instead"
    warn(f"attnconv: backend={backend!r} does not run here: {why}, with the same results")
