"""The library's layering, read from its imports (``ast``; imports inside functions and under
``TYPE_CHECKING`` count: a lazy import is still a dependency):

- ``src/cortex_recipes`` never imports ``recipes``: journeys use the library, never the reverse;
- no import circle among the library's modules;
- no library module over 500 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[2] / "src"


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imported_names(path: Path, module: str) -> set[str]:
    """Every dotted name ``path`` imports, relative imports resolved; ``from a import b``
    gives ``a.b`` (a submodule or a name in ``a``) and ``a``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def library_edges() -> dict[str, set[str]]:
    """module -> the library modules it imports (a name resolves to its longest module
    prefix; importing a package's submodule is not an import of the package's own code
    beyond what Python runs anyway, so ``from a import sub`` counts as ``a.sub`` only)."""
    mods = modules()
    edges: dict[str, set[str]] = {}
    for module, path in mods.items():
        targets = set()
        names = imported_names(path, module)
        for name in names:
            if not name.startswith("cortex_recipes"):
                continue
            if any(other.startswith(name + ".") and other in mods for other in names):
                continue  # `from pkg import submodule`: the submodule is the edge
            while name not in mods:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        edges[module] = targets
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_library_never_imports_the_recipes():
    offenders = {
        module: sorted(n for n in imported_names(path, module) if n.split(".")[0] == "recipes")
        for module, path in modules().items()
    }
    assert {m: n for m, n in offenders.items() if n} == {}


def test_the_library_has_no_import_circle():
    assert cycles(library_edges()) == []


def test_the_circle_finder_finds_a_circle_and_its_members():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


MAX_MODULE_LINES = 500


def test_no_library_module_is_over_500_lines():
    """A module that grows past this does several jobs; split it by what each part is."""
    long = {
        str(path.relative_to(SRC)): n
        for path in SRC.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}
