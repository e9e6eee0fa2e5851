"""attnconv's packages import each other without a cycle, and the arrows run one way:
layers <- models <- loading <- train / commands. Read from the source with ``ast`` (every import,
also those inside functions), at package granularity (``attnconv.models``, ``attnconv.train``,
a top-level module such as ``attnconv.memory``), and file by file: no module imports one that
imports it back, however far round. The root package's lazy exports (``attnconv.create_model``,
looked up by name on first use) are not imports."""

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


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle a -> ... -> a per group of nodes that reach each other (every cycle of the
    graph runs inside one such group), so that a report names each tangle once."""
    reach = {node: _reach(graph, node) for node in graph}
    out, done = [], set()
    for node in sorted(graph):
        if node in done or node not in reach[node]:
            continue
        group = {m for m in reach[node] if node in reach.get(m, ())}
        done |= group
        out.append(_cycle({m: graph.get(m, set()) & group for m in group}))
    return out


def _modules() -> set[str]:
    return {_module(p) for p in (SRC / "attnconv").rglob("*.py")}


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The attnconv modules (files) ``path`` imports, at its top and inside its functions:
    ``from P import x`` imports P.x where that is a module, else P; importing P.x also runs
    each package above it, except those above ``path`` itself (already imported before it)."""
    me = _module(path)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    named = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            subs = [f"{name}.{a.name}" for a in node.names]
            named += [sub if sub in modules else name for sub in subs]
    out = set()
    for m in named:
        while m not in modules and "." in m:  # `import pkg.mod.name`: the module
            m = m.rsplit(".", 1)[0]
        if m not in modules:  # torch, yaml, ...
            continue
        parts = m.split(".")
        out |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {m for m in out if m in modules and m != me and not me.startswith(m + ".")}


def module_graph() -> dict[str, set[str]]:
    """module -> the attnconv modules it imports (``_module_imports``), one node per file."""
    modules = _modules()
    return {_module(p): _module_imports(p, modules) for p in (SRC / "attnconv").rglob("*.py")}


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


def test_the_module_graph_is_read_from_the_source():
    graph = module_graph()
    assert len(graph) == len(_modules()) > 100
    # a relative import, and the package it runs first
    assert "attnconv.train.checkpoint" in graph["attnconv.train.loop"]
    assert "attnconv.device" in graph["attnconv.train.distributed"]
    # an import inside a function; `from P import module`; P's __init__ counted, not the root's
    assert "attnconv.device" in graph["attnconv.analysis.inputs"]
    fused, kernels = "attnconv.layers.kernels.fused", "attnconv.layers.kernels"
    assert {fused, kernels, "attnconv.layers"} <= graph["attnconv.device"]
    assert "attnconv" not in graph["attnconv.device"]
    # `from P import name` where name is not a module: P's __init__
    assert "attnconv.layers.kernels" in graph["attnconv.layers.mhsa2d"]
    assert fused not in graph[fused] and kernels not in graph[fused]  # itself, its package
    assert _cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a"}}) == [
        ["a", "b", "a"],
        ["c", "d", "c"],
    ]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
    """No file imports one that imports it back, directly or round several, counting the
    imports inside functions (a cycle a deferred import hides still ties the two files)."""
    cycles = _cycles(module_graph())
    found = "\n".join(" -> ".join(c) for c in cycles)
    assert not cycles, f"import cycles between modules:\n{found}"


def test_models_and_layers_never_import_training_or_loading():
    graph = package_graph()
    for low in LOW:
        wrong = sorted(p for p in graph[low] if p.startswith(HIGH))
        assert not wrong, f"{low} imports {', '.join(wrong)}"
    assert "attnconv.models" not in graph["attnconv.layers"]


# the rooms of attnconv.layers, bottom up: a room imports only from the rooms before it
FOUNDATION = {"checks", "first_order", "functional", "precision", "rows", "scripting"}
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
