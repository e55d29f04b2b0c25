"""ci/images.py's reproducibility check compares something both engines report."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import load_script

pytestmark = pytest.mark.unit

images = load_script("ci/images.py", "ci_images")


def test_two_builds_match_only_on_equal_known_ids():
    assert images.same_image("sha256:ab", "sha256:ab")
    assert not images.same_image("sha256:ab", "sha256:cd")


@pytest.mark.parametrize("ids", [("", ""), ("sha256:ab", ""), ("", "sha256:ab")])
def test_an_empty_id_fails_instead_of_passing(ids):
    with pytest.raises(ValueError, match="one is empty"):
        images.same_image(*ids)


def _final_stage(text: str) -> list[str]:
    lines, current = [], []
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            current = []
            lines = current
        current.append(line)
    return lines


def test_a_run_after_the_final_stage_args_keys_the_journey_metadata():
    """podman reuses an ENV/LABEL layer keyed on its unexpanded text; without a RUN (whose key
    carries the ARG values) between the ARGs and them, sft and opd (one extra) got one image."""
    final = _final_stage((Path(__file__).resolve().parents[2] / "docker/Dockerfile").read_text())
    kinds = [line.split()[0].upper() for line in final]
    last_arg = max(i for i, kind in enumerate(kinds) if kind == "ARG")
    first_use = min(i for i, line in enumerate(final) if "${JOURNEY}" in line and kinds[i] != "RUN")
    assert last_arg < first_use
    assert "RUN" in kinds[last_arg:first_use], final[last_arg:first_use]


def _fixture_stage_sources(text: str) -> list[str]:
    """The project files the fixtures stage copies (`COPY src/cortex_recipes/... /opt/...`)."""
    sources, in_stage = [], False
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if line.upper().startswith("FROM "):
            in_stage = line.split()[-1] == "fixtures"
        elif in_stage and line.upper().startswith("COPY ") and "--from" not in line:
            sources.append(line.split()[1])
    return sources


def _project_imports(path: Path) -> set[str]:
    """Every `cortex_recipes...` module a file imports, function-level imports included."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("cortex_recipes")}
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("cortex_recipes")
        ):
            found.add(node.module)
    return found


# Function-level imports of modules the stage does not copy, each on a path the fixture build
# never takes (the stage's RUN builds FIXTURE_MODELS only).
LAZY_OUTSIDE_FIXTURES = {
    # _hub_snapshot: resolving a Hub model's pinned revision, not a fixture
    "src/cortex_recipes/models/resolve.py imports cortex_recipes.weights",
}


def test_the_fixture_stage_copies_every_project_module_its_code_imports():
    # The fixtures stage builds the offline models from a copy of part of src/ only (so it
    # is cached across source changes); a module it imports but does not copy breaks every
    # image build (the CI failure of 1cf150b: models/cache.py imported cortex_recipes.progress).
    root = Path(__file__).resolve().parents[2]
    sources = _fixture_stage_sources((root / "docker" / "Dockerfile").read_text())
    assert sources, "no COPY lines found in the fixtures stage"
    files = []
    for source in sources:
        path = root / source
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    copied = {
        ".".join(f.relative_to(root / "src").with_suffix("").parts).removesuffix(".__init__")
        for f in files
    }
    missing = {
        f"{f.relative_to(root)} imports {module}"
        for f in files
        for module in _project_imports(f)
        if module not in copied
    }
    assert missing - LAZY_OUTSIDE_FIXTURES == set(), sorted(missing - LAZY_OUTSIDE_FIXTURES)
    # an allowance that no longer matches anything is removed, not kept as a blind spot
    assert missing >= LAZY_OUTSIDE_FIXTURES, sorted(LAZY_OUTSIDE_FIXTURES - missing)


def test_every_landed_journey_has_a_first_step_override_its_entry_point_accepts():
    """CI runs each image's `train` with FIRST_STEP: a journey without one, or an override its
    entry point's Config does not have, would fail there instead of here."""
    import importlib

    import chz

    journeys = images.landed_journeys()
    assert sorted(images.FIRST_STEP) == sorted(j["name"] for j in journeys)
    for journey in journeys:
        config = importlib.import_module(journey["entry_point"]).Config
        for override in images.FIRST_STEP[journey["name"]]:
            key, value = override.split("=", 1)
            assert key in chz.chz_fields(config), (journey["name"], key)
            assert value == "false" if key == "final_eval" else int(value) >= 1


def _which(*present):
    return lambda name: f"/usr/bin/{name}" if name in present else None


def test_docker_with_buildx_builds_with_docker():
    assert images.pick_engine("docker", which=_which("docker"), probe=lambda c: True) == (
        "docker",
        None,
    )


def test_docker_without_buildx_goes_to_podman_and_says_so():
    engine, note = images.pick_engine(
        "docker", which=_which("docker", "podman"), probe=lambda c: False
    )
    assert engine == "podman"
    assert "buildx is missing" in note and "podman" in note


def test_docker_without_buildx_or_podman_is_one_line_with_the_fix():
    with pytest.raises(images.EngineError) as caught:
        images.pick_engine("docker", which=_which("docker"), probe=lambda c: False)
    message = str(caught.value)
    assert "\n" not in message
    assert "docker-buildx" in message and "--engine podman" in message


def test_a_missing_engine_names_the_one_that_is_installed():
    with pytest.raises(images.EngineError, match="--engine podman"):
        images.pick_engine("docker", which=_which("podman"), probe=lambda c: True)


def test_main_stops_in_one_line_before_building(monkeypatch, capsys):
    monkeypatch.setattr(images.shutil, "which", _which())
    assert images.main(["--engine", "docker", "--journey", "sft"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ci/images.py: docker is not installed")


def test_a_failed_step_is_described_in_one_line():
    import subprocess

    exc = subprocess.CalledProcessError(125, ["podman", "build", "--format", "docker", "-t", "x"])
    line = images.describe_failure(exc)
    assert "\n" not in line
    assert line.startswith("`podman build --format ...` exited 125") and "daemon" in line


def test_the_longest_silence_counts_from_the_backend_up_to_the_stop_signal():
    """Lines before the watch window do not shorten it; the gap after the last line counts."""
    assert images.longest_silence([5.0, 20.0, 40.0], 10.0, 60.0) == 20.0
    assert images.longest_silence([], 10.0, 85.0) == 75.0
    assert images.longest_silence([11.0, 41.0, 70.0, 84.0], 10.0, 85.0) == 30.0
    assert images.MAX_SILENCE_S < images.WATCH_S  # a silent run cannot pass by ending early
