"""A kernel table: rows, read first match wins (``choose``; ``explain`` says why each earlier row
was passed over). Each row keeps two questions apart, as NATTEN keeps a backend's capability
apart from the choice among backends:

- ``can_run(case)``: what the kernel can run at all (installed or built, the device, shape and
  shared-memory limits, an export tracing it): None, or why not in one line;
- ``when(case)``: whether the plan picks it where it can run (the layer's ``backend``, the
  measured speed rows).

A row is chosen only where both say so, so the kernel a table names is the one that runs: no
kernel checks again and falls back after being chosen. kernels/plan.py holds the image layers'
tables, functional.py the sequences'.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


def always(case: NamedTuple) -> str | None:
    """``can_run`` of a kernel of plain torch ops: it runs wherever its row matches."""
    return None


class Row(NamedTuple):
    """A row of a table: the kernel's name, the predicate that picks it, and in words the terms
    it takes and when (plan.TABLE's: its docstring's table, tested equal); ``can_run``: what the
    kernel can run (None, or why not, one line)."""

    name: str
    when: Callable[[NamedTuple], bool]  # reads the table's case (plan.Case, tables.LocalCase..)
    term: str
    rule: str
    needs: str = ""  # in plain words, what a layer needs for it (a backend= that cannot run)
    can_run: Callable[[NamedTuple], str | None] = always


def choose(case: NamedTuple, table: tuple[Row, ...]) -> str:
    """The kernel's name for ``case``: the first row of ``table`` that the plan picks and that
    can run it (its choice read first: a capability may cost a compile)."""
    for row in table:  # (a loop, not next() of a generator: torch 2.8's Dynamo breaks there)
        if row.when(case) and row.can_run(case) is None:
            return row.name
    raise AssertionError("the last row of a table matches every case")


def passed_over(row: Row, case: NamedTuple) -> str | None:
    """Why ``row`` does not serve ``case`` (what it needs, or why its kernel cannot run), or
    None when it does."""
    if not row.when(case):
        return f"needs {row.term}: {row.rule}"
    why = row.can_run(case)
    return None if why is None else f"cannot run here: {why}"


def explain(case: NamedTuple, table: tuple[Row, ...]) -> str:
    """Why ``choose(case, table)`` picked its kernel: each earlier row passed over with what it
    needs or why it cannot run, then the one chosen (as NATTEN's backend chooser reports), one
    line each."""
    lines = []
    for row in table:
        why = passed_over(row, case)
        if why is None:
            return "\n".join([*lines, f"chosen: {row.name} ({row.term}: {row.rule})"])
        lines.append(f"passed over: {row.name} ({why})")
    raise AssertionError("the last row of a table matches every case")


# every kernel in plain words, for the warnings of a forced backend (plan.py)
KERNEL_WORDS = {
    "reference": "the plain equations",
    "shift": "the shift kernel (each hard head reads one pixel)",
    "separable_tokens": "the separable kernel on the layer's tokens, its output map summed in",
    "separable": "the separable kernel (a row then a column operator, position only)",
    "shared": "the shared kernel (one attention map for the whole batch, position only)",
    "triton": "the Triton GPU kernel",
    "fused": "the fused C++ CPU kernel",
    "dense_dropout": "the dense kernel with its attention-dropout mask",
    "flex_gaussian": "FlexAttention",
    "flex": "FlexAttention",
    "shared_bias": "the dense kernel with one positional bias for the batch",
    "blocked": "the blocked CPU kernel",
    "blocked_gaussian": "the blocked CPU kernel",
    "fold": "the fold (the positional logits folded into q and k, then PyTorch's fused attention)",
    "window": "the window function",
    "sdpa": "PyTorch's fused scaled_dot_product_attention",
}
