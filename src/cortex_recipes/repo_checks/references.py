"""Mutable dependency references (``@main``, ``:latest``, an unpinned ``git+`` URL or ``pip
install``, ``uv sync``/``uv run`` without ``--frozen``/``--locked``) in recipe.yaml, README
code and configs."""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Iterator

log = logging.getLogger(__name__)

_MUTABLE_REF = re.compile(
    r"@(main|master|latest|head|dev|develop|trunk|nightly)\b(?![\w.-])", re.IGNORECASE
)
_LATEST_TAG = re.compile(r"[\w./-]+:latest\b")
_GIT_URL = re.compile(r"git\+[^\s\"'<>)]+")
_PIP_INSTALL = re.compile(r"\b(?:pip3?|pipx|uv pip|uv tool)\s+install\s+([^;&|\n]+)")
_UV_RESOLVING = re.compile(r"\buv\s+(sync|run)\b([^;&|\n]*)")
_PIP_VALUE_OPTIONS = {
    "-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-i", "--index-url",
    "--extra-index-url", "-t", "--target", "--prefix", "-f", "--find-links", "--python",
}  # fmt: skip


def mutable_references(text: str) -> list[str]:
    """Each dependency reference in ``text`` that can change under the same name."""
    found = [f"mutable reference {m.group(0)!r}" for m in _MUTABLE_REF.finditer(text)]
    found += [f"mutable image tag {m.group(0)!r}" for m in _LATEST_TAG.finditer(text)]
    for match in _GIT_URL.finditer(text):
        if not re.search(r"@[0-9a-f]{40}\b", match.group(0)):
            found.append(f"git URL {match.group(0)!r} is not pinned to a 40-hex commit")
    for match in _PIP_INSTALL.finditer(text):
        found += [f"unpinned install {arg!r} (pin it with ==)" for arg in _unpinned(match[1])]
    for match in _UV_RESOLVING.finditer(text):
        if not re.search(r"--(frozen|locked)\b", match.group(2)):
            found.append(f"'uv {match.group(1)}' without --frozen or --locked re-resolves")
    return found


def _unpinned(arguments: str) -> Iterator[str]:
    try:
        tokens = shlex.split(arguments)
    except ValueError:
        tokens = arguments.split()
    skip_next = False
    for token in tokens:
        if skip_next:
            skip_next = False
            continue
        if token in _PIP_VALUE_OPTIONS:
            skip_next = True
            continue
        if token.startswith("-") or token.startswith(("git+", ".", "/", "~", "$")):
            continue
        if "==" in token or token.endswith((".whl", ".tar.gz", ".zip")) or " @ " in token:
            continue
        yield token


def mutable_problems(where: str, text: str) -> list[str]:
    return [f"{where}: {problem}" for problem in mutable_references(text)]
