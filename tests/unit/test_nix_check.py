"""The offline flake check (ci/nix_check.py): each Nix shell carries exactly its journey's
extras, the uv2nix overrides cover the sdist-only and CUDA packages, the docs show each
shell's commands."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

from ci import nix_check

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
needs_nix = pytest.mark.skipif(
    shutil.which("nix") is None, reason="needs nix-bin (.ci/run installs it)"
)

# `data` (datasets) and `plots` (matplotlib) come in through the sft and grpo extras.
JOURNEY_SHELLS = {
    "sft": ["local", "data", "plots", "sft", "tools"],
    "opd": ["local", "data", "plots", "opd", "sft", "tools"],
    "grpo": ["local", "data", "plots", "grpo", "tools"],
    "math_grpo": ["local", "data", "plots", "grpo", "tools"],
    "tito": ["local", "data", "plots", "tito", "sft", "tools"],
    "default": ["local", "data", "plots", "sft", "opd", "grpo", "tito", "tools"],
}


def _shells(extras: dict[str, list[str]]) -> dict:
    return {
        name: {"packages": [{"cortex-recipes": list(e)}, "uv"], "shellHook": "", "overridden": {}}
        for name, e in extras.items()
    }


def test_expected_extras_follow_the_self_references_in_pyproject():
    assert nix_check.expected_extras(ROOT, ["opd"]) == set(JOURNEY_SHELLS["opd"])
    assert nix_check.expected_extras(ROOT, ["grpo"]) == set(JOURNEY_SHELLS["grpo"])
    optional = {"a": ["cortex-recipes[b, c]", "x==1"], "b": ["cortex-recipes[c]"], "c": ["y==2"]}
    assert nix_check.close_extras(optional, ["a"]) == {"a", "b", "c"}


def test_dev_is_every_journey_plus_tools_and_tools_holds_no_journey_package():
    optional = nix_check._optional_dependencies(ROOT)
    journeys = {j["extra"] for j in nix_check.landed_journeys(ROOT)}
    # dev (what --all-extras installs) adds the optional trackers; no shell asks for it.
    assert set(nix_check.self_extras(optional, "dev")) == journeys | {"tools", "trackers"}
    assert nix_check.self_extras(optional, "tools") == []
    tools = nix_check.reachable(ROOT, {"tools"})
    for extra in journeys:
        assert not nix_check._journey_only_packages(ROOT, extra) & tools, extra


def test_opd_shell_reaches_sft_packages_but_nothing_of_grpo_or_tito():
    carried = nix_check.reachable(ROOT, {"local", "opd", "sft", "tools"})
    assert {"renderers", "httpx", "pytest", "peft"} <= carried
    assert not {"reasoning-gym", "msgspec", "verifiers"} & carried
    # llama-cpp-python is locked but dropped by [tool.uv] override-dependencies.
    assert "llama-cpp-python" not in carried


def test_structure_check_wants_each_shells_exact_extras():
    assert nix_check.structure_problems(ROOT, _shells(JOURNEY_SHELLS)) == []
    bad = copy.deepcopy(JOURNEY_SHELLS)
    bad["opd"] = ["local", "opd", "sft", "dev"]  # what every shell asked for before
    bad["sft"] = ["local", "data", "plots", "sft", "tools", "grpo"]
    del bad["tito"]
    found = nix_check.structure_problems(ROOT, _shells(bad))
    assert any("dev shells" in line for line in found)
    assert any("shell 'opd'" in line and "'tools'" in line for line in found)
    assert any("shell 'sft'" in line for line in found)
    assert any("shell 'tito' asks for cortex-recipes extras []" in line for line in found)
    assert len(found) == 4


def _overridden() -> dict:
    torch_libs = sorted(
        n for n in nix_check.reachable_from(nix_check.lock_packages(ROOT), "torch") if "nvidia" in n
    )
    setuptools = {"nativeBuildInputs": ["build-system:setuptools"]}
    return {
        "pycosat": setuptools,
        "cellpylib": setuptools,
        "zss": setuptools,
        "torch": {
            "autoPatchelfIgnoreMissingDeps": ["libcuda.so.1"],
            "preFixup": "".join(
                f"addAutoPatchelfSearchPath /nix/store/stub-{n}-1/x\n" for n in torch_libs
            ),
        },
        "cortex-recipes": {
            "editableRoot": "$REPO_ROOT",
            "nativeBuildInputs": ["build-system:editables"],
        },
    }


def test_override_check_names_each_missing_override():
    shells = _shells(JOURNEY_SHELLS)
    for shell in shells.values():
        shell["shellHook"] = 'export REPO_ROOT="$(git rev-parse --show-toplevel)"\n'
    shells["opd"]["overridden"] = _overridden()
    assert nix_check.override_problems(ROOT, shells) == []

    overridden = _overridden()
    del overridden["zss"]
    overridden["torch"]["autoPatchelfIgnoreMissingDeps"] = ["libcuda.so.1", "libcudart.so.13"]
    overridden["torch"]["preFixup"] = overridden["torch"]["preFixup"].replace(
        "stub-nvidia-nccl-cu13-", ""
    )
    overridden["cortex-recipes"]["editableRoot"] = None
    shells["opd"]["overridden"] = overridden
    shells["grpo"]["shellHook"] = ""
    found = nix_check.override_problems(ROOT, shells)
    assert any("'zss' is locked as an sdist only" in line for line in found)
    assert any("torch ignores missing" in line for line in found)
    assert any("'nvidia-nccl-cu13'" in line for line in found)
    assert any("not editable" in line for line in found)
    assert any("shell 'grpo' does not set REPO_ROOT" in line for line in found)
    assert len(found) == 5


def test_sdist_only_packages_of_a_shell_are_the_known_three():
    packages = nix_check.lock_packages(ROOT)
    carried = nix_check.reachable(ROOT, set(JOURNEY_SHELLS["default"]), packages)
    sdist_only = {
        n for n in carried if any("sdist" in v and not v.get("wheels") for v in packages[n])
    }
    assert sdist_only - {"cortex-recipes"} == {"pycosat", "cellpylib", "zss"}


def test_docs_show_every_shell_and_its_smoke_command(tmp_path):
    assert nix_check.docs_problems(ROOT) == []
    for name in ("journeys.toml", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "reproducibility.md").write_text("nix develop .#sft\n")
    found = nix_check.docs_problems(tmp_path)
    assert any("'nix develop .#opd'" in line for line in found)
    assert any("recipes.sft.conversational.train" in line for line in found)
    assert not any("'nix develop .#sft'" in line for line in found)


@needs_nix
def test_flake_evaluates_against_the_offline_stubs():
    before = (ROOT / "flake.lock").read_bytes()
    shells = nix_check.evaluate_shells(ROOT)
    assert nix_check.structure_problems(ROOT, shells) == []
    assert nix_check.override_problems(ROOT, shells) == []
    assert {name: sorted(nix_check._env_extras(s)[0]) for name, s in shells.items()} == {
        name: sorted(extras) for name, extras in JOURNEY_SHELLS.items()
    }
    assert (ROOT / "flake.lock").read_bytes() == before, "evaluation must not rewrite flake.lock"


@needs_nix
def test_flake_evaluation_fails_on_an_override_of_a_package_not_in_the_lock(tmp_path):
    for name in (
        "flake.nix",
        "flake.lock",
        "journeys.toml",
        "pyproject.toml",
        "uv.lock",
        "README.md",
    ):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "ci" / "nix-stub", tmp_path / "ci" / "nix-stub")
    (tmp_path / "src" / "cortex_recipes").mkdir(parents=True)
    (tmp_path / "src" / "cortex_recipes" / "__init__.py").write_text("")
    flake = (tmp_path / "flake.nix").read_text()
    assert "zss = { setuptools = [ ]; };" in flake
    (tmp_path / "flake.nix").write_text(
        flake.replace("zss = { setuptools = [ ]; };", "zss-renamed = { setuptools = [ ]; };")
    )
    with pytest.raises(nix_check.subprocess.CalledProcessError) as failure:
        nix_check.evaluate_shells(tmp_path)
    assert "zss-renamed" in failure.value.stderr
