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
    assert listed == [name for name, _ in plan.TABLE]
    assert set(listed) == set(KERNELS)
