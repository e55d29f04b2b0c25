"""The README's set-up commands are the ones CI runs."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_readme_has_two_setup_commands_one_journey_one_pytest():
    commands = _readme_commands()
    assert len(commands) == 2, commands
    assert sum("pytest" in c for c in commands) == 1
    assert sum("python -m recipes." in c for c in commands) == 1


def test_ci_runs_the_readme_test_command_verbatim():
    test_command = next(c for c in _readme_commands() if "pytest" in c)
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines


def test_pytest_markers_are_declared():
    pyproject = (ROOT / "pyproject.toml").read_text()
    for marker in ("unit", "contract", "e2e", "slow"):
        assert re.search(rf'"{marker}: ', pyproject), marker
