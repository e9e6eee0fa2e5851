"""attnconv's packages import each other without a cycle, and the arrows run one way:
layers <- models <- loading <- train / commands. Read from the source with ``ast`` (every import,
also those inside functions), at package granularity (``attnconv.models``, ``attnconv.train``,
a top-level module such as ``attnconv.memory``). The root package's lazy exports
(``attnconv.create_model``, looked up by name on first use) are not imports."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LOW = ("attnconv.layers", "attnconv.models")  # build modules only
HIGH = ("attnconv.train", "attnconv.loading", "attnconv.commands", "attnconv.cli")


def _module(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The attnconv modules ``path`` imports (relative imports resolved)."""
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            out |= {name} | {f"{name}.{a.name}" for a in node.names}  # `from . import x`
    return {m for m in out if m == "attnconv" or m.startswith("attnconv.")}


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def package_graph() -> dict[str, set[str]]:
    """package -> the packages it imports (itself left out)."""
    modules = {_module(p) for p in (SRC / "attnconv").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in (SRC / "attnconv").rglob("*.py"):
        src = _package(_module(path))
        graph.setdefault(src, set())
        for m in _imports(path):
            while m not in modules and "." in m:  # `from pkg.mod import name`: the module
                m = m.rsplit(".", 1)[0]
            if _package(m) != src:
                graph[src].add(_package(m))
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path a -> ... -> a, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        path, state[node] = path + [node], 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:  # back on the current path
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt, path)):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [])):
            return found
    return None


def test_the_graph_is_read_from_the_source():
    graph = package_graph()
    assert "attnconv.layers" in graph["attnconv.models"]
    assert "attnconv.models" in graph["attnconv.loading"]
    assert "attnconv.loading" in graph["attnconv.train"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_packages():
    cycle = _cycle(package_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_models_and_layers_never_import_training_or_loading():
    graph = package_graph()
    for low in LOW:
        wrong = sorted(p for p in graph[low] if p.startswith(HIGH))
        assert not wrong, f"{low} imports {', '.join(wrong)}"
    assert "attnconv.models" not in graph["attnconv.layers"]


# the rooms of attnconv.layers, bottom up: a room imports only from the rooms before it
FOUNDATION = {"checks", "first_order", "functional", "precision", "scripting"}
ROOMS = ("foundation", "encodings", "kernels", "layers")


def _room(module: str) -> str:
    """attnconv.layers.<room>: ``encodings``/``kernels`` (the subpackages), ``foundation`` (the
    modules every room uses) or ``layers`` (the layer modules on top)."""
    part = module.split(".")[2] if module.count(".") >= 2 else ""
    if part in ("encodings", "kernels"):
        return part
    return "foundation" if part in FOUNDATION or not part else "layers"


def test_the_layers_rooms_import_downward_only():
    """encodings/ never imports kernels/ or a layer; kernels/ never imports a layer; the
    foundation imports no room (the import graph of attnconv.layers, module by module)."""
    modules = {_module(p) for p in (SRC / "attnconv" / "layers").rglob("*.py")}
    assert {_room(m) for m in modules} == set(ROOMS)
    up = []
    for path in (SRC / "attnconv" / "layers").rglob("*.py"):
        src = _module(path)
        for m in _imports(path):
            while m not in modules and "." in m:
                m = m.rsplit(".", 1)[0]
            if m.startswith("attnconv.layers") and m != "attnconv.layers":
                if ROOMS.index(_room(m)) > ROOMS.index(_room(src)):
                    up.append(f"{src} -> {m}")
    assert not up, "an import up the rooms: " + "; ".join(sorted(up))
