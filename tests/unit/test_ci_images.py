"""ci/images.py's reproducibility check compares something both engines report."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SPEC = importlib.util.spec_from_file_location(
    "ci_images", Path(__file__).resolve().parents[2] / "ci" / "images.py"
)
images = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(images)


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
