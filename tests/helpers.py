"""Small helpers the test modules share: the repository root and JSON-lines text."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root


def jsonl(rows) -> str:
    """``rows`` as JSON lines, one object a line (what the repository's .jsonl files hold)."""
    return "".join(json.dumps(r) + "\n" for r in rows)


def write_jsonl(path: Path, rows) -> Path:
    path.write_text(jsonl(rows))
    return path


def python_m(module: str, *args: str) -> list[str]:
    """The command that runs ``module`` with this interpreter: ``python -m module args...``."""
    return [sys.executable, "-m", module, *args]


def load_script(relative: str, name: str):
    """A repository script that is not a package module (``ci/images.py``, a bench), loaded by
    path as module ``name``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
