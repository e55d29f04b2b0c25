"""`cortex-recipes journey train|smoke <name>`: the commands the image verbs run."""

from __future__ import annotations

import subprocess

import pytest

from cortex_recipes import journey_runner as cli
from cortex_recipes.journeys import JourneyError
from tests.helpers import ROOT, python_m

pytestmark = pytest.mark.unit


def test_smoke_runs_the_smoke_command_from_journeys_toml_with_this_python():
    command = cli.journey_command(ROOT, "smoke", "sft", ["log_path=/tmp/x"])
    assert command == python_m(
        "recipes.sft.conversational.train",
        "profile=recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json",
        "log_path=/tmp/x",
    )


def test_train_uses_the_local_backend_unless_a_connection_file_is_given(monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "_gpu_device_present", lambda: False)
    monkeypatch.delenv(cli.CONNECTION_FILE_ENV, raising=False)
    monkeypatch.setattr(cli, "MOUNTED_CONNECTION", tmp_path / "absent.json")
    assert cli.journey_command(ROOT, "train", "opd", []) == python_m(
        "recipes.distillation.on_policy.train"
    )
    mounted = tmp_path / "connection.json"
    mounted.write_text("{}")
    monkeypatch.setattr(cli, "MOUNTED_CONNECTION", mounted)
    assert cli.journey_command(ROOT, "train", "opd", [])[-1] == f"connection={mounted}"
    explicit = cli.journey_command(ROOT, "train", "opd", ["connection=local"])
    assert explicit[-1] == "connection=local" and len(explicit) == 4
    monkeypatch.setenv(cli.CONNECTION_FILE_ENV, "/secrets/conn.json")
    assert cli.journey_command(ROOT, "train", "grpo", [])[-1] == "connection=/secrets/conn.json"


def test_unknown_journey_is_an_error_naming_it():
    with pytest.raises(JourneyError, match="nope"):
        cli.journey_command(ROOT, "train", "nope", [])


def test_image_entrypoint_maps_verbs_to_cortex_recipes(tmp_path):
    fake = tmp_path / "cortex-recipes"
    fake.write_text('#!/bin/sh\necho "cortex-recipes $*"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "CORTEX_JOURNEY": "sft"}

    def entry(*args):
        return subprocess.run(
            ["sh", str(ROOT / "docker" / "entrypoint.sh"), *args],
            env=env, capture_output=True, text=True,
        )  # fmt: skip

    assert entry().stdout == "cortex-recipes journey train sft --root /app\n"
    assert entry("smoke", "log_path=/x").stdout == (
        "cortex-recipes journey smoke sft log_path=/x --root /app\n"
    )
    assert entry("validate").stdout.splitlines() == [
        "cortex-recipes validate --root /app",
        "cortex-recipes catalog validate --root /app",
    ]
    unknown = entry("deploy")
    assert unknown.returncode == 64 and "unknown verb 'deploy'" in unknown.stderr


def test_image_qualify_verb_needs_a_writable_out_and_passes_the_profile(tmp_path):
    fake = tmp_path / "bin" / "cortex-recipes"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "cortex-recipes $*"\necho "runs=$CORTEX_RECIPES_RUNS"\n')
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {
        "PATH": f"{fake.parent}:/usr/bin:/bin",
        "CORTEX_JOURNEY": "sft",
        "CORTEX_OUT": str(out),
        "HOME": str(tmp_path),
    }

    def entry(*args):
        return subprocess.run(
            ["sh", str(ROOT / "docker" / "entrypoint.sh"), *args],
            env=env, capture_output=True, text=True,
        )  # fmt: skip

    missing = entry("qualify")
    assert missing.returncode == 64 and "mount a directory you own there" in missing.stderr
    out.mkdir()
    assert entry("qualify").stdout.splitlines() == [
        f"cortex-recipes qualify sft auto --root /app --out {out}",
        f"runs={out}/runs",
    ]
    named = entry("qualify", "profile=local-cpu-smollm2-lora", "runs=1")
    assert named.stdout.splitlines()[0] == (
        f"cortex-recipes qualify sft local-cpu-smollm2-lora runs=1 --root /app --out {out}"
    )
    assert entry("smoke").stdout.splitlines()[1] == f"runs={out}/runs"


def test_train_runs_the_default_profile_without_a_gpu(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv(cli.CONNECTION_FILE_ENV, raising=False)
    monkeypatch.setattr(cli, "MOUNTED_CONNECTION", tmp_path / "absent.json")
    monkeypatch.setattr(cli, "_gpu_device_present", lambda: False)
    caplog.set_level("INFO")
    assert cli.journey_command(ROOT, "train", "tito", []) == python_m("recipes.agentic.tito.train")
    assert "its default profile (no GPU visible)" in caplog.text


def test_train_picks_the_gpu_profile_whose_weights_verify(monkeypatch, tmp_path, caplog):
    from cortex_recipes import journeys, qualify_command

    tito = journeys.get_journey(ROOT, "tito")
    caplog.set_level("INFO")
    monkeypatch.setattr(qualify_command, "weight_problems", lambda root, j, p: ["absent"])
    assert cli.gpu_train_profile(ROOT, tito, cuda=True) is None
    assert "default (CPU) profile runs: local-gpu-qwen3-0.6b-chain: absent" in caplog.text
    monkeypatch.setattr(qualify_command, "weight_problems", lambda root, j, p: [])
    chosen = cli.gpu_train_profile(ROOT, tito, cuda=True)
    assert chosen == "recipes/agentic/tito/configs/local-gpu-qwen3-0.6b-chain.json"
    assert (ROOT / chosen).is_file()
    assert "profile local-gpu-qwen3-0.6b-chain (a GPU is visible" in caplog.text

    monkeypatch.delenv(cli.CONNECTION_FILE_ENV, raising=False)
    monkeypatch.setattr(cli, "MOUNTED_CONNECTION", tmp_path / "absent.json")
    monkeypatch.setattr(cli, "gpu_train_profile", lambda root, journey: chosen)
    assert cli.journey_command(ROOT, "train", "tito", [])[-1] == f"profile={chosen}"
    # a profile or a hosted connection the user names is kept as given
    assert cli.journey_command(ROOT, "train", "tito", ["profile=x.json"])[-1] == "profile=x.json"
    hosted = cli.journey_command(ROOT, "train", "tito", ["connection=conn.json"])
    assert not any(arg.startswith("profile=") for arg in hosted)
