"""One pre-flight check before any backend starts (issue 47, item 1): each bad configuration
the fault probe found is one message naming the field or path, its value and what is accepted,
and nothing is started or written (no backend folder, no run folder)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from cortex_recipes import preflight, profiles, run
from cortex_recipes.profiles import ProfileError
from cortex_recipes.run_store import CheckpointError
from tests import extras

pytestmark = [pytest.mark.unit, extras.requires("sft")]

SFT_TINY = "recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json"


def sft_command(tmp_path: Path, *args: str):
    """The SFT journey's command line as ``main`` receives it, with the run in ``tmp_path``."""
    from cortex_recipes import sft
    from recipes.sft.conversational.train import Config

    argv = [f"profile={SFT_TINY}", f"log_path={tmp_path / 'run'}", *args]
    return profiles.entrypoint(Config, sft.SFTProfile, argv)


def refused(tmp_path: Path, *args: str, error=ProfileError):
    """Run the SFT journey's ``main`` on ``args``; the error, once nothing was started."""
    from recipes.sft.conversational.train import main

    with pytest.raises(error) as caught:
        main(sft_command(tmp_path, *args))
    assert not (tmp_path / "run" / "backend").exists()  # no backend was started
    assert not (tmp_path / "run" / "config.json").exists()  # no run was opened
    return str(caught.value)


def test_steps_0_is_refused_on_the_command_line(tmp_path):
    with pytest.raises(ProfileError, match=r"steps=0; accepted: an integer >= 1"):
        sft_command(tmp_path, "steps=0")
    assert sft_command(tmp_path, "steps=2").steps == 2
    assert sft_command(tmp_path).steps is None  # the profile's


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_number_that_is_not_finite_is_refused_naming_the_field(tmp_path, value):
    message = refused(tmp_path, f"learning_rate={value}")
    assert "learning_rate=" in message and "finite" in message


def test_a_nan_in_a_free_form_block_is_refused_naming_its_dotted_path(tmp_path):
    message = refused(tmp_path, "training.max_grad_norm=NaN")
    assert "training.max_grad_norm=nan" in message and "finite" in message


def test_a_misspelt_nested_key_is_refused_by_the_backends_own_rules_before_it_starts(tmp_path):
    message = refused(tmp_path, "training.peft_config.peft_type=Lora", "training.peft_config.rr=8")
    assert "'rr'" in message and "peft_config" in message


def test_a_run_folder_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "run").write_text("not a folder")
    message = refused(tmp_path, error=CheckpointError)
    assert f"{tmp_path / 'run'} is a file" in message


def test_a_run_folder_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="is a file, so the folder cannot be created"):
        preflight.check_run_folder(tmp_path / "file" / "run")


def test_a_read_only_place_is_refused_naming_the_folder(tmp_path, monkeypatch):
    """As root the permission bits do not stop a write, so the file system's answer is
    simulated: the probe write fails with EROFS, as on a read-only mount."""

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(preflight.tempfile, "NamedTemporaryFile", read_only)
    with pytest.raises(CheckpointError, match=r"cannot write in .* \(Read-only file system\)"):
        preflight.check_run_folder(tmp_path / "runs" / "sft" / "x")
    assert not (tmp_path / "runs").exists()


def test_a_good_configuration_passes_and_creates_nothing(tmp_path):
    from cortex_recipes import sft

    config = sft_command(tmp_path)
    profile = sft.load_profile(SFT_TINY)
    preflight.check(config, profile, run.run_path("sft", profile, config.log_path))
    assert not (tmp_path / "run").exists()


def test_not_finite_names_every_bad_float():
    found = preflight.not_finite({"a": 1.0, "b": {"c": float("nan"), "d": [0.5, float("inf")]}}, "")
    assert found == ["b.c=nan", "b.d[1]=inf"]
