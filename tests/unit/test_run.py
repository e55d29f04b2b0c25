"""The run lifecycle (cortex_recipes.run): run folders, if_exists, checkpoints, SDK errors, cancel."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from cortex_recipes.cortex_client import CortexCallError, ExplainedClient
from cortex_recipes.reconnect import is_recoverable
from cortex_recipes.run import CheckpointError, RunCheckpoints, open_run

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Profile:
    name: str = "p"
    config_hash: str = "hash-a"
    raw: dict = field(default_factory=lambda: {"name": "p"})


def sft_record(step: int) -> dict:
    """The smallest record the sft metrics schema accepts."""
    return {
        "step": step, "loss": 1.0, "supervised_tokens": 4, "loss_weight_sum": 4.0,
        "dropped_examples": 0, "truncated_examples": 0, "grad_norm": None, "lr": 1e-4,
        "time/step": 0.1,
    }  # fmt: skip


def trainer(job="job-1", cp="cp_1"):
    return {"job_id": job, "checkpoint_id": cp}


def _http_error(status: int, body: dict | None = None) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    response.reason = "Bad Request"
    response._content = json.dumps(body).encode() if body is not None else b""
    return requests.HTTPError(f"{status} Client Error: Bad Request for url: x", response=response)


def test_checkpoints_are_atomic_and_incomplete_ones_ignored(tmp_path):
    store = RunCheckpoints(tmp_path / "checkpoints")
    assert store.latest() is None
    store.save(2, {"trainer": trainer()})
    store.save(4, {"trainer": trainer()})
    (tmp_path / "checkpoints/step_6").mkdir()  # crashed mid-save: no state.json
    (tmp_path / "checkpoints/step_6/.state.json.tmp").write_text("{")
    assert store.steps() == [2, 4]
    assert store.latest()["step"] == 4
    (tmp_path / "checkpoints/step_4/state.json").write_text(json.dumps({"step": 4}))
    with pytest.raises(CheckpointError, match="trainer"):
        store.latest()


def test_a_new_run_lives_in_runs_journey_run_name_and_records_config_and_revision(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    run = open_run("sft", Profile(), {"steps": 3}, run_name="first")
    assert run.path == Path("runs/sft/first") and run.path.is_dir()
    recorded = json.loads((run.path / "config.json").read_text())
    assert recorded["config_hash"] == "hash-a" and recorded["config"] == {"steps": 3}
    assert "git_revision" in recorded and recorded["profile"] == {"name": "p"}
    assert open_run("sft", Profile(), {}).path.name == "p"  # default: the profile name


def test_if_exists_fail_refuses_and_overwrite_starts_again(tmp_path):
    run = open_run("sft", Profile(), {}, log_path=str(tmp_path))
    run.metrics(**sft_record(1))
    run.summary({"done": True})
    with pytest.raises(CheckpointError, match="if_exists=resume"):
        open_run("sft", Profile(), {}, log_path=str(tmp_path), if_exists="fail")
    assert (tmp_path / "metrics.jsonl").exists()  # nothing was touched
    fresh = open_run("sft", Profile(), {}, log_path=str(tmp_path), if_exists="overwrite")
    assert fresh.read_metrics() == [] and fresh.finished is None and fresh.resume is None
    with pytest.raises(CheckpointError, match="accepted: resume, overwrite, fail"):
        open_run("sft", Profile(), {}, log_path=str(tmp_path), if_exists="replace")


def test_resume_of_a_finished_run_returns_its_summary_and_changes_nothing(tmp_path):
    run = open_run("sft", Profile(), {}, log_path=str(tmp_path))
    run.metrics(**sft_record(1))
    run.summary({"final_loss": 1.5})
    again = open_run("sft", Profile(), {}, log_path=str(tmp_path))
    assert again.finished["final_loss"] == 1.5
    assert [m["step"] for m in again.read_metrics()] == [1]


def test_resume_continues_after_the_newest_checkpoint_and_drops_later_records(tmp_path):
    run = open_run("sft", Profile(), {}, log_path=str(tmp_path))
    for step in range(1, 6):
        run.metrics(**sft_record(step))
        run.checkpoint(step=step)
    run.checkpoints.save(3, {"config_hash": "hash-a", "trainer": trainer(), "evals": [1]})
    resumed = open_run("sft", Profile(), {}, log_path=str(tmp_path))
    assert resumed.resumed_from_step == 3 and resumed.resume["evals"] == [1]
    assert [m["step"] for m in resumed.read_metrics()] == [1, 2, 3]
    lines = (tmp_path / "checkpoints.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]


def finished_run(tmp_path: Path, steps: int, checkpoint_at: int | None) -> None:
    run = open_run("sft", Profile(), {}, log_path=str(tmp_path))
    for step in range(1, steps + 1):
        run.metrics(**sft_record(step))
        run.checkpoint(step=step)
    if checkpoint_at is not None:
        run.checkpoints.save(checkpoint_at, {"config_hash": "hash-a", "trainer": trainer()})
    run.summary({"final_loss": 1.5, "steps": steps})


def test_more_steps_continue_a_finished_run_from_its_newest_checkpoint(tmp_path):
    """steps=6 on a finished 4-step run (issue 47, item 5): not the old summary as if it were
    the new one, but the run again from its checkpoint, its later records dropped."""
    finished_run(tmp_path, 4, checkpoint_at=3)
    more = open_run("sft", Profile(), {}, log_path=str(tmp_path), steps=6)
    assert more.finished is None and more.resumed_from_step == 3
    assert [m["step"] for m in more.read_metrics()] == [1, 2, 3]
    assert not (tmp_path / "summary.json").exists()


def test_the_same_or_fewer_steps_return_the_finished_runs_summary(tmp_path):
    finished_run(tmp_path, 4, checkpoint_at=3)
    for steps in (None, 4, 2):
        again = open_run("sft", Profile(), {}, log_path=str(tmp_path), steps=steps)
        assert again.finished["final_loss"] == 1.5
    assert [m["step"] for m in again.read_metrics()] == [1, 2, 3, 4]


def test_more_steps_on_a_finished_run_without_a_checkpoint_say_why_and_how(tmp_path):
    finished_run(tmp_path, 4, checkpoint_at=None)
    with pytest.raises(CheckpointError) as err:
        open_run("sft", Profile(), {}, log_path=str(tmp_path), steps=6)
    message = str(err.value)
    assert "finished run of 4 steps with no resumable checkpoint" in message
    assert "steps=6 cannot continue it" in message and "if_exists=overwrite" in message
    assert (tmp_path / "summary.json").is_file()  # nothing touched
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 4


def test_resume_with_a_changed_profile_names_both_hashes(tmp_path):
    open_run("sft", Profile(), {}, log_path=str(tmp_path)).metrics(**sft_record(1))
    with pytest.raises(CheckpointError, match="profile hash hash-a.*hashes to hash-b"):
        open_run("sft", Profile(config_hash="hash-b"), {}, log_path=str(tmp_path))


def test_an_unfinished_run_without_a_checkpoint_is_refused_not_restarted(tmp_path):
    open_run("sft", Profile(), {}, log_path=str(tmp_path)).metrics(**sft_record(1))
    with pytest.raises(CheckpointError, match="no checkpoint to resume from.*overwrite"):
        open_run("sft", Profile(), {}, log_path=str(tmp_path))
    assert (tmp_path / "metrics.jsonl").read_text().strip()


class FakeClient:
    def __init__(self, fail_with=None):
        self.fail_with = fail_with
        self.cancelled = []

    def create_job(self, sub_jobs):
        return "job-1"

    def get_job(self, job_id):  # ExplainedClient.wait_for_job polls it
        return {
            "status": "running",
            "sub_jobs": [{"job_type": "training", "sub_job_id": f"{job_id}:training:0"}],
        }

    def forward_backward(self, job_id, data):
        raise self.fail_with

    def cancel_job(self, job_id):
        self.cancelled.append(job_id)


def test_an_sdk_http_error_names_the_operation_sub_job_and_server_message():
    body = {"message": "processing.config has unknown keys ['eps']", "code": "bad_field"}
    client = ExplainedClient(FakeClient(fail_with=_http_error(400, body)))
    job = client.create_job([])
    client.wait_for_job(job)
    with pytest.raises(CortexCallError) as caught:
        client.forward_backward(job, b"")
    text = str(caught.value)
    assert "forward_backward on sub-job job-1:training:0" in text
    assert "HTTP 400 (code bad_field)" in text and "unknown keys ['eps']" in text
    assert "Client Error" not in text
    assert not is_recoverable(caught.value)


def test_a_wrapped_transient_error_is_still_recoverable():
    client = ExplainedClient(FakeClient(fail_with=_http_error(503, {"message": "restarting"})))
    with pytest.raises(CortexCallError) as caught:
        client.forward_backward("job-1", b"")
    assert is_recoverable(caught.value)


def test_jobs_left_open_are_cancelled_and_cancelled_ones_are_not_cancelled_twice():
    fake = FakeClient()
    client = ExplainedClient(fake)
    first = client.create_job([])
    client.cancel_job(first)
    client.create_job([])
    client.cancel_open_jobs()
    assert fake.cancelled == ["job-1", "job-1"]  # once by the run, once for the open one
    client.cancel_open_jobs()
    assert len(fake.cancelled) == 2


def test_recoverable_errors_are_lost_backends_not_bad_requests_or_unknown_jobs():
    assert is_recoverable(requests.ConnectionError("refused"))
    assert is_recoverable(_http_error(503))
    assert not is_recoverable(_http_error(404))  # the job may still run on a hosted endpoint
    assert not is_recoverable(_http_error(400))
    assert not is_recoverable(ValueError("bad field"))
    try:
        try:
            raise requests.ConnectionError("reset")
        except requests.ConnectionError as inner:
            raise RuntimeError("a rollout worker failed") from inner
    except RuntimeError as outer:
        assert is_recoverable(outer)


def test_a_dead_local_backend_is_recoverable_for_the_journeys_that_reconnect():
    """The async journey restarts a local backend that died (endpoint.guard_backend raises
    BackendDied at the next request); the others stop with its one-line message."""
    from cortex_recipes.endpoint import BackendDied

    assert is_recoverable(BackendDied("the local backend (pid 1) was killed by signal 9"))
