"""The static pin check (ci/pins.py); the offline flake check is in test_nix_check.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ci import pins

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "@sha256:" + "a" * 64


def test_repository_passes_the_pin_check():
    assert pins.check_repository(ROOT) == []


def _dockerfile(tmp_path, text: str) -> list[str]:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return pins.check_dockerfile(path, tmp_path)


def test_unpinned_from_is_caught_also_through_arg_defaults(tmp_path):
    assert _dockerfile(tmp_path, f"FROM python:3.11-slim{DIGEST}\n") == []
    assert _dockerfile(tmp_path, "FROM python:3.11-slim\n") == [
        "Dockerfile: FROM python:3.11-slim is not pinned by @sha256 digest"
    ]
    text = "ARG BASE=python:3.11-slim\nFROM ${BASE} AS build\nFROM build\n"
    assert _dockerfile(tmp_path, text) == [
        "Dockerfile: FROM python:3.11-slim is not pinned by @sha256 digest"
    ]
    assert _dockerfile(tmp_path, f"ARG BASE=python{DIGEST}\nFROM $BASE AS a\nFROM a\n") == []
    assert "no pinned default" in _dockerfile(tmp_path, "ARG BASE\nFROM ${BASE}\n")[0]


def test_only_this_projects_own_pinned_journey_image_may_be_a_base_without_a_digest(tmp_path):
    assert _dockerfile(tmp_path, "ARG GRPO_IMAGE=cortex/grpo:pinned\nFROM ${GRPO_IMAGE}\n") == []
    assert _dockerfile(tmp_path, "FROM localhost/cortex/grpo:pinned\n") == []
    for image in ("cortex/grpo:0.1.0", "docker.io/cortex/grpo:pinned", "evil/cortex/grpo:pinned"):
        assert _dockerfile(tmp_path, f"FROM {image}\n") == [
            f"Dockerfile: FROM {image} is not pinned by @sha256 digest"
        ], image
    # and *.Dockerfile files under docker/ are checked too
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "extra.Dockerfile").write_text("FROM python:3.12\n")
    assert "docker/extra.Dockerfile: FROM python:3.12 is not pinned by @sha256 digest" in (
        pins.check_repository(tmp_path)
    )


def test_mutable_references_in_a_dockerfile_are_caught(tmp_path):
    found = _dockerfile(
        tmp_path,
        f"FROM x{DIGEST}\nRUN pip install --no-cache-dir uv \\\n    requests==2.0\nRUN echo img:latest\n",
    )
    assert "Dockerfile: 'pip install uv' is not pinned; use uv==<version>" in found
    assert any("':latest'" in line for line in found)
    assert not any("requests" in line for line in found)


@pytest.mark.parametrize(
    "requirement, pinned",
    [
        ("torch==2.13.0", True),
        ("renderers[x]==0.1.12; python_version >= '3.11'", True),
        ("torch>=2.0", False),
        ("torch", False),
        ("pkg @ git+https://github.com/o/r@main", False),
        ("pkg @ git+https://github.com/o/r@" + "0" * 40, True),
        ("pkg @ https://example.org/pkg.whl", False),
        ("pkg @ https://example.org/pkg.whl#sha256=" + "0" * 64, True),
    ],
)
def test_dependency_requirements_must_be_exact(requirement, pinned):
    assert (pins.check_requirement(requirement) is None) == pinned


def test_unpinned_dependency_in_pyproject_is_caught(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "demo"\ndependencies = ["a==1", "b>=2"]\n'
        '[project.optional-dependencies]\nx = ["demo[y]", "c @ git+https://h/o/r@main"]\n'
        '[tool.uv.sources]\nd = { git = "https://h/o/d", branch = "main" }\n'
    )
    found = pins.check_pyproject(tmp_path / "pyproject.toml", tmp_path)
    assert found == [
        "pyproject.toml: 'b>=2' is not pinned with ==",
        "pyproject.toml: 'c @ git+https://h/o/r@main' names no 40-hex commit",
        "pyproject.toml: [tool.uv.sources] d is a git source without a 40-hex rev",
    ]


def test_workflow_actions_must_be_pinned_to_commits(tmp_path):
    path = tmp_path / "ci.yml"
    path.write_text(
        "steps:\n  - uses: actions/checkout@v4\n  - uses: actions/checkout@"
        + "1" * 40
        + " # v4\n  - uses: docker://alpine:3\n  - uses: ./local\n"
    )
    assert pins.check_workflow(path, tmp_path) == [
        "ci.yml:2: actions/checkout@v4 is not pinned to a 40-hex commit",
        "ci.yml:4: docker://alpine:3 is not pinned by digest",
    ]


def _flake(tmp_path, lock_edit=None, extra_input="") -> list[str]:
    shutil.copy(ROOT / "flake.nix", tmp_path / "flake.nix")
    lock = json.loads((ROOT / "flake.lock").read_text())
    if lock_edit:
        lock_edit(lock)
    (tmp_path / "flake.lock").write_text(json.dumps(lock))
    if extra_input:
        text = (
            (tmp_path / "flake.nix")
            .read_text()
            .replace("inputs = {", "inputs = {\n" + extra_input, 1)
        )
        (tmp_path / "flake.nix").write_text(text)
    return pins.check_flake(tmp_path / "flake.nix", tmp_path / "flake.lock", tmp_path)


def test_flake_inputs_must_be_locked_with_rev_and_narhash(tmp_path):
    assert _flake(tmp_path) == []
    assert _flake(tmp_path, lambda lock: lock["nodes"]["uv2nix"]["locked"].pop("narHash")) == [
        "flake.lock: input 'uv2nix' has no narHash"
    ]
    assert _flake(tmp_path, lambda lock: lock["nodes"]["nixpkgs"]["locked"].pop("rev")) == [
        "flake.lock: input 'nixpkgs' has no 40-hex locked rev"
    ]
    assert _flake(tmp_path, extra_input='    flake-utils.url = "github:numtide/flake-utils";') == [
        "flake.lock: input 'flake-utils' (github:numtide/flake-utils) is not locked"
    ]
    moved = _flake(
        tmp_path, lambda lock: lock["nodes"]["nixpkgs"]["original"].update(ref="nixos-24.05")
    )
    assert moved == [
        "flake.lock: input 'nixpkgs' is locked from 'github:NixOS/nixpkgs/nixos-24.05' "
        "but flake.nix says 'github:NixOS/nixpkgs/nixos-unstable'"
    ]


def test_pin_check_cli_exits_1_on_a_problem(tmp_path):
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "Dockerfile").write_text("FROM debian:bookworm\n")
    assert pins.main(["--root", str(tmp_path)]) == 1
    assert pins.main(["--root", str(ROOT)]) == 0
