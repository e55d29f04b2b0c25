"""A journey's entry point and qualify module, checked without importing them: they resolve
to repository files, parse, guard their work with ``if __name__ == "__main__":``, run no
statement at import beyond definitions and assignments, and import only repository modules
that exist and installed packages."""

from __future__ import annotations

import ast
import importlib.util
import logging
from pathlib import Path

from cortex_recipes.provenance import source_file

log = logging.getLogger(__name__)


def _module_file(root: Path, module: str) -> Path | None:
    for base in (root, root / "src"):
        found = source_file(base, module)
        if found is not None:
            return found
    return None


def _is_local_package(root: Path, top: str) -> bool:
    return any(
        (base / top).is_dir() or (base / f"{top}.py").is_file() for base in (root, root / "src")
    )


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    sides = [node.test.left, *node.test.comparators]
    names = {s.id for s in sides if isinstance(s, ast.Name)}
    values = {s.value for s in sides if isinstance(s, ast.Constant)}
    return names == {"__name__"} and values == {"__main__"}


_DEFINITIONS = (
    ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
    ast.AnnAssign, ast.Pass,
)  # fmt: skip


def check_module(root: Path, module: str, label: str) -> list[str]:
    """A ``python -m`` module that exists, parses, and does nothing when imported."""
    path = _module_file(root, module)
    if path is None:
        return [f"{label}={module!r} is not importable: no module file in the repository"]
    where = path.relative_to(root).as_posix()
    try:
        tree = ast.parse(path.read_text(), filename=where)
    except SyntaxError as exc:
        return [f"{where}: {label}={module!r} does not parse: {exc.msg} (line {exc.lineno})"]
    problems = []
    if not any(_is_main_guard(node) for node in tree.body):
        problems.append(f'{where}: has no `if __name__ == "__main__":` guard')
    for i, node in enumerate(tree.body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if docstring or _is_main_guard(node) or isinstance(node, _DEFINITIONS):
            continue
        if isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, import fallbacks
            continue
        problems.append(
            f"{where}: line {node.lineno} runs {type(node).__name__} at import; "
            "importing the entry point must not run anything"
        )
    for node in tree.body:
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            problems += _import_problems(root, where, name)
    return problems


def _import_problems(root: Path, where: str, module: str) -> list[str]:
    top = module.split(".")[0]
    if _is_local_package(root, top):
        if _module_file(root, module) is None:
            return [f"{where}: imports {module!r}, which is not a module in the repository"]
        return []
    if importlib.util.find_spec(top) is None:
        return [f"{where}: imports {module!r}, but package {top!r} is not installed"]
    return []
