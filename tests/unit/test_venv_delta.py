"""docker/venv_delta.py keeps exactly what a sync added to or changed in a venv."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SPEC = importlib.util.spec_from_file_location(
    "venv_delta", Path(__file__).resolve().parents[2] / "docker" / "venv_delta.py"
)
venv_delta = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(venv_delta)


def test_the_delta_holds_new_and_changed_files_only(tmp_path):
    venv = tmp_path / "opt" / "venv"
    (venv / "lib" / "site").mkdir(parents=True)
    (venv / "lib" / "site" / "torch.py").write_text("old, big, shared")
    (venv / "lib" / "site" / "changed.py").write_text("v1")
    manifest = tmp_path / "manifest.json"
    assert venv_delta.main(["snapshot", str(venv), str(manifest)]) == 0
    (venv / "lib" / "site" / "renderers.py").write_text("new")
    (venv / "lib" / "site" / "changed.py").write_text("version two")
    os.symlink("renderers.py", venv / "lib" / "site" / "alias.py")
    delta = tmp_path / "delta"
    assert venv_delta.main(["copy", str(venv), str(manifest), str(delta)]) == 0
    copied = delta / venv.relative_to("/")
    files = sorted(str(p.relative_to(copied)) for p in copied.rglob("*") if not p.is_dir())
    assert files == ["lib/site/alias.py", "lib/site/changed.py", "lib/site/renderers.py"]
    assert (copied / "lib" / "site" / "changed.py").read_text() == "version two"
    assert os.readlink(copied / "lib" / "site" / "alias.py") == "renderers.py"


def test_a_removed_file_fails_the_delta(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "gone.py").write_text("x")
    manifest = tmp_path / "manifest.json"
    venv_delta.main(["snapshot", str(venv), str(manifest)])
    (venv / "gone.py").unlink()
    assert venv_delta.main(["copy", str(venv), str(manifest), str(tmp_path / "delta")]) == 1


def test_bytecode_rewritten_with_the_same_bytes_stays_in_the_shared_layer(tmp_path, capsys):
    """uv compiles all of site-packages after any install: a .pyc rewritten with its old bytes
    (a new mtime) is not part of the delta, one with new bytes is, and so is any other file
    whose mtime moved (only bytecode is compared by content)."""
    site = tmp_path / "opt" / "venv" / "site"
    (site / "__pycache__").mkdir(parents=True)
    same = site / "__pycache__" / "torch.cpython-311.pyc"
    other = site / "__pycache__" / "peft.cpython-311.pyc"
    touched = site / "torch.py"
    for path, text in ((same, b"\x00same"), (other, b"\x00old!"), (touched, b"source")):
        path.write_bytes(text)
        os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    manifest = tmp_path / "manifest.json"
    assert venv_delta.main(["snapshot", str(site.parent), str(manifest)]) == 0
    same.write_bytes(b"\x00same")
    other.write_bytes(b"\x00new!")  # same size, other bytes
    touched.write_bytes(b"source")  # same bytes, but not bytecode: copied by its mtime
    delta = tmp_path / "delta"
    assert venv_delta.main(["copy", str(site.parent), str(manifest), str(delta)]) == 0
    copied = delta / site.parent.relative_to("/")
    files = sorted(str(p.relative_to(copied)) for p in copied.rglob("*") if not p.is_dir())
    assert files == ["site/__pycache__/peft.cpython-311.pyc", "site/torch.py"]
    assert "2 new or changed file(s) of 3 (1 .pyc file(s)" in capsys.readouterr().out
