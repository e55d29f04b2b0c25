"""What a record made in an image says about where it came from, where it goes, and which
profile a plain `qualify` picks (no training, no container)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cortex_recipes import cli, journeys, provenance, qualify, qualify_command
from cortex_recipes.repo_checks import configs, records
from tests.unit.recipe_fixtures import DEMO, write_demo_repository

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_revision_falls_back_to_the_baked_in_build_argument(monkeypatch):
    monkeypatch.setattr(provenance, "git_revision", lambda: None)
    monkeypatch.setenv(provenance.REVISION_ENV, "a" * 40)
    revision, source = provenance.source_revision()
    assert revision == "a" * 40 and "REVISION build argument" in source
    monkeypatch.setenv(provenance.REVISION_ENV, "unknown")
    assert provenance.source_revision()[0] is None


def test_git_wins_over_the_environment(monkeypatch):
    monkeypatch.setattr(provenance, "git_revision", lambda: "b" * 40)
    monkeypatch.setenv(provenance.REVISION_ENV, "a" * 40)
    assert provenance.source_revision() == ("b" * 40, "git")


def test_image_identity_says_which_identifier_it_is(monkeypatch, tmp_path):
    containerenv = tmp_path / ".containerenv"
    monkeypatch.delenv(provenance.IMAGE_DIGEST_ENV, raising=False)
    containerenv.write_text(
        'engine="podman-4.3.1"\nimage="localhost/cortex/sft:pinned"\nimageid="abc123"\n'
    )
    assert provenance.image_identity(containerenv) == (
        "abc123",
        f"{containerenv} imageid (the podman image ID)",
    )
    containerenv.write_text('engine="podman-4.3.1"\n')
    digest, source = provenance.image_identity(containerenv)
    assert digest is None and source.startswith("unknown") and provenance.IMAGE_DIGEST_ENV in source
    monkeypatch.setenv(provenance.IMAGE_DIGEST_ENV, "sha256:" + "c" * 64)
    monkeypatch.setenv(provenance.IMAGE_DIGEST_SOURCE_ENV, "ci/images.py: podman image inspect")
    assert provenance.image_identity(containerenv) == (
        "sha256:" + "c" * 64,
        "ci/images.py: podman image inspect",
    )


def test_a_redirected_record_goes_to_out_and_leaves_recipe_yaml(tmp_path, monkeypatch):
    demo = write_demo_repository(tmp_path / "repo")
    out = tmp_path / "out" / "evidence"
    monkeypatch.setenv(qualify.EVIDENCE_DIR_ENV, str(out))
    monkeypatch.setattr(provenance, "git_revision", lambda: None)
    monkeypatch.setenv(provenance.REVISION_ENV, "d" * 40)
    before = (demo / DEMO / "recipe.yaml").read_text()
    path = qualify.record_evidence(
        demo / DEMO, "cpu", "0123456789abcdef", [], {"ok": True}, metrics={"final_loss": 0.5}
    )
    assert path == out / "cpu.json"
    record = json.loads(path.read_text())
    assert record["git_revision"] == "d" * 40 and "REVISION" in record["revision_source"]
    assert "image_digest_source" in record
    assert (demo / DEMO / "recipe.yaml").read_text() == before
    assert not (demo / DEMO / "evidence" / "cpu.json").exists()


def _recipe(journey: str) -> dict:
    return journeys.load_recipe(journeys.get_journey(ROOT, journey).path(ROOT) / "recipe.yaml")


def test_profile_choice_follows_the_hardware_and_the_weights():
    recipe = _recipe("sft")
    ok = lambda name: []  # noqa: E731
    missing = lambda name: [f"{name}: no weights"]  # noqa: E731
    assert (
        qualify.select_profile(recipe, cuda=False, weights_ready=ok)[0] == "local-cpu-smollm2-lora"
    )
    assert qualify.select_profile(recipe, cuda=True, weights_ready=ok)[0] == "local-gpu-qwen3-0.6b"
    name, why = qualify.select_profile(recipe, cuda=True, weights_ready=missing)
    assert name == "local-cpu-smollm2-lora" and "no weights" in why


@pytest.mark.parametrize("journey", ["sft", "opd", "grpo", "math_grpo", "tito"])
def test_every_landed_journey_has_a_cpu_qualification_profile(journey):
    assert qualify.cpu_qualification_profiles(_recipe(journey))


def test_a_gpu_profile_names_its_pinned_hub_models():
    assert qualify_command.profile_hub_models(ROOT, "opd", "local-gpu-qwen3-1.7b-to-0.6b") == [
        "Qwen/Qwen3-0.6B",
        "Qwen/Qwen3-1.7B",
    ]
    assert qualify_command.profile_hub_models(ROOT, "sft", "local-cpu-smollm2-lora") == []


def test_qualify_of_a_profile_with_unverified_weights_runs_nothing(monkeypatch, caplog):
    def no_run(*args, **kwargs):
        raise AssertionError("nothing may run before the weights verify")

    monkeypatch.setattr(qualify_command.subprocess, "run", no_run)
    assert cli.main(["qualify", "opd", "local-gpu-qwen3-1.7b-to-0.6b", "--root", str(ROOT)]) == 2
    err = caplog.text
    assert "cortex-recipes models fetch Qwen/Qwen3-1.7B --pin" in err
    assert "nothing ran" in err


def _image_record(**changes) -> dict:
    recipe = _recipe("sft")
    profile = journeys.get_profile(recipe, "local-cpu-smollm2-lora", "sft")
    config = journeys.get_journey(ROOT, "sft").path(ROOT) / profile["config"]
    loader, _ = configs.journey_loader(journeys.get_journey(ROOT, "sft"))
    record = {key: None for key in records.RECORD_FIELDS}
    record.update(
        profile="local-cpu-smollm2-lora",
        passed=True,
        config_hash=configs.profile_config_hash(config, loader),
        git_revision="e" * 40,
        image_digest="sha256:" + "f" * 64,
    )
    record.update(changes)
    return record


def test_an_image_record_with_revision_and_digest_passes():
    assert records.check_image_record(ROOT, "sft", _image_record(), "sha256:" + "f" * 64) == []


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"image_digest": None}, "image_digest=None"),
        ({"git_revision": None}, "git_revision=None"),
        ({"passed": False}, "passed=False"),
        ({"config_hash": "0" * 16}, "the config here hashes to"),
        ({"image_digest": "sha256:" + "0" * 64}, "the image is"),
    ],
)
def test_an_image_record_without_what_it_must_show_fails(changes, message):
    problems = records.check_image_record(
        ROOT, "sft", _image_record(**changes), "sha256:" + "f" * 64
    )
    assert any(message in p for p in problems), problems
