"""Which uv extra a test needs, and a skip that names it when it is not installed.

`uv sync --all-extras` (CI) installs every extra, so nothing here skips there. A journey's Nix
shell (`nix develop .#opd`) or `uv sync --extra local --extra opd --extra tools` installs only
that journey's extras; the tests of the other journeys then skip with a reason that names
the missing extra instead of failing at import. The extras and their packages come from
pyproject.toml.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "cortex-recipes"
_SELF = re.compile(rf"^{re.escape(PROJECT)}\[([^\]]*)\]")
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")


@functools.cache
def _optional_dependencies() -> dict[str, list[str]]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return pyproject["project"]["optional-dependencies"]


def extra_packages(extra: str) -> list[str]:
    """The distributions ``extra`` installs, through its self-references too."""
    optional = _optional_dependencies()
    if extra not in optional:
        raise KeyError(f"pyproject.toml: no extra {extra!r}; extras are {sorted(optional)}")
    names: list[str] = []
    for requirement in optional[extra]:
        requirement = requirement.strip()
        inner = _SELF.match(requirement)
        if inner:
            for part in inner.group(1).split(","):
                names += [n for n in extra_packages(part.strip()) if n not in names]
        else:
            name = _NAME.match(requirement).group(1)
            if name not in names:
                names.append(name)
    return names


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing(*extras: str) -> str | None:
    """None when every extra is installed, else the reason a test skips: the first missing
    extra, the package that is missing, and how to install it."""
    for extra in extras:
        absent = [name for name in extra_packages(extra) if not _installed(name)]
        if absent:
            return (
                f"needs the {extra!r} extra ({', '.join(absent)} not installed): "
                f"uv sync --frozen --extra local --extra {extra} --extra tools, "
                f"or `nix develop` (the default shell has every extra)"
            )
    return None


def reason(extra: str) -> str:
    """The reason for ``pytest.importorskip(module, reason=reason(extra))`` at module level."""
    return missing(extra) or f"needs the {extra!r} extra"


def requires(*extras: str) -> pytest.MarkDecorator:
    """Mark a test (or a module, through ``pytestmark``) to skip when an extra is missing."""
    why = missing(*extras)
    return pytest.mark.skipif(why is not None, reason=why or "")
