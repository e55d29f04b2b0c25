"""Numbers in the docs rendered from the evidence records, so a doc cannot drift from them.

A number a README or doc states about a qualification record sits between two markers that
name the record and the field:

    greedy eval <!-- record recipes/rl/math_grpo/evidence/local-cpu-smollm2-lora.json
    metrics.eval_accuracy_after.value .3f -->0.578<!-- /record -->

(one line in a file; wrapped here). The opening marker holds the record's path (from the
repository root), a dotted path into its JSON (list items by index: ``runs.0.wall_time_s``)
and an optional format: a Python format spec (``.3f``, ``.0f``, ``,``), ``short`` (the first 7
characters: a git revision), ``interval`` (an interval's ``low``-``high`` at 3 decimals),
``minutes`` (seconds as whole minutes). ``cortex-recipes report --check`` fails naming every
marker whose text differs from what the record says (and every marker it cannot resolve);
``--write`` rewrites them. Nothing outside the markers is touched.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARKER = re.compile(
    r"<!-- record (?P<record>\S+) (?P<field>\S+)(?: (?P<format>\S+))? -->"
    r"(?P<text>.*?)<!-- /record -->"
)
# Inline code (`...`): a marker written there is prose about markers, not one.
CODE_SPAN = re.compile(r"`[^`]*`")
# Where markers may be: every Markdown file of the repository but these folders.
SKIPPED_DIRS = {".git", ".venv", "node_modules", "runs", "__pycache__"}


class ReportError(ValueError):
    """A marker that cannot be rendered; the message names the file, line and marker."""


@dataclass(frozen=True)
class Difference:
    path: str
    line: int
    marker: str
    written: str
    rendered: str

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line}: {self.marker} says {self.written!r}, "
            f"the record says {self.rendered!r} (cortex-recipes report --write)"
        )


def _lookup(data: Any, field: str) -> Any:
    for part in field.split("."):
        if isinstance(data, list) and part.lstrip("-").isdigit():
            data = data[int(part)]
        elif isinstance(data, dict) and part in data:
            data = data[part]
        else:
            raise KeyError(part)
    return data


def render_value(value: Any, spec: str | None) -> str:
    """``value`` as the marker's ``spec`` formats it (module doc)."""
    if spec is None:
        return str(value)
    if spec == "short":
        return str(value)[:7]
    if spec == "interval":
        return f"{value['low']:.3f}-{value['high']:.3f}"
    if spec == "minutes":
        return f"{round(float(value) / 60):d}"
    return format(value, spec)


def _render(root: Path, match: re.Match, cache: dict[str, Any], where: str) -> str:
    record_path = match["record"]
    if record_path not in cache:
        path = root / record_path
        try:
            cache[record_path] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ReportError(f"{where}: record {record_path} cannot be read ({exc})") from None
    try:
        value = _lookup(cache[record_path], match["field"])
    except (KeyError, IndexError, TypeError):
        raise ReportError(f"{where}: {record_path} has no field {match['field']!r}") from None
    try:
        return render_value(value, match["format"])
    except (TypeError, ValueError, KeyError) as exc:
        raise ReportError(
            f"{where}: {match['field']}={value!r:.60} cannot be formatted as "
            f"{match['format']!r} ({exc})"
        ) from None


def markdown_files(root: Path) -> list[Path]:
    out = []
    for path in sorted(Path(root).rglob("*.md")):
        if not SKIPPED_DIRS & set(path.relative_to(root).parts):
            out.append(path)
    return out


def check(root: Path, *, write: bool = False) -> list[Difference]:
    """Every marker whose text differs from its record (rewritten when ``write``); raises
    :class:`ReportError` for a marker that cannot be resolved."""
    root = Path(root).resolve()
    cache: dict[str, Any] = {}
    differences: list[Difference] = []
    for path in markdown_files(root):
        text = path.read_text()
        if "<!-- record " not in text:
            continue
        relative = path.relative_to(root).as_posix()
        lines = text.split("\n")
        changed = False
        for number, line in enumerate(lines, start=1):
            if "<!-- record " not in line:
                continue
            code = [m.span() for m in CODE_SPAN.finditer(line)]

            def quoted(at: int, code=code) -> bool:
                return any(start <= at < end for start, end in code)

            opened = [m.start() for m in re.finditer("<!-- record ", line) if not quoted(m.start())]
            found = [m for m in MARKER.finditer(line) if not quoted(m.start())]
            if len(opened) != len(found):
                raise ReportError(
                    f"{relative}:{number}: a record marker is not of the form "
                    "<!-- record PATH FIELD [FORMAT] -->TEXT<!-- /record --> on one line"
                )

            def replace(match: re.Match, number=number, relative=relative, quoted=quoted) -> str:
                nonlocal changed
                if quoted(match.start()):  # a marker shown as code in prose, not a marker
                    return match.group(0)
                where = f"{relative}:{number}"
                rendered = _render(root, match, cache, where)
                if rendered != match["text"]:
                    marker = f"{match['record']} {match['field']}"
                    differences.append(
                        Difference(relative, number, marker, match["text"], rendered)
                    )
                    changed = True
                return match.group(0).replace(
                    f"-->{match['text']}<!-- /record -->", f"-->{rendered}<!-- /record -->"
                )

            lines[number - 1] = MARKER.sub(replace, line)
        if write and changed:
            path.write_text("\n".join(lines))
    return differences
