"""docs/development.md stays true: the kernels its recipe lists are the plan's table, in order,
and each has its entry in KERNELS; its layout names only paths that exist, and every module of
src/attnconv (every package, and every source file: .py, .cpp, .h, .html) has its line."""

from __future__ import annotations

import re
from pathlib import Path

from attnconv.layers.kernels import KERNELS, plan

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "development.md"
SOURCES = (".py", ".cpp", ".h", ".html")


def layout() -> tuple[list[Path], list[Path]]:
    """(folders, files) the layout block names: a line at the margin names its first word (a
    folder ends in /; a line of folders only, `benchmarks/ tests/`, names each), an indented
    line's first word is a file of the folder above it."""
    block = re.search(r"## Layout\n\n```\n(.*?)\n```", PAGE.read_text(), re.S)
    assert block, "docs/development.md lost its layout block"
    folders, files, folder = [], [], None
    for line in block.group(1).splitlines():
        words = line.split()
        if not words:
            continue
        if not line[0].isspace():
            named = words if all(w.endswith("/") for w in words) else words[:1]
            for w in named:
                (folders if w.endswith("/") else files).append(ROOT / w)
            folder = ROOT / words[0] if words[0].endswith("/") else None
        else:
            assert folder is not None, f"an indented line under no folder: {line!r}"
            files.append(folder / words[0])
    return folders, files


def test_the_layout_names_only_what_exists():
    folders, files = layout()
    assert len(folders) >= 10 and len(files) >= 100
    for p in folders:
        assert p.is_dir(), f"the layout names {p.relative_to(ROOT)}/, which is not a folder"
    for p in files:
        assert p.is_file(), f"the layout names {p.relative_to(ROOT)}, which does not exist"
    text = PAGE.read_text()
    for suite in re.findall(r"--suite ([\w|]+)", text.split("## Layout")[1])[0].split("|"):
        assert (ROOT / "src" / "attnconv" / "bench" / f"{suite}.py").is_file(), suite


def test_the_layout_names_every_module():
    folders, files = layout()
    src = ROOT / "src" / "attnconv"
    modules = {
        p
        for p in src.rglob("*")
        if p.suffix in SOURCES and p.name != "__init__.py" and "__pycache__" not in p.parts
    }
    packages = {p.parent for p in src.rglob("__init__.py")}
    unnamed = sorted(
        str(p.relative_to(ROOT)) for p in (modules - set(files)) | (packages - set(folders))
    )
    assert not unnamed, "docs/development.md's layout has no line for: " + ", ".join(unnamed)


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
