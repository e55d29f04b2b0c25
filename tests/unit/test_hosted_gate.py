"""Hosted-conformance mode without a model: the PAT headers (``pat-headers``), the create-job
timeouts and the idle clock (``idle-timeout``), each against the default mode."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from cortex_recipes.local import idle
from cortex_recipes.local.app import PREFIX, create_app
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.hosted_gate import TOKEN_ENV, job_of, pat_headers, server_token
from cortex_recipes.local.jobs import Job, JobRegistry
from cortex_recipes.local.request_store import RequestStore

pytestmark = pytest.mark.unit

JOBS = PREFIX.format(database="LOCAL", schema="PUBLIC")
TOKEN = "t0ken-" + "x" * 20


@pytest.fixture
def hosted_http(tmp_path):
    with TestClient(create_app(tmp_path, device="cpu", hosted=True, api_token=TOKEN)) as http:
        yield http


def test_hosted_mode_refuses_a_request_without_the_pat_headers(hosted_http):
    missing = hosted_http.get(JOBS)
    assert missing.status_code == 401
    assert "header Authorization is missing" in missing.json()["message"]
    assert "rule pat-headers" in missing.json()["message"]
    bearer_only = hosted_http.get(JOBS, headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer_only.status_code == 401
    assert "X-Snowflake-Authorization-Token-Type is missing" in bearer_only.json()["message"]
    wrong_type = hosted_http.get(
        JOBS, headers={**pat_headers(TOKEN), "X-Snowflake-Authorization-Token-Type": "OAUTH"}
    )
    assert wrong_type.status_code == 401
    assert "'OAUTH'; accepted: PROGRAMMATIC_ACCESS_TOKEN" in wrong_type.json()["message"]
    assert hosted_http.get(JOBS, headers=pat_headers(TOKEN)).json() == {"jobs": []}
    assert hosted_http.get("/healthz").status_code == 200  # outside /api/v2: open


def test_a_wrong_token_is_refused_without_echoing_either_token(hosted_http):
    for value in ("Bearer not-the-token", "Basic abc", "Bearer "):
        response = hosted_http.get(JOBS, headers={**pat_headers(TOKEN), "Authorization": value})
        assert response.status_code == 401
        message = response.json()["message"]
        assert "header Authorization" in message and "value not shown" in message
        assert "not-the-token" not in message and TOKEN not in message


def test_the_default_mode_needs_no_headers(tmp_path):
    with TestClient(create_app(tmp_path, device="cpu")) as http:
        assert http.get(JOBS).json() == {"jobs": []}


def test_a_server_without_a_given_token_generates_one_and_never_logs_it(caplog):
    caplog.set_level("INFO")
    token = server_token(None)
    assert len(token) >= 32 and server_token(None) != token
    assert TOKEN_ENV in caplog.text and token not in caplog.text


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("idle_timeout_seconds", 5, "0 (never idle-terminated) or an integer 300..604800"),
        ("idle_timeout_seconds", 604_801, "an integer 300..604800"),
        ("idle_timeout_seconds", "600", "an integer 300..604800"),
        ("idle_timeout_seconds", True, "an integer 300..604800"),
        ("pending_timeout_seconds", 0, "accepted: an integer 300..604800"),
    ],
)
def test_hosted_mode_checks_the_create_job_timeouts(hosted_http, field, value, accepted):
    body = {"sub_job_configs": [], field: value}
    response = hosted_http.post(JOBS, json=body, headers=pat_headers(TOKEN))
    assert response.status_code == 400
    message = response.json()["message"]
    assert f"{field}={value!r}" in message and accepted in message
    assert "rule idle-timeout" in message


def test_the_timeouts_in_range_are_taken():
    assert idle.hosted_idle_timeout({}) == idle.DEFAULT_IDLE_TIMEOUT_S == 1800
    assert idle.hosted_idle_timeout({"idle_timeout_seconds": 0}) == 0
    body = {"idle_timeout_seconds": 604_800, "pending_timeout_seconds": 300}
    assert idle.hosted_idle_timeout(body) == 604_800


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "fast"])
def test_a_bad_idle_clock_scale_is_named(monkeypatch, value):
    monkeypatch.setenv(idle.IDLE_CLOCK_SCALE_ENV, value)
    with pytest.raises(ValueError, match=f"CORTEX_RECIPES_IDLE_CLOCK_SCALE='{value}'"):
        idle.idle_clock_scale()


def test_only_requests_below_a_job_stamp_its_idle_clock():
    assert job_of(f"{JOBS}/job-1/forward-backward") == "job-1"
    assert job_of(f"{JOBS}/job-1/requests/r-1") == "job-1"
    assert job_of(f"{JOBS}/job-1") is None  # reading the job does not keep it alive
    assert job_of(f"{JOBS}/job-1:cancel") is None
    assert job_of(JOBS) is None and job_of("/healthz") is None


def _running(registry: JobRegistry, job_id: str, idle_timeout_s: int) -> Job:
    job = Job(
        job_id=job_id,
        specs=[],
        created_at=time.time(),
        requests=RequestStore(job_id, result_chunk_bytes=1 << 20, poll_wait_s=1.0),
        devices={},
        status="running",
        idle_timeout_s=idle_timeout_s,
    )
    registry.jobs[job_id] = job
    return job


def test_an_idle_job_ends_terminated_and_a_touched_or_exempt_one_runs_on(tmp_path, monkeypatch):
    monkeypatch.setenv(idle.IDLE_CLOCK_SCALE_ENV, "1000")  # 300 s pass in 0.3 s
    registry = JobRegistry(tmp_path, device="cpu", hosted=True)
    try:
        idle_job = _running(registry, "job-idle", 300)
        busy = _running(registry, "job-busy", 300)
        never = _running(registry, "job-never", 0)
        deadline = time.monotonic() + 10
        while idle_job.status == "running" and time.monotonic() < deadline:
            registry.touch("job-busy")
            time.sleep(0.02)
        assert idle_job.status == "terminated"
        assert idle_job.reason.startswith("idle for 300 s: no request for idle_timeout_seconds")
        assert "rule idle-timeout" in idle_job.reason
        assert busy.status == never.status == "running"
        with pytest.raises(BackendError) as refused:
            registry.require_running("job-idle")
        assert refused.value.status == 410 and refused.value.code == "job_terminated"
        assert "job job-idle is terminated: idle for 300 s" in refused.value.message
        assert registry.cancel("job-idle").status == "terminated"  # final, like failed
    finally:
        registry.shutdown()


def test_the_default_mode_never_ends_an_idle_job(tmp_path, monkeypatch):
    monkeypatch.setenv(idle.IDLE_CLOCK_SCALE_ENV, "1000")
    registry = JobRegistry(tmp_path, device="cpu")
    try:
        job = _running(registry, "job-1", 300)
        time.sleep(0.6)
        assert job.status == "running"
    finally:
        registry.shutdown()
