"""Hosted-conformance mode (``serve --hosted``, the ``local-hosted`` connection): each rule of
cortex_recipes.local.hosted refuses or ignores what hosted Cortex documents it does not accept,
the default mode still accepts it, and OPD's teacher scoring runs end to end in that mode."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests
import torch
from cortex_training import CortexTrainingClient, wire

from cortex_recipes import raw_forward, save_results
from cortex_recipes.cortex_client import CortexCallError, ExplainedClient, JobEnded
from cortex_recipes.local import LocalBackend
from cortex_recipes.local.hosted import RULES
from cortex_recipes.local.idle import IDLE_CLOCK_SCALE_ENV
from tests import extras
from tests.e2e.conftest import TINY, inference, training
from tests.e2e.hosted import hosted_mode_ran, metrics, run_hosted

pytestmark = pytest.mark.e2e

BASE = "api/v2/databases/LOCAL/schemas/PUBLIC/cortex-training"
# The module's backend counts idle time 150 times fast: hosted's shortest idle timeout (300 s)
# passes in 2 s. The shared job is exempt (idle_timeout_seconds=0).
IDLE_CLOCK_SCALE = 150
START_ORDER = ("pending", "placing", "initializing", "running")


@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv(IDLE_CLOCK_SCALE_ENV, str(IDLE_CLOCK_SCALE))  # read by the server at start
        running = LocalBackend(tmp_path_factory.mktemp("hosted"), threads=1, hosted=True).start()
    try:
        client = running.client(max_retries=0, poll_interval=0.02, poll_timeout=300)
        yield running, client
        client.close()
    finally:
        running.stop()


@pytest.fixture(scope="module")
def job(hosted):
    _, client = hosted
    job_id = client.create_job([training(), inference()], idle_timeout_seconds=0)
    client.wait_for_job(job_id)
    return job_id


def post(backend, job_id: str, path: str, body: dict) -> requests.Response:
    """A raw request, with the PAT headers the hosted mode needs."""
    return requests.post(
        f"{backend.base_url}/{BASE}/{job_id}/{path}",
        json=body,
        headers=backend.auth_headers(),
        timeout=60,
    )


def watch_start(client, job_id: str, timeout: float = 180) -> list[str]:
    """The states ``job_id`` reports (polled every 20 ms, repeats dropped) until it runs."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = client.get_job(job_id)["status"]
        if not seen or seen[-1] != state:
            seen.append(state)
        if state not in START_ORDER[:-1]:
            return seen
        time.sleep(0.02)
    raise TimeoutError(f"job {job_id} still {seen[-1]} after {timeout}s (seen {seen})")


@pytest.fixture(scope="module")
def idle_job(hosted):
    """A job created through ExplainedClient with hosted's shortest idle timeout: the states it
    walked while it started, then left without a request until it ends."""
    _, client = hosted
    job_id = ExplainedClient(client).create_job([inference()], idle_timeout_seconds=300)
    return job_id, watch_start(client, job_id)


@pytest.fixture(scope="module")
def terminated_job(hosted, idle_job):
    """``idle_job`` once it has ended (read with GET /{job_id}, which does not keep it alive)."""
    _, client = hosted
    job_id, _ = idle_job
    started = time.monotonic()
    while (job := client.get_job(job_id))["status"] == "running":
        assert time.monotonic() - started < 60, "an idle job with a 300 s timeout kept running"
        time.sleep(0.05)
    return job_id, job, time.monotonic() - started


def frame() -> bytes:
    ids = torch.arange(10, 22).reshape(2, 6)
    return wire.dumps(
        {"args": (), "kwargs": {"input_ids": ids}, "processing": {"post": ["compute_logprobs"]}}
    )


def test_the_wrapped_forward_is_refused_and_the_raw_one_scores(hosted, job):
    backend, client = hosted
    trainer = f"{job}:training:0"
    with pytest.raises(requests.HTTPError) as info:
        client.forward(job, frame(), sub_job_id=trainer)
    message = info.value.response.json()["message"]
    assert info.value.response.status_code == 400
    assert "payload.payload_b64" in message and "rule forward-raw-dssst1" in message
    result = raw_forward.forward(client, job, frame(), sub_job_id=trainer)
    assert raw_forward.logprobs_of(result).shape == (2, 6)  # wherever this mode put them


def test_a_callers_checkpoint_id_is_ignored(hosted, job):
    _, client = hosted
    wanted = "cp_" + "d" * 32
    saved = client.poll_request(job, client.save(job, checkpoint_id=wanted))
    first = save_results.checkpoint_id(saved)  # the id is in stage_path in this mode
    assert first.startswith("cp_") and first != wanted
    assert wanted not in saved["stage_path"]
    again = client.poll_request(job, client.save(job, checkpoint_id=wanted))
    assert save_results.checkpoint_id(again) not in (wanted, first)  # no 409 either


def test_a_model_folder_is_refused(hosted):
    from cortex_recipes.models import resolve_model_path

    _, client = hosted
    folder = str(resolve_model_path(TINY))
    with pytest.raises(requests.HTTPError) as info:
        client.create_job([training(folder)])
    assert info.value.response.status_code == 400
    message = info.value.response.json()["message"]
    assert "sub_job_configs[0].model_name=" in message and "rule no-model-folders" in message


def test_the_local_operations_are_unknown(hosted, job):
    backend, _ = hosted
    for op in ("pause-generation", "resume-generation"):
        response = post(
            backend, job, "operation", {"operation_type": op, "sub_job_id": f"{job}:sampling:0"}
        )
        assert response.status_code == 400
        message = response.json()["message"]
        assert f"operation_type='{op}' is not supported" in message
        assert (
            "rule no-local-operations" in message
            and "pause-generation" not in message.split("accepted:")[1].split("(")[0]
        )


def test_the_default_mode_accepts_what_hosted_mode_refuses(client):
    """Each rule is a difference between the modes: the default backend takes them all: a
    client without PAT headers, a model folder, timeouts outside hosted's ranges (ignored), a
    start straight from pending to running, the wrapped forward, a caller's checkpoint id."""
    from cortex_recipes.models import resolve_model_path

    assert "Authorization" not in client._session.headers
    sub_jobs = [training(str(resolve_model_path(TINY))), inference()]
    body = {"sub_job_configs": [s.to_wire() for s in sub_jobs], "idle_timeout_seconds": 5}
    job = client.create_job_from_body({**body, "pending_timeout_seconds": 1})["job_id"]
    try:
        assert set(watch_start(client, job)) <= {"pending", "running"}
        wrapped = client.forward(job, frame(), sub_job_id=f"{job}:training:0")
        assert client.poll_request(job, wrapped["request_id"])["post_process_outputs"]
        wanted = "cp_" + "e" * 32
        assert (
            client.poll_request(job, client.save(job, checkpoint_id=wanted))["checkpoint_id"]
            == wanted
        )
    finally:
        client.cancel_job(job)


def test_every_api_request_needs_the_pat_headers(hosted, job):
    backend, client = hosted
    bare = CortexTrainingClient(
        base_url=backend.base_url, database="LOCAL", schema="PUBLIC", max_retries=0
    )
    with pytest.raises(requests.HTTPError) as refused:
        bare.get_job(job)
    assert refused.value.response.status_code == 401
    message = refused.value.response.json()["message"]
    assert "header Authorization is missing" in message and "rule pat-headers" in message
    assert requests.get(f"{backend.base_url}/healthz", timeout=10).ok  # outside /api/v2
    assert client.get_job(job)["status"] == "running"  # LocalBackend.client sends them
    token = backend.auth_headers()["Authorization"].removeprefix("Bearer ")
    server = backend.process.pid
    assert token not in Path(f"/proc/{server}/cmdline").read_text()  # passed in the environment
    assert token not in backend.log_path.read_text()
    workers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == server]
    assert workers, "the shared job's workers are the server's children"
    for worker in workers:  # the server took it out of the environment its workers inherit
        assert token.encode() not in (worker / "environ").read_bytes()


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def test_a_new_job_walks_the_hosted_start_states(idle_job):
    _, states = idle_job
    assert states[-1] == "running", states
    assert {"placing", "initializing"} <= set(states), states
    assert states == sorted(states, key=START_ORDER.index), states


def test_hosted_mode_checks_the_create_job_timeouts(hosted):
    _, client = hosted
    body = {"sub_job_configs": [inference().to_wire()], "idle_timeout_seconds": 5}
    with pytest.raises(requests.HTTPError) as refused:
        client.create_job_from_body(body)
    assert refused.value.response.status_code == 400
    message = refused.value.response.json()["message"]
    accepted = "accepted: 0 (never idle-terminated) or an integer 300..604800"
    assert f"idle_timeout_seconds=5; {accepted}" in message
    assert "rule idle-timeout" in message


def test_an_idle_job_ends_terminated_and_later_calls_name_it(hosted, terminated_job):
    _, client = hosted
    job_id, job, waited = terminated_job
    assert job["status"] == "terminated"
    assert job["reason"].startswith("idle for 300 s: no request for idle_timeout_seconds=300")
    assert waited < 300 / IDLE_CLOCK_SCALE + 10
    with pytest.raises(CortexCallError) as refused:
        ExplainedClient(client).generate(job_id, ["hello"], {"max_tokens": 2})
    assert refused.value.status == 410 and refused.value.code == "job_terminated"
    assert f"job {job_id} is terminated: idle for 300 s" in str(refused.value)


def test_terminated_is_final_for_the_journeys_wait_not_for_the_sdk_s(hosted, terminated_job):
    backend, _ = hosted
    job_id, _, _ = terminated_job
    sdk = backend.client(max_retries=0, poll_interval=0.02, poll_max_interval=0.05, poll_timeout=1)
    started = time.monotonic()
    with pytest.raises(TimeoutError):  # the SDK polls a terminated job until its timeout
        sdk.wait_for_job(job_id)
    assert time.monotonic() - started >= 1
    started = time.monotonic()
    with pytest.raises(JobEnded) as ended:
        ExplainedClient(sdk).wait_for_job(job_id)
    assert time.monotonic() - started < 1
    assert ended.value.state == "terminated"
    assert f"job {job_id} is terminated: idle for 300 s" in str(ended.value)
    sdk.close()


def test_every_rule_is_documented():
    text = (Path(__file__).resolve().parents[2] / "docs" / "local-backend.md").read_text()
    assert all(f"`{rule}`" in text for rule in RULES)


@extras.requires("opd")
@pytest.mark.slow
def test_opd_scores_its_teacher_end_to_end_in_hosted_mode(tmp_path):
    """OPD's hosted path: teacher scores, the alignment probe and the fingerprints go through
    the raw /forward (the wrapped forward is refused in this mode)."""
    summary = run_hosted(
        "distillation/on_policy", "local-cpu-smollm2-teacher.json", tmp_path, steps=1
    )
    records = metrics(tmp_path)
    assert [m["step"] for m in records] == [1]
    assert records[0]["teacher_term_token_count"] == records[0]["sampled_tokens"] > 0
    assert summary["teacher_frozen"] is True and summary["alignment"]["positions"] > 0
    assert hosted_mode_ran(tmp_path)
