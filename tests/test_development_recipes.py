"""docs/development.md's recipes stay true: the kernels it lists are the plan's table, in order,
and each has its entry in KERNELS."""

from __future__ import annotations

import re
from pathlib import Path

from attnconv.layers.kernels import KERNELS, plan

PAGE = Path(__file__).resolve().parents[1] / "docs" / "development.md"


def test_the_recipe_lists_the_plans_kernels_in_order():
    text = PAGE.read_text()
    block = re.search(r"<!-- kernels:begin -->\n(.*?)\n<!-- kernels:end -->", text, re.S)
    assert block, "docs/development.md lost its kernels block"
    listed = [k.strip() for k in block.group(1).replace("\n", " ").split(",")]
    assert listed == [row.name for row in plan.TABLE]
    assert set(listed) == set(KERNELS)


def _docstring_rows() -> list[tuple[str, str, str]]:
    """(kernel, term, when) of plan.py's docstring table, continuation lines joined."""
    rows = []
    for line in plan.__doc__.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or cells[0] == "kernel" or set(cells[0]) == {"-"}:
            continue
        if cells[0]:
            rows.append(list(cells))
        else:  # a continuation of the row above
            rows[-1] = [a if not b else f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
    return [tuple(r) for r in rows]


def test_the_plans_docstring_table_is_its_table():
    assert _docstring_rows() == [(r.name, r.term, r.rule) for r in plan.TABLE]


def test_the_plan_says_why_each_earlier_row_was_passed_over():
    import torch

    from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d

    lay = MultiHeadSelfAttention2d(8, 8, num_heads=2, positional="relative_learned").eval()
    x = torch.randn(1, 8, 4, 4)
    with torch.no_grad():
        chosen = lay.kernel(x)
        why = lay.kernel(x, why=True).splitlines()
    names = [r.name for r in plan.TABLE]
    assert why[-1].startswith(f"chosen: {chosen} (")
    assert [w.split()[2] for w in why[:-1]] == names[: names.index(chosen)]
    assert all(w.startswith("passed over: ") and "needs" in w for w in why[:-1])
