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
