"""A sub-job started by the pre-started (spare) worker is the same worker: same results as one
started for it, its output in its own log, its start failures reported the same way."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from cortex_recipes.local import LocalBackend
from cortex_recipes.local.worker_spawn import SPARE_ENV, ZYGOTE_ENV

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


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def command_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_a_sub_job_on_the_spare_trains_bitwise_like_one_on_its_own_process(tmp_path, monkeypatch):
    with LocalBackend(tmp_path / "spare", threads=1) as backend:
        client = backend.client(max_retries=0, poll_interval=0.02, poll_max_interval=0.2)
        job = client.create_job([training()])
        client.wait_for_job(job)
        pid = client.get_job(job)["sub_jobs"][0]["info"]["pid"]
        # forked by the zygote (its command line), re-parented to the server
        assert "cortex_recipes.local.zygote" in command_of(pid)
        assert parent_of(pid) == backend.process.pid
        client.cancel_job(job)
        spared = two_steps(client)
        log = wait_for_line(backend, TOOK_SPARE)
        assert OWN_PROCESS not in log
        assert (tmp_path / "spare" / "spares" / "zygote.log").exists()
    monkeypatch.setenv(ZYGOTE_ENV, "0")  # spares started as processes of their own
    with LocalBackend(tmp_path / "spawned", threads=1) as backend:
        client = backend.client(max_retries=0, poll_interval=0.02, poll_max_interval=0.2)
        spawned = two_steps(client)
        log = wait_for_line(backend, TOOK_SPARE)
        assert not (tmp_path / "spawned" / "spares" / "zygote.log").exists()
    monkeypatch.setenv(SPARE_ENV, "0")
    with LocalBackend(tmp_path / "own", threads=1) as backend:
        client = backend.client(max_retries=0, poll_interval=0.02, poll_max_interval=0.2)
        own = two_steps(client)
        log = wait_for_line(backend, OWN_PROCESS)
        assert TOOK_SPARE not in log
        assert not (tmp_path / "own" / "spares").exists()
    assert spared[0] == own[0] == spawned[0]  # bitwise: the same losses at both steps
    assert torch.equal(spared[1], own[1]) and torch.equal(spawned[1], own[1])


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
        # the first of the two spares forked at start took the sub-job: its empty log went
        # with it; the other still waits (so no replacement is forked)
        assert not (tmp_path / "spares" / "spare-0.log").exists()
        spare_logs = sorted((tmp_path / "spares").glob("spare-*.log"))
        assert [p.name for p in spare_logs] == ["spare-1.log"]
        assert all("failed to start" not in p.read_text() for p in spare_logs)


def test_a_dead_zygote_leaves_sub_jobs_starting_as_processes(tmp_path):
    with LocalBackend(tmp_path, threads=1) as backend:
        client = backend.client(max_retries=0, poll_interval=0.02, poll_max_interval=0.2)
        first = client.create_job([training()])
        client.wait_for_job(first)  # took a forked spare; its replacement is being forked
        found = re.search(r"worker zygote started \(pid (\d+)\)", server_log(backend))
        assert found, "the server names its zygote"
        os.kill(int(found.group(1)), signal.SIGKILL)
        jobs = [client.create_job([training()]) for _ in range(3)]  # more than the spares left
        for job in jobs:
            client.wait_for_job(job)
            client.cancel_job(job)
        log = server_log(backend)
        assert OWN_PROCESS in log or "spares start as processes" in log
        client.cancel_job(first)
