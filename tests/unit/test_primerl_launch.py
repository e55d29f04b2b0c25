"""Which prime-rl and verifiers an environment holds, as the async journey records it."""

from __future__ import annotations

import json
import os
import sys

import pytest

from cortex_recipes.primerl.launch import PINS_FILE, installed_commits

pytestmark = pytest.mark.unit

PRIME, VERIFIERS = "5" * 40, "a" * 40


def fake_environment(tmp_path):
    """A folder laid out like a venv whose python is this interpreter (no prime-rl in it)."""
    (tmp_path / "bin").mkdir()
    python = tmp_path / "bin" / "python"
    os.symlink(sys.executable, python)
    return python


def test_install_sh_record_names_the_commits(tmp_path):
    python = fake_environment(tmp_path)
    (tmp_path / PINS_FILE).write_text(
        json.dumps(
            {
                "prime-rl": PRIME,
                "verifiers": VERIFIERS,
                "source": "install.sh from GitHub by commit",
            }
        )
    )
    found = installed_commits(python)
    assert (found["prime-rl"], found["verifiers"]) == (PRIME, VERIFIERS)
    assert found["source"] == "install.sh from GitHub by commit"
    assert found["packages"] == {"prime-rl": None, "verifiers": None}  # not installed here


def test_without_a_record_it_says_the_commits_are_unknown(tmp_path):
    found = installed_commits(fake_environment(tmp_path))
    assert found["prime-rl"] is None and found["verifiers"] is None
    assert found["source"].startswith("unknown: no cortex-recipes-primerl.json")


def test_a_python_that_cannot_run_is_reported_not_raised(tmp_path):
    found = installed_commits(tmp_path / "bin" / "python")
    assert "error" in found["packages"] and found["prime-rl"] is None
