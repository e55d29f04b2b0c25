"""ExplainedClient's job waits: ``terminated`` is final (the SDK's ``wait_for_job`` would poll it
until its timeout), a failed poll of an ended job names the state and reason, and every job is
created with an idle timeout unless the caller names one."""

from __future__ import annotations

import pytest

from cortex_recipes import cortex_client
from cortex_recipes.cortex_client import (
    DEFAULT_IDLE_TIMEOUT_S,
    LOCAL_JOB_POLL_S,
    CortexCallError,
    ExplainedClient,
    JobEnded,
)
from cortex_recipes.reconnect import is_recoverable

pytestmark = pytest.mark.unit


class Jobs:
    """An SDK client whose job walks ``states`` (the last one repeats)."""

    poll_interval, poll_timeout, poll_backoff_multiplier, poll_max_interval = 0.001, 5.0, 1.0, 0.001

    def __init__(self, *states: str, reason: str = ""):
        self.states, self.reason, self.seen = list(states), reason, []
        self.created: list[dict] = []

    def get_job(self, job_id):
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        self.seen.append(state)
        sub_jobs = [{"job_type": "training", "sub_job_id": f"{job_id}:training:0"}]
        return {"job_id": job_id, "status": state, "reason": self.reason, "sub_jobs": sub_jobs}

    def create_job(
        self, sub_jobs, job_id=None, experiment_name=None, hardware=None, idle_timeout_seconds=None
    ):
        self.created.append({"idle_timeout_seconds": idle_timeout_seconds})
        return "job-1"

    def poll_request(self, job_id, request_id):
        raise RuntimeError(f"Request {request_id} ended with state 'failed': worker gone")


def test_wait_for_job_returns_on_running_after_the_hosted_start_states():
    sdk = Jobs("pending", "placing", "initializing", "JOB_STATE_RUNNING")
    client = ExplainedClient(sdk)
    job = client.wait_for_job("job-1")
    assert sdk.seen == ["pending", "placing", "initializing", "JOB_STATE_RUNNING"]
    assert job["job_id"] == "job-1"
    assert client._sub_jobs["job-1"] == {"training": "job-1:training:0"}


@pytest.mark.parametrize("state", ["terminated", "JOB_STATE_TERMINATED", "failed", "canceled"])
def test_wait_for_job_raises_on_a_final_state_naming_job_state_and_reason(state):
    client = ExplainedClient(Jobs("placing", state, reason="idle for 300 s"))
    with pytest.raises(JobEnded) as ended:
        client.wait_for_job("job-7")
    normal = state.lower().removeprefix("job_state_")
    assert ended.value.state == normal and isinstance(ended.value, CortexCallError)
    assert f"wait_for_job failed: job job-7 is {normal}: idle for 300 s" in str(ended.value)
    assert ("idle_timeout_seconds" in str(ended.value)) == (normal == "terminated")
    assert not is_recoverable(ended.value)


@pytest.mark.parametrize("connection", [None, "cortex.json"])
def test_wait_for_job_polls_the_local_backend_often_and_a_hosted_endpoint_as_the_sdk_does(
    connection, monkeypatch
):
    sdk = Jobs(*["initializing"] * 6, "running")
    sdk.poll_interval, sdk.poll_backoff_multiplier, sdk.poll_max_interval = 0.5, 2.0, 6.0
    sdk.poll_timeout = 600.0
    slept: list[float] = []
    monkeypatch.setattr(cortex_client.time, "sleep", slept.append)
    ExplainedClient(sdk, connection=connection).wait_for_job("job-1")
    if connection is None:  # the local backend: a loopback question every 0.1 s
        assert slept == [LOCAL_JOB_POLL_S] * 6
    else:  # the SDK's interval and backoff
        assert slept == [0.5, 1.0, 2.0, 4.0, 6.0, 6.0]


def test_wait_for_job_times_out_with_the_sdk_s_poll_timeout():
    sdk = Jobs("initializing")
    sdk.poll_timeout = 0.05
    with pytest.raises(TimeoutError, match="job-1 did not become running within 0.05s"):
        ExplainedClient(sdk).wait_for_job("job-1")


def test_a_failed_poll_of_a_terminated_job_names_terminated_and_the_idle_timeout():
    client = ExplainedClient(Jobs("terminated", reason="idle for 300 s"))
    with pytest.raises(JobEnded) as ended:
        client.poll_request("job-1", "req-1")
    text = str(ended.value)
    assert "poll_request failed: job job-1 is terminated: idle for 300 s" in text
    assert "idle_timeout_seconds" in text and "req-1" in text


def test_a_failed_poll_of_a_running_job_stays_the_sdk_s_error():
    with pytest.raises(RuntimeError, match="worker gone") as failed:
        ExplainedClient(Jobs("running")).poll_request("job-1", "req-1")
    assert not isinstance(failed.value, JobEnded)


def test_create_job_sends_the_default_idle_timeout_unless_the_caller_names_one():
    sdk = Jobs("running")
    client = ExplainedClient(sdk)
    client.create_job([])
    client.create_job([], idle_timeout_seconds=0)
    client.create_job([], "job-2", None, None, 900)
    assert [c["idle_timeout_seconds"] for c in sdk.created] == [DEFAULT_IDLE_TIMEOUT_S, 0, 900]
    assert 300 <= DEFAULT_IDLE_TIMEOUT_S <= 604_800


def test_create_job_sends_no_idle_timeout_to_a_client_that_takes_none():
    class Old:
        def create_job(self, sub_jobs):
            return "job-1"

    assert ExplainedClient(Old()).create_job([]) == "job-1"
