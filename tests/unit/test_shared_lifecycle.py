"""The async GRPO journey runs on the lifecycle every journey shares (issue 45, item 5): its
resume points are the format the other journeys write and :class:`RunCheckpoints` reads, a
step is recorded through the driver's one recorder (schema, progress, log line), the policy
version comes from ``driver``, and its loop is only prime-rl's process supervision."""

from __future__ import annotations

import ast
import json
import logging
from pathlib import Path

import pytest

from tests import extras

pytestmark = pytest.mark.unit
pytest.importorskip("msgspec", reason=extras.reason("grpo"))

from cortex_recipes import driver  # noqa: E402
from cortex_recipes.primerl import broadcasts, records, resume, step_records  # noqa: E402
from cortex_recipes.run import Run  # noqa: E402
from cortex_recipes.training_job import Trainer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LOOP = REPO / "recipes" / "rl" / "async_grpo" / "loop.py"


class SavingClient:
    """The narrow SDK surface Trainer.save_resumable uses: save, then poll its result."""

    def save(self, job_id, checkpoint_type):
        assert checkpoint_type == "resumable"
        return "req-1"

    def poll_request(self, job_id, request_id):
        return {"checkpoint_id": "ckpt-7", "stage_path": "stage/ckpt-7"}


def a_trainer(run: Run) -> Trainer:
    trainer = Trainer.__new__(Trainer)  # no job to wait for: only the save path is used
    trainer.client, trainer.job_id, trainer.run = SavingClient(), "job-1", run
    return trainer


def test_an_async_resume_point_is_the_format_every_journey_writes(tmp_path):
    step_run = Run(tmp_path / "math", config_hash="hash-a", resume=None, journey="math_grpo")
    step_run.path.mkdir()
    a_trainer(step_run).save_resumable(4, {"evals": [{"step": 0, "accuracy": 0.1}]})

    async_run = Run(tmp_path / "async", config_hash="hash-a", resume=None, journey="async_grpo")
    async_run.path.mkdir()
    output_dir = tmp_path / "outputs"
    manifest = {"job_id": "job-1", "checkpoint_id": "ckpt-7", "stage_path": "stage/ckpt-7"}
    broadcasts.publish(output_dir, 4, manifest)
    ckpt = resume.orchestrator_checkpoint(output_dir, 4)
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"prime-rl's progress")
    recorder = records.RunRecorder(
        async_run, output_dir, interval=2, max_steps=8,
        state={"evals": [{"step": 0, "accuracy": 0.1}]},
    )  # fmt: skip
    assert recorder.save_point(4)

    ours, theirs = async_run.checkpoints.load(4), step_run.checkpoints.load(4)
    assert ours.pop("runner") == records.RUNNER
    assert ours == theirs  # the same state.json: step, config hash, trainer, journey state
    line = json.loads((async_run.path / "checkpoints.jsonl").read_text())
    step_line = json.loads((step_run.path / "checkpoints.jsonl").read_text())
    assert line.pop("runner") == records.RUNNER
    step_line.pop("time/save_ckpt")
    assert line.keys() == step_line.keys()
    assert {k: line[k] for k in ("step", "checkpoint_type", "job_id", "checkpoint_id")} == {
        "step": 4, "checkpoint_type": "resumable", "job_id": "job-1", "checkpoint_id": "ckpt-7"
    }  # fmt: skip


def test_a_step_without_an_orchestrator_checkpoint_gets_no_resume_point(tmp_path):
    run = Run(tmp_path / "async", config_hash="h", resume=None, journey="async_grpo")
    run.path.mkdir()
    broadcasts.publish(tmp_path / "out", 3, {"job_id": "j", "checkpoint_id": "c"})
    recorder = records.RunRecorder(run, tmp_path / "out", interval=1, max_steps=4, state={})
    assert not recorder.save_point(3)
    assert run.checkpoints.steps() == []


def test_an_async_step_is_recorded_by_the_drivers_recorder(tmp_path, caplog):
    """Checked against the schema, written, and logged as ``step n/N key value`` like the
    step-by-step journeys' lines."""
    run = Run(tmp_path / "async", config_hash="h", resume=None, journey="async_grpo")
    run.path.mkdir()
    record = {
        "step": 2, "policy_version": 2, "loss": 0.25, "mismatch_kl/mean": 0.0,
        "grad_norm": 1.5, "samples": 16, "trainable_tokens": 128, "advantage/mean": 0.0,
        "envs": ["cortex-arith"], "time/step": 3.0, "time/wait_for_batch": 0.5,
        "time/wait_for_sync": 0.0, "time/train": 2.0, "time/save_ckpt": 0.5,
        "reward/mean": 0.5, "off_policy/max": 1,
    }  # fmt: skip
    with caplog.at_level(logging.INFO, logger=driver.log.name):
        driver.record_step(run, record, 8, records.LOG_KEYS, schema=records.METRICS_SCHEMA)
    assert run.read_metrics() == [record]
    assert "step 2/8 reward/mean 0.500 loss 0.2500 off_policy/max 1" in caplog.text
    with pytest.raises(ValueError, match="loss"):  # a bad record is refused, nothing written
        driver.record_step(run, {**record, "step": 3, "loss": "x"}, 8, records.LOG_KEYS,
                           schema=records.METRICS_SCHEMA)  # fmt: skip
    assert len(run.read_metrics()) == 1


def test_a_missing_value_is_left_out_of_the_step_line():
    line = driver.step_line({"loss": None, "reward/mean": 0.5}, records.LOG_KEYS)
    assert line == "reward/mean 0.500"


def test_episode_lag_is_measured_from_the_drivers_sampling_version():
    for step in (1, 2, 5):
        assert step_records.episode_lag(step, None) == 0
        assert step_records.episode_lag(step, driver.sampling_version(step)) == 0
        assert step_records.episode_lag(step, 0) == driver.sampling_version(step)
        assert step_records.episode_lag(step, step + 3) == 0  # floored, as prime-rl does


def test_the_async_loop_is_only_process_supervision():
    """loop.py starts, watches and stops prime-rl's processes (<= 300 lines): it writes no
    record or resume point of its own and builds no TOML itself."""
    source = LOOP.read_text()
    assert len(source.splitlines()) <= 300
    called = {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
    }
    for own in ("record_metrics", "save", "checkpoint", "_table", "_toml", "dumps"):
        assert own not in called, f"loop.py calls {own}(): that belongs to the shared lifecycle"
    assert "cortex_recipes.tito" not in source
