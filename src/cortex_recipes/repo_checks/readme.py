"""README checks: the required sections (level-2 headings outside code fences) and the
relative links and repository paths in its text and code, which must resolve."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from cortex_recipes.repo_checks.references import mutable_problems

log = logging.getLogger(__name__)

REQUIRED_SECTIONS = (
    "Outcome",
    "Prerequisites",
    "Hardware",
    "Commands",
    "Expected metrics",
    "Configuration",
    "Troubleshooting",
)


_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_REPO_PATH = re.compile(r"(?<![\w./-])((?:recipes|src|docs|model-catalog|tests)/[\w./-]*[\w/])")


def split_markdown(text: str) -> tuple[list[str], list[str]]:
    """(prose lines, code lines): fenced blocks are code; inline code spans count as code."""
    prose, code, fenced = [], [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            code.append(line)
        else:
            prose.append(line)
            code += _INLINE_CODE.findall(line)
    return prose, code


def section_headings(text: str) -> list[str]:
    prose, _ = split_markdown(text)
    return [line[3:].strip() for line in prose if line.startswith("## ")]


def has_section(headings: list[str], section: str) -> bool:
    name = section.casefold()
    for heading in headings:
        folded = heading.casefold()
        if folded == name:
            return True
        if folded.startswith(name) and not folded[len(name)].isalnum():
            return True
    return False


def check_readme(root: Path, readme: Path) -> list[str]:
    where = readme.relative_to(root).as_posix()
    if not readme.is_file():
        return [f"{where}: missing (every journey has a README.md)"]
    text = readme.read_text()
    headings = section_headings(text)
    problems = [
        f"{where}: missing required section {section!r} (a '## {section}' heading)"
        for section in REQUIRED_SECTIONS
        if not has_section(headings, section)
    ]
    prose, code = split_markdown(text)
    for line in prose:
        for target in _LINK.findall(_INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            if not (readme.parent / target.split("#")[0]).exists():
                problems.append(f"{where}: link target {target!r} does not exist")
    for line in code:
        problems += repo_paths_problems(root, where, line)
        problems += mutable_problems(where, line)
    return problems


def repo_paths_problems(root: Path, where: str, text: str) -> list[str]:
    return [
        f"{where}: {path!r} does not exist"
        for path in _REPO_PATH.findall(text)
        if not (root / path).exists()
    ]
