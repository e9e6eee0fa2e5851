"""A kernel table's row: plan.py's and tables.py's tables are tuples of them, read first match
wins (plan.choose, plan.explain)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class Row(NamedTuple):
    """A row of a table: the kernel's name, the predicate that picks it, and in words the terms
    it takes and when (plan.TABLE's: its docstring's table, tested equal)."""

    name: str
    when: Callable[[NamedTuple], bool]  # reads the table's case (plan.Case, tables.LocalCase..)
    term: str
    rule: str
    needs: str = ""  # in plain words, what a layer needs for it (a backend= that cannot run)


# every kernel in plain words, for the warnings of a forced backend (plan.py, content.py)
KERNEL_WORDS = {
    "reference": "the plain equations",
    "shift": "the shift kernel (each hard head reads one pixel)",
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
}
