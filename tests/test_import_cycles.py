"""No import cycles among the ``cabe.*`` modules (module-level imports only).

Every module under ``src/cabe`` is parsed with :mod:`ast`; an edge ``a -> b`` is an ``import`` or
``from ... import`` at module level of ``a`` (also inside module-level ``if`` / ``try`` / ``with``
blocks) that names the ``cabe`` module ``b``. Imports inside functions or classes and under
``if TYPE_CHECKING:`` are not edges: they run after both modules are loaded, or never.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted((SRC / "cabe").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body)
                for h in node.handlers:
                    walk(h.body)
                walk(node.orelse)
                walk(node.finalbody)
            elif isinstance(node, (ast.With, ast.For, ast.While)):
                walk(node.body)

    walk(tree.body)
    return found


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_pkg: bool, modules: dict[str, Path]) -> set[str]:
    """The cabe modules one import statement of module ``name`` loads."""
    out: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in modules:
                out.add(alias.name)
        return out
    base = node.module or ""
    if node.level:
        pkg = name.split(".") if is_pkg else name.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in modules:
            out.add(sub)  # ``from cabe.trace import engine``: the submodule
        elif base in modules:
            out.add(base)  # ``from cabe.trace import TraceResult``: the package itself
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_pkg = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _module_level_imports(tree):
            edges |= _targets(node, name, is_pkg, modules)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_graph_sees_the_package():
    graph = import_graph()
    assert "cabe.trace.engine" in graph and "cabe.trace" in graph
    assert "cabe.trace._native" in graph["cabe.trace"]


def test_find_cycle_reports_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
