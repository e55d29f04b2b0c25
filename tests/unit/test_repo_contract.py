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


def test_the_first_command_installs_only_its_journeys_extra_and_shows_learning():
    """The README's journey run needs no C compiler (only the SFT extra, all wheels), and its
    default profile is the one that learns on a CPU and evaluates before and after."""
    import tomllib

    from cortex_recipes import sft
    from recipes.sft.conversational.train import DEFAULT_PROFILE

    first = next(c for c in _readme_commands() if "python -m recipes." in c)
    journeys = tomllib.loads((ROOT / "journeys.toml").read_text())["journey"]
    module = first.split("python -m ", 1)[1].split()[0]
    (journey,) = [j for j in journeys if j["entry_point"] == module]
    assert "--all-extras" not in first and f"--extra {journey['extra']} " in first
    assert module == "recipes.sft.conversational.train" and first.endswith(module)
    profile = sft.load_profile(ROOT / DEFAULT_PROFILE)
    assert profile.model == "smollm2-135m-instruct" and profile.eval is not None
    assert "pycosat" not in _locked_closure(journey["extra"])  # sdist-only: needs a compiler
    assert "pycosat" in _locked_closure("grpo")  # ... which the Math GRPO task set does


def _locked_closure(extra: str) -> set[str]:
    """Every package uv.lock installs for the project with ``extra`` (no dev extras)."""
    import tomllib

    lock = {p["name"]: p for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}
    seen: set[str] = set()
    todo = [("cortex-recipes", {extra})]
    while todo:
        name, extras = todo.pop()
        package = lock[name]
        deps = list(package.get("dependencies", []))
        for e in extras:
            deps += package.get("optional-dependencies", {}).get(e, [])
        for dep in deps:
            key = (dep["name"], tuple(sorted(dep.get("extra", []))))
            if key in seen:
                continue
            seen.add(key)
            todo.append((dep["name"], set(dep.get("extra", []))))
    return {name for name, _ in seen}
