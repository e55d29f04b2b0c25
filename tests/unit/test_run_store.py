"""Which resume point a rerun trusts (issue 47, item 2): a trainer checkpoint whose folder is
gone is skipped like a corrupt one, naming it and the step resumed from; a run that saved its
checkpoints with manifests refuses one whose manifest was deleted; a hosted job's checkpoint
(no folder here to check) is left to the service."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from cortex_recipes import run_store
from cortex_recipes.local import checkpoints as local_checkpoints
from cortex_recipes.run_store import MANIFESTED, CheckpointError, RunCheckpoints

pytestmark = pytest.mark.unit


def checkpoint(backend: Path, job: str, checkpoint_id: str, *, manifest: bool = True) -> Path:
    """A weights-only checkpoint folder as the local backend lays it out."""
    directory = backend / "jobs" / job / "checkpoints" / checkpoint_id / "global_step1"
    directory.mkdir(parents=True)
    meta = {"checkpoint_id": checkpoint_id, "checkpoint_type": "weights-only", "lora": None}
    local_checkpoints.write_meta(directory, meta)
    (directory / local_checkpoints.FULL_WEIGHTS).write_bytes(b"weights of " + job.encode())
    if manifest:
        local_checkpoints.write_manifest(directory)
    return directory


def run_with(tmp_path: Path, steps: int, *, manifested: bool = True) -> RunCheckpoints:
    store = RunCheckpoints(tmp_path / "run" / "checkpoints")
    for step in range(1, steps + 1):
        checkpoint(tmp_path / "backend", "job-1", f"cp_{step}")
        state = {"trainer": {"job_id": "job-1", "checkpoint_id": f"cp_{step}"}}
        store.save(step, {**state, **({MANIFESTED: True} if manifested else {})})
    return store


def test_the_manifest_file_name_is_the_backends():
    assert run_store.MANIFEST_FILE == local_checkpoints.MANIFEST


def test_a_checkpoint_whose_folder_is_gone_is_skipped_naming_it_and_the_step_resumed(
    tmp_path, caplog
):
    store = run_with(tmp_path, 3)
    shutil.rmtree(tmp_path / "backend" / "jobs" / "job-1" / "checkpoints" / "cp_3")
    with caplog.at_level(logging.WARNING, logger=run_store.log.name):
        state = store.latest_verified(tmp_path / "backend")
    assert state["step"] == 2
    assert "not resuming from step 3: trainer checkpoint cp_3 is missing" in caplog.text
    assert "resuming from step 2, the newest checkpoint that verifies" in caplog.text


def test_a_deleted_manifest_does_not_bypass_the_check_of_a_run_that_wrote_them(tmp_path, caplog):
    store = run_with(tmp_path, 2)
    directory = run_store.local_checkpoint(
        tmp_path / "backend", {"job_id": "job-1", "checkpoint_id": "cp_2"}
    )
    (directory / run_store.MANIFEST_FILE).unlink()
    with caplog.at_level(logging.WARNING, logger=run_store.log.name):
        assert store.latest_verified(tmp_path / "backend")["step"] == 1
    assert "manifest.json is missing, and this run wrote one" in caplog.text


def test_a_run_from_before_manifests_still_resumes_unverified(tmp_path):
    store = run_with(tmp_path, 2, manifested=False)
    directory = run_store.local_checkpoint(
        tmp_path / "backend", {"job_id": "job-1", "checkpoint_id": "cp_2"}
    )
    (directory / run_store.MANIFEST_FILE).unlink()
    assert store.latest_verified(tmp_path / "backend")["step"] == 2


def test_when_no_checkpoint_can_be_trusted_the_error_names_each(tmp_path):
    store = run_with(tmp_path, 2)
    shutil.rmtree(tmp_path / "backend" / "jobs" / "job-1" / "checkpoints")
    with pytest.raises(CheckpointError, match=r"step 2: .*cp_2 is missing.*step 1: .*cp_1"):
        store.latest_verified(tmp_path / "backend")
    assert store.steps() == [1, 2]  # nothing deleted


def test_a_hosted_jobs_checkpoint_is_left_to_the_service(tmp_path):
    store = RunCheckpoints(tmp_path / "run" / "checkpoints")
    store.save(1, {"trainer": {"job_id": "hosted-job", "checkpoint_id": "cp_x"}})
    assert store.latest_verified(tmp_path / "backend")["step"] == 1
