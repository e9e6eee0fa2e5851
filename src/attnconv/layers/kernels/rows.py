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
