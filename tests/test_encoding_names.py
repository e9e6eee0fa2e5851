"""Issue 29: no string comparison on positional-encoding names outside the factories. The
layers and models read the type (or a property) of the encoding they built; only the factories
turn a name into an encoding: ``layers/encodings/registry.py`` (Dai's eq. 8 vocabulary, the global
layers), ``models/vit.py``'s constructor (its own ``pos_embed``); ``layers/local.py``'s
``SasaPositional.from_name`` (SASA's) looks its name up in a table. Read from the source with
``ast``, every file of the package (the benchmarks too)."""

from __future__ import annotations

import ast
from pathlib import Path

from attnconv.layers.encodings import POSITIONALS
from attnconv.layers.local import SASA_POSITIONALS
from attnconv.models.vit import POS_EMBEDS

SRC = Path(__file__).resolve().parents[1] / "src" / "attnconv"
NAMES = set(POSITIONALS) | set(SASA_POSITIONALS) | set(POS_EMBEDS)
# file -> the one function there that may compare names (None: the whole file)
FACTORIES = {"layers/encodings/registry.py": None, "models/vit.py": "__init__"}
SUBJECTS = ("positional", "pos_embed")  # what an encoding's name is called


def _names_an_encoding(node: ast.expr) -> bool:
    text = ast.unparse(node)
    return any(s in text for s in SUBJECTS)


class _Scan(ast.NodeVisitor):
    """(line, innermost function) of every comparison of a ``positional`` / ``pos_embed``
    expression with an encoding name, and of every ``.startswith`` on one."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self.where = ["<module>"]

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.where.append(node.name)
        self.generic_visit(node)
        self.where.pop()

    def visit_Compare(self, node: ast.Compare) -> None:
        sides = [node.left, *node.comparators]
        consts = [c for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant)]
        if any(c.value in NAMES for c in consts) and any(map(_names_an_encoding, sides)):
            self.found.append((node.lineno, self.where[-1]))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "startswith" and _names_an_encoding(f.value):
            self.found.append((node.lineno, self.where[-1]))
        self.generic_visit(node)


def _string_uses(tree: ast.AST) -> list[tuple[int, str]]:
    scan = _Scan()
    scan.visit(tree)
    return scan.found


def test_no_string_comparison_on_encoding_names_outside_the_factories():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        uses = set(_string_uses(ast.parse(path.read_text())))
        if rel in FACTORIES:
            allowed = FACTORIES[rel]
            uses = {(line, fn) for line, fn in uses if allowed is not None and fn != allowed}
        found += [f"{rel}:{line} ({fn})" for line, fn in sorted(uses)]
    assert not found, f"encoding names compared as strings outside the factories: {found}"


def test_the_scan_sees_a_comparison():
    src = 'def f(cfg):\n    if cfg.positional == "quadratic":\n        pass\n'
    assert _string_uses(ast.parse(src)) == [(2, "f")]
    assert _string_uses(ast.parse('x = cfg.positional.startswith("rel")\n')) == [(1, "<module>")]
    assert _string_uses(ast.parse('y = norm == "none"\n')) == []
