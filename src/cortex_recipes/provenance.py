"""Which code a journey runs, and one digest of it, so evidence can be tied to the code.

A journey's code is every ``.py`` file in its folder plus every module of this repository
(``cortex_recipes.*``, ``recipes.*``) that those files import, directly or through each
other, found by reading the imports (``ast``), not from a hand-kept list. Imports inside
functions count too: a journey's lazily imported path is still its code, and so does a string
that names a repository module (how the local backend starts its server and workers with
``python -m``). Packages that are
imported bring their ``__init__.py``; a relative import resolves against the importing
module's package.

``code_digest`` hashes the sorted (path, file digest) pairs, where a file's digest is taken
over its code, not its text (:func:`code_form`): the syntax tree with comments, docstrings and
layout gone. A tidy-up (a comment, a docstring, a reflowed line, quotes, parentheses that change
nothing) keeps every record valid; any change of behaviour (a statement, a name, a constant, an
import, a file added to the journey folder, a new import of another repository module) changes
the digest. One cost is accepted: a docstring a program prints (``--help`` from ``__doc__``)
is text, not behaviour, here.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

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


def source_file(base: Path, module: str) -> Path | None:
    """The file of dotted ``module`` under ``base`` (``a/b.py`` or ``a/b/__init__.py``)."""
    candidate = base.joinpath(*module.split("."))
    if candidate.with_suffix(".py").is_file():
        return candidate.with_suffix(".py")
    if (candidate / "__init__.py").is_file():
        return candidate / "__init__.py"
    return None


def _module_path(root: Path, module: str) -> Path | None:
    base = _library_base(root) if module.split(".")[0] == "cortex_recipes" else root
    return source_file(base, module)


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


# The form of the digest records carry (``code_digest_form``): "ast-1", the code's syntax tree
# without docstrings. Records without it were hashed over the files' bytes.
DIGEST_FORM = "ast-1"


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def code_form(source: str, filename: str = "<code>") -> str:
    """``source`` as code only: its syntax tree, docstrings (a string statement opening a
    module, class or function) removed, dumped without positions, so comments and layout
    leave no trace."""
    tree = ast.parse(source, filename=filename)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and _is_docstring(body[0])
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def byte_digest(root: Path, folder: Path) -> str:
    """The digest records carried before ``code_digest_form``: over the files' bytes (used
    only to re-stamp such a record, :func:`cortex_recipes.repo_checks.records.restamp`)."""
    root = Path(root).resolve()
    digest = hashlib.sha256()
    for path in sorted(code_files(root, folder), key=lambda p: _display(root, p)):
        digest.update(_display(root, path).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return digest.hexdigest()


def code_digest(root: Path, folder: Path) -> str:
    """sha256 over the sorted (repository path, sha256 of :func:`code_form`) of
    :func:`code_files`."""
    root = Path(root).resolve()
    digest = hashlib.sha256()
    for path in sorted(code_files(root, folder), key=lambda p: _display(root, p)):
        form = code_form(path.read_text(), str(path)).encode()
        digest.update(_display(root, path).encode() + b"\0")
        digest.update(hashlib.sha256(form).hexdigest().encode() + b"\n")
    return digest.hexdigest()


# What else a record names about where it ran: the profile's hash, the source revision, the
# image, the packages and the hardware.

IMAGE_DIGEST_ENV = "CORTEX_RECIPES_IMAGE_DIGEST"
IMAGE_DIGEST_SOURCE_ENV = "CORTEX_RECIPES_IMAGE_DIGEST_SOURCE"
REVISION_ENV = "CORTEX_RECIPES_REVISION"
CONTAINERENV = Path("/run/.containerenv")
PACKAGES = (
    "cortex-training",
    "torch",
    "transformers",
    "peft",
    "tokenizers",
    "renderers",
    "cortex-recipes",
)


def config_hash(raw: Any) -> str:
    """The hash a record pins a profile with: sha256 of its canonical JSON, 16 hex digits."""
    return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def git_revision() -> str | None:
    """HEAD, with ``+dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{head}+dirty" if dirty else head


def source_revision() -> tuple[str | None, str]:
    """The source revision a record names, and where it came from (git, else the image's
    ``$CORTEX_RECIPES_REVISION``)."""
    revision = git_revision()
    if revision:
        return revision, "git"
    baked = os.environ.get(REVISION_ENV, "").strip()
    if baked and baked != "unknown":
        return baked, f"env {REVISION_ENV} (the image's REVISION build argument)"
    return None, f"none: no git checkout and no ${REVISION_ENV}"


def image_identity(containerenv: Path = CONTAINERENV) -> tuple[str | None, str]:
    """The image a record was made in, and which identifier that is."""
    passed = os.environ.get(IMAGE_DIGEST_ENV, "").strip()
    if passed:
        return passed, os.environ.get(IMAGE_DIGEST_SOURCE_ENV) or f"env {IMAGE_DIGEST_ENV}"
    hint = f"pass -e {IMAGE_DIGEST_ENV}=$(docker image inspect --format '{{{{.Id}}}}' <image>)"
    if containerenv.is_file():
        for line in containerenv.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "imageid" and value.strip().strip('"'):
                return value.strip().strip('"'), f"{containerenv} imageid (the podman image ID)"
        return None, (
            f"unknown: {containerenv} names no imageid (podman fills it for --privileged "
            f"containers only); {hint}"
        )
    if Path("/.dockerenv").exists():
        return None, f"unknown: docker shows a container no image ID; {hint}"
    return None, "none: not run in an image"


def hardware() -> dict[str, Any]:
    return {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "accelerator": _accelerator(),
    }


def _accelerator() -> str:
    """CUDA devices when the run already imported torch and has them, else CPU."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            return f"{len(names)} x {names[0]}"
    except Exception as exc:  # a broken CUDA setup must not lose a record
        log.warning("cannot query CUDA devices: %s", exc)
    return "none (CPU)"
