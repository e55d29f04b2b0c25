"""Checkpoints that prove themselves (issue 35): every save writes a manifest of its files, and a
load refuses a checkpoint with a missing, truncated or altered file, or a resumable one without
its optimizer state, naming the checkpoint, the file and what differs. On the main branch before
this, a missing optimizer file resumed silently with a fresh optimizer, a truncated weights file
gave a bare SafetensorError and 4 KiB overwritten inside the weights loaded without a word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
import torch
from cortex_training import wire

from cortex_recipes.export import ExportError, export_checkpoint
from cortex_recipes.local.checkpoints import MANIFEST

from .conftest import start, training

pytestmark = pytest.mark.e2e


def step_frame(seed: int = 0) -> bytes:
    ids = torch.randint(10, 5000, (2, 12), generator=torch.Generator().manual_seed(seed))
    return wire.dumps(
        {
            "args": (),
            "kwargs": {"input_ids": ids},
            "context": {"loss_mask": torch.ones(2, 12)},
            "processing": {"loss_fn": "causal_cross_entropy", "post": [], "config": {}},
        }
    )


@pytest.fixture(scope="module")
def job(client):
    job_id = start(client, [training()])
    client.poll_request(job_id, client.forward_backward(job_id, step_frame()))
    client.poll_request(job_id, client.step(job_id))
    yield job_id
    client.cancel_job(job_id)


def save(client, job_id: str, kind: str = "resumable") -> tuple[str, Path]:
    saved = client.poll_request(job_id, client.save(job_id, checkpoint_type=kind))
    return saved["checkpoint_id"], Path(saved["stage_path"])


def load_error(client, job_id: str, checkpoint_id: str) -> str:
    with pytest.raises((RuntimeError, requests.HTTPError)) as info:
        client.poll_request(job_id, client.load(job_id, checkpoint_id))
    return str(info.value)


def test_a_save_writes_a_manifest_of_every_file_and_a_healthy_checkpoint_loads(client, job):
    checkpoint_id, directory = save(client, job)
    files = json.loads((directory / MANIFEST).read_text())["files"]
    on_disk = sorted(p.name for p in directory.iterdir() if p.name != MANIFEST)
    assert sorted(files) == on_disk and {"optimizer.dssst1", "rng.dssst1", "meta.json"} <= set(
        files
    )
    assert all(len(entry["sha256"]) == 64 and entry["bytes"] > 0 for entry in files.values())
    loaded = client.poll_request(job, client.load(job, checkpoint_id))
    assert loaded["global_steps"] == 1


def test_a_resumable_checkpoint_without_its_optimizer_state_is_refused(client, job):
    checkpoint_id, directory = save(client, job)
    (directory / "optimizer.dssst1").unlink()
    message = load_error(client, job, checkpoint_id)
    assert checkpoint_id in message and "optimizer.dssst1 is missing" in message


def test_a_truncated_weights_file_is_refused_with_its_sizes(client, job):
    checkpoint_id, directory = save(client, job)
    weights = directory / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as f:
        f.truncate(size // 2)
    message = load_error(client, job, checkpoint_id)
    assert checkpoint_id in message and "model.safetensors" in message
    assert f"{size // 2} bytes, the manifest says {size}" in message and "truncated" in message


def test_weights_altered_in_place_are_refused(client, job):
    checkpoint_id, directory = save(client, job)
    weights = directory / "model.safetensors"
    with weights.open("r+b") as f:
        f.seek(weights.stat().st_size // 2)
        f.write(b"\x7f" * 4096)
    message = load_error(client, job, checkpoint_id)
    assert checkpoint_id in message and "model.safetensors has been altered" in message


def test_a_checkpoint_from_before_manifests_still_needs_its_optimizer_file(client, job):
    checkpoint_id, directory = save(client, job)
    (directory / MANIFEST).unlink()
    client.poll_request(job, client.load(job, checkpoint_id))  # complete: loads, with a warning
    (directory / "optimizer.dssst1").unlink()
    message = load_error(client, job, checkpoint_id)
    assert "optimizer.dssst1 missing" in message and checkpoint_id in message


def test_a_sampler_started_from_a_corrupt_checkpoint_fails_with_the_reason(client, job):
    checkpoint_id, directory = save(client, job, "weights-only")
    with (directory / "model.safetensors").open("r+b") as f:
        f.truncate(1000)
    source = {"checkpoint_id": checkpoint_id, "source_job_id": job}
    from .conftest import inference

    victim = client.create_job([inference(source=source)])
    with pytest.raises(RuntimeError) as info:
        client.wait_for_job(victim)
    described = client.get_job(victim)
    assert described["status"] == "failed"
    assert "model.safetensors is 1000 bytes" in (described.get("reason") or str(info.value))


def test_export_refuses_a_corrupt_checkpoint(client, job, tmp_path):
    _, directory = save(client, job, "weights-only")
    with (directory / "model.safetensors").open("r+b") as f:
        f.seek(100)
        f.write(b"\x00" * 64)
    with pytest.raises(ExportError, match="model.safetensors has been altered"):
        export_checkpoint(directory, tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_run_resumes_from_the_newest_checkpoint_that_verifies(tmp_path):
    """The SFT journey, its newest resume point's trainer checkpoint truncated: the rerun says
    which step it skipped and why, resumes from the one before, and ends as the uninterrupted
    run ended (same steps once each, same losses)."""
    import subprocess

    from cortex_recipes.run import RunCheckpoints
    from tests.e2e.test_grpo_journeys import ROOT, command

    module = "recipes.sft.conversational.train"
    args = {
        "profile": "recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json",
        "steps": 3,
        "ckpt_interval": 1,
        "log_path": tmp_path,
    }
    subprocess.run(command(module, **args), cwd=ROOT, check=True, capture_output=True)
    whole = json.loads((tmp_path / "summary.json").read_text())
    (tmp_path / "summary.json").unlink()  # unfinished again: its newest checkpoint is step 2
    state = RunCheckpoints(tmp_path / "checkpoints").load(2)
    trainer = state["trainer"]
    [weights] = (tmp_path / "backend" / "jobs" / trainer["job_id"] / "checkpoints").glob(
        f"{trainer['checkpoint_id']}/global_step*/model.safetensors"
    )
    with weights.open("r+b") as f:
        f.truncate(4096)
    again = subprocess.run(
        command(module, **args), cwd=ROOT, check=True, capture_output=True, text=True
    )
    resumed = json.loads((tmp_path / "summary.json").read_text())
    assert resumed["resumed_from_step"] == 1
    assert "not resuming from step 2" in again.stderr and trainer["checkpoint_id"] in again.stderr
    assert "model.safetensors is 4096 bytes" in again.stderr
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(x)["step"] for x in lines if x.strip()]
    assert steps == [1, 2, 3]
    assert resumed["losses"] == pytest.approx(whole["losses"], rel=1e-5, abs=1e-6)


def test_more_steps_continue_a_finished_run_from_its_checkpoint(tmp_path):
    """The SFT journey finished at step 2 (a resumable save at step 1, the last save
    weights-only); ``steps=3`` continues it from step 1 instead of returning the old summary:
    steps 2 and 3 are trained, every step is logged once, and step 2 trains as it did."""
    import subprocess

    from tests.e2e.test_grpo_journeys import ROOT, command

    module = "recipes.sft.conversational.train"
    args = {
        "profile": "recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json",
        "ckpt_interval": 1,
        "log_path": tmp_path,
    }
    subprocess.run(command(module, steps=2, **args), cwd=ROOT, check=True, capture_output=True)
    first = json.loads((tmp_path / "summary.json").read_text())
    again = subprocess.run(
        command(module, steps=3, **args), cwd=ROOT, check=True, capture_output=True, text=True
    )
    longer = json.loads((tmp_path / "summary.json").read_text())
    assert "finished at step 2; steps=3 continues it from its checkpoint at step 1" in again.stderr
    assert longer["resumed_from_step"] == 1 and len(longer["losses"]) == 3
    assert longer["losses"][:2] == pytest.approx(first["losses"], rel=1e-5, abs=1e-6)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines if x.strip()] == [1, 2, 3]
