"""No import cycles among the ``cabe.*`` modules, as a reader of the imports would see them, and none even counting
the imports made inside functions; and every module that still imports inside a function says why.

Every module under ``src/cabe`` is parsed with :mod:`ast`; an edge ``a -> b`` is an ``import`` or
``from ... import`` of ``a`` that names the ``cabe`` module ``b``: at module level (also inside module-level
``if`` / ``try`` / ``with`` blocks, ``if TYPE_CHECKING:`` included: a reader sees the arrow), and in the second
graph anywhere in the file (inside functions too).
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


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, ast.If):
                walk(node.body)  # ``if TYPE_CHECKING:`` too: the arrow is there for a reader
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


def _all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def import_graph(everywhere: bool = False) -> dict[str, set[str]]:
    """The modules' imports: at module level, or (``everywhere``) inside functions too."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_pkg = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _all_imports(tree) if everywhere else _module_level_imports(tree):
            edges |= _targets(node, name, is_pkg, modules)
        edges.discard(name)
        graph[name] = edges
    return graph


def lazy_importers() -> set[str]:
    """The modules that import a cabe module inside a function."""
    modules = _modules()
    out: set[str] = set()
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        top = {id(node) for node in _module_level_imports(tree)}
        is_pkg = path.name == "__init__.py"
        if any(id(n) not in top and _targets(n, name, is_pkg, modules) for n in _all_imports(tree)):
            out.add(name)
    return out


#: Why a module still imports cabe modules inside functions (a key ``x.*`` covers the package ``x`` and its modules). Each
#: of them would be free of circles at module level too (``test_no_cycles_even_inside_functions``): the reasons
#: are time and optional dependencies, never a circle.
LAZY_REASONS = {
    "cabe": "every ``cabe.*`` import runs this file first: the estimate's modules load on the first call, not for "
    "``cabe --help``",
    "cabe.cli.*": "the command line answers in under 0.3 s (benchmarks/speed.py): each command loads what it runs",
    "cabe.trace.*": "torch, transformers, peft and bitsandbytes load only when a trace runs (the trace extra)",
    "cabe.via_trace": "the trace (torch) loads only for an architecture no family module reads",
    "cabe.integrations.transformers": "a Trainer callback in the user's script: cabe's estimate loads when it fires",
    "cabe.families.mistral3": "cabe.families loads each family module by name (importlib): a module-level import "
    "back would run while that registry is half built",
}


def _covered(module: str) -> str | None:
    for key in LAZY_REASONS:
        if module == key or (key.endswith(".*") and (module == key[:-2] or module.startswith(key[:-1]))):
            return key
    return None


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


def test_no_cycles_even_inside_functions():
    cycle = find_cycle(import_graph(everywhere=True))
    assert cycle is None, "import cycle through a function-level import: " + " -> ".join(cycle or [])


def test_every_lazy_import_has_its_reason():
    lazy = lazy_importers()
    assert "cabe.cli.estimate" in lazy  # the graph sees function-level imports
    unexplained = sorted(m for m in lazy if _covered(m) is None)
    assert not unexplained, f"imports inside functions without a reason in LAZY_REASONS: {unexplained}"
    stale = sorted(k for k in LAZY_REASONS if not any(_covered(m) == k for m in lazy))
    assert not stale, f"LAZY_REASONS names modules that import nothing lazily: {stale}"
