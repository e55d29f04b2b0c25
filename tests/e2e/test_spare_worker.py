"""A sub-job started by the pre-started (spare) worker is the same worker: same results as one
started for it, its output in its own log, its start failures reported the same way."""

from __future__ import annotations

import time

import pytest
import torch

from cortex_recipes.local import LocalBackend
from cortex_recipes.local.worker_spawn import SPARE_ENV

from .conftest import training
from .test_local_backend import batch, ce_frame

pytestmark = pytest.mark.e2e

TOOK_SPARE = "a pre-started worker took it"
OWN_PROCESS = "after its process started"


def two_steps(client) -> tuple[list[float], torch.Tensor]:
    job = client.create_job(
        [training(lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]})]
    )
    client.wait_for_job(job)
    ids = batch(7)
    weights = torch.ones(ids.shape)
    weights[:, -1] = 0.0
    losses, logprobs = [], None
    for _ in range(2):
        result = client.poll_request(job, client.forward_backward(job, ce_frame(ids, weights)))
        losses.append(result["avg_loss"])
        logprobs = result["post_process_outputs"]["logprobs"]
        client.poll_request(job, client.step(job))
    client.cancel_job(job)
    return losses, logprobs


def server_log(backend: LocalBackend) -> str:
    return backend.log_path.read_text()


def wait_for_line(backend: LocalBackend, text: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while text not in server_log(backend):
        assert time.monotonic() < deadline, f"{text!r} not in {backend.log_path}"
        time.sleep(0.1)
    return server_log(backend)


def test_a_sub_job_on_the_spare_trains_bitwise_like_one_on_its_own_process(tmp_path, monkeypatch):
    with LocalBackend(tmp_path / "spare", threads=1) as backend:
        client = backend.client(max_retries=0, poll_interval=0.02, poll_max_interval=0.2)
        spared = two_steps(client)
        log = wait_for_line(backend, TOOK_SPARE)
        assert OWN_PROCESS not in log
    monkeypatch.setenv(SPARE_ENV, "0")
    with LocalBackend(tmp_path / "own", threads=1) as backend:
        client = backend.client(max_retries=0, poll_interval=0.02, poll_max_interval=0.2)
        own = two_steps(client)
        log = wait_for_line(backend, OWN_PROCESS)
        assert TOOK_SPARE not in log
        assert not (tmp_path / "own" / "spares").exists()
    assert spared[0] == own[0]  # bitwise: the same losses at both steps
    assert torch.equal(spared[1], own[1])


def test_a_spare_that_fails_to_start_its_sub_job_fails_the_job_with_the_reason_in_its_log(
    tmp_path,
):
    with LocalBackend(tmp_path, threads=1) as backend:
        client = backend.client(max_retries=0, poll_interval=0.02, poll_max_interval=0.2)
        bad = training(lora={"r": 4, "lora_alpha": 8, "target_modules": ["no_such_proj"]})
        job = client.create_job([bad])
        with pytest.raises(RuntimeError, match="terminal state 'failed'.*no_such_proj"):
            client.wait_for_job(job)
        assert TOOK_SPARE not in server_log(backend)  # it never became ready
        job_logs = list((tmp_path / "jobs" / job / "run").glob("*.log"))
        assert len(job_logs) == 1
        assert "failed to start" in job_logs[0].read_text()  # the worker's traceback, here
        # the first of the two spares started with the server took the sub-job: its empty log
        # went with it; the other still waits (so no replacement starts)
        assert not (tmp_path / "spares" / "spare-early-0.log").exists()
        spare_logs = list((tmp_path / "spares").glob("*.log"))
        assert [p.name for p in spare_logs] == ["spare-early-1.log"]
        assert all("failed to start" not in p.read_text() for p in spare_logs)
