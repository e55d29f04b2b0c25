"""Which code a journey runs, and one digest of it, so evidence can be tied to the code.

A journey's code is every ``.py`` file in its folder plus every module of this repository
(``cortex_recipes.*``, ``recipes.*``) that those files import, directly or through each
other, found by reading the imports (``ast``), not from a hand-kept list. Imports inside
functions count too: a journey's lazily imported path is still its code, and so does a string
that names a repository module (how the local backend starts its server and workers with
``python -m``). Packages that are
imported bring their ``__init__.py``; a relative import resolves against the importing
module's package.

``code_digest`` hashes the sorted (path, file digest) pairs: any edit to any of those files,
a file added to the journey folder, or a new import of another repository module changes it.
"""

from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path

LOCAL_TOPS = ("cortex_recipes", "recipes")
MODULE_STRING = re.compile(r"(?:cortex_recipes|recipes)(?:\.\w+)+")


def _library_base(root: Path) -> Path:
    """The ``cortex_recipes`` library a digest of ``root`` reads: ``root/src`` when ``root`` is a
    checkout holding it (the repository asked about, not necessarily the one imported from),
    else where ``cortex_recipes`` is imported from (site-packages in an image, which has no
    ``src/``). Its files are named ``src/cortex_recipes/...`` either way, so a checkout and an
    image of one commit give one digest."""
    local = Path(root).resolve() / "src"
    if (local / "cortex_recipes" / "__init__.py").is_file():
        return local
    import cortex_recipes

    return Path(cortex_recipes.__file__).resolve().parent.parent


def _module_path(root: Path, module: str) -> Path | None:
    parts = module.split(".")
    base = _library_base(root) if parts[0] == "cortex_recipes" else root
    candidate = base.joinpath(*parts)
    if candidate.with_suffix(".py").is_file():
        return candidate.with_suffix(".py")
    if (candidate / "__init__.py").is_file():
        return candidate / "__init__.py"
    return None


def _display(root: Path, path: Path) -> str:
    """The path a file is hashed under: repository-relative, the library under ``src/``."""
    library = _library_base(root)
    if path.is_relative_to(library):
        return "src/" + path.relative_to(library).as_posix()
    return path.relative_to(root).as_posix()


def _module_name(root: Path, path: Path) -> str:
    relative = Path(_display(root, path))
    if relative.parts[0] == "src":
        relative = relative.relative_to("src")
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, module: str) -> set[str]:
    """Absolute names of every module ``path`` imports (and the ``from`` names' candidates)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # submodules
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and MODULE_STRING.fullmatch(node.value)  # started as ``python -m <module>``
        ):
            found.add(node.value)
    return {name for name in found if name.split(".")[0] in LOCAL_TOPS}


def code_files(root: Path, folder: Path) -> list[Path]:
    """The journey folder's Python files and the repository modules they reach."""
    root, folder = Path(root).resolve(), (Path(root) / folder).resolve()
    todo = sorted(folder.rglob("*.py"))
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        module = _module_name(root, path)
        parents = module.split(".")
        for depth in range(1, len(parents)):  # importing a.b.c runs a/__init__ and a/b/__init__
            init = _module_path(root, ".".join(parents[:depth]))
            if init is not None and init not in seen:
                todo.append(init)
        for name in _imports(path, module):
            found = _module_path(root, name)
            if found is not None and found not in seen:
                todo.append(found)
    return sorted(seen)


def code_digest(root: Path, folder: Path) -> str:
    """sha256 over the sorted (repository path, file sha256) of :func:`code_files`."""
    root = Path(root).resolve()
    digest = hashlib.sha256()
    for path in sorted(code_files(root, folder), key=lambda p: _display(root, p)):
        digest.update(_display(root, path).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return digest.hexdigest()
