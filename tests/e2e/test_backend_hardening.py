"""The local backend driven the way a careless or hostile client would drive it.

Every malformed input class gets a 4xx whose message names the field, the server stays up, and
the job's state (the loss of a reference batch, the step count) is unchanged afterwards. A
killed worker is a failed sub-job with a reason; a cancel is a cancel.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import requests
import torch
from cortex_training import wire
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cortex_recipes.local import LocalBackend
from cortex_recipes.models import load_causal_lm

from .conftest import TINY, inference, start, training

pytestmark = pytest.mark.e2e

CE = {"loss_fn": "causal_cross_entropy", "post": [], "config": {}}
GRPO = {"loss_fn": "grpo", "post": [], "config": {}}
VOCAB = 151_936
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def url(backend, job_id: str = "", path: str = "") -> str:
    base = f"{backend.base_url}/api/v2/databases/LOCAL/schemas/PUBLIC/cortex-training"
    return f"{base}/{job_id}/{path}".rstrip("/") if job_id else base


def post(backend, job_id: str, path: str, *, data: bytes | None = None, body=None, raw=None):
    target = url(backend, job_id, path)
    if raw is not None:
        return requests.post(
            target, data=raw, headers={"Content-Type": "application/json"}, timeout=30
        )
    if body is not None:
        return requests.post(target, json=body, timeout=30)
    return requests.post(
        target, data=data, headers={"Content-Type": "application/octet-stream"}, timeout=30
    )


def ids_batch(seed: int = 0) -> torch.Tensor:
    return torch.randint(10, 5000, (2, 16), generator=torch.Generator().manual_seed(seed))


def frame(kwargs: dict, context: dict | None = None, processing=CE, metadata=None) -> bytes:
    body = {"args": (), "kwargs": kwargs, "processing": processing}
    if context is not None:
        body["context"] = context
    return wire.dumps(body, metadata=metadata)


def ce(ids: torch.Tensor, **extra) -> bytes:
    mask = torch.ones(ids.shape)
    mask[:, -1] = 0
    return frame({"input_ids": ids}, {"loss_mask": mask, **extra})


def nested(depth: int):
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.fixture(scope="module")
def job(client):
    """Training + sampling on the tiny fixture; only lr=0 steps ever run on it."""
    return start(client, [training(), inference()])


def reference_state(client, job_id: str) -> tuple[float, int]:
    """(loss of a fixed batch, global steps after one lr=0 step)."""
    loss = client.poll_request(job_id, client.forward_backward(job_id, ce(ids_batch(7))))
    steps = client.poll_request(job_id, client.step(job_id, learning_rate=0.0))
    return loss["avg_loss"], steps["global_steps"]


def assert_named_4xx(response, *fields: str) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    message = response.json()["message"]
    assert any(f in message for f in fields), (fields, message)


def _ids(dtype, low=0, high=100):
    return torch.randint(low, high, (2, 8)).to(dtype)


# Each case: (route, how to send it, fields one of which the message must name).
def _frame_cases(draw_int: int):
    ids = _ids(torch.long, 10, 500)
    ones = torch.ones(ids.shape)
    return [
        ("forward-backward", frame({"input_ids": _ids(torch.uint8)}), ("kwargs.input_ids",)),
        ("forward-backward", frame({"input_ids": ids.float()}), ("kwargs.input_ids",)),
        ("forward-backward", frame({"input_ids": ids.bool()}), ("kwargs.input_ids",)),
        ("forward-backward", frame({"input_ids": ids[0]}), ("kwargs.input_ids",)),
        ("forward-backward", frame({"input_ids": ids + VOCAB + draw_int}), ("kwargs.input_ids",)),
        (
            "forward-backward",
            frame({"input_ids": ids}, {"loss_mask": ones, "labels": ids + VOCAB}),
            ("context.labels",),
        ),
        (
            "forward-backward",
            frame({"input_ids": ids}, {"loss_mask": ones, "labels": ids * 0 - 5 - draw_int}),
            ("context.labels",),
        ),
        (
            "forward-backward",
            frame({"input_ids": ids}, {"loss_mask": -ones, "advantages": ones}, GRPO),
            ("context.loss_mask",),
        ),
        ("forward-backward", frame({"input_ids": ids}, {"loss_mask": -ones}), ("loss_mask",)),
        (
            "forward-backward",
            frame({"input_ids": ids}, {"loss_mask": ones * float("inf")}),
            ("context.loss_mask",),
        ),
        (
            "forward-backward",
            frame({"input_ids": ids, "use_cache": "no"}, {"loss_mask": ones}),
            ("kwargs.use_cache",),
        ),
        (
            "forward-backward",
            frame({"input_ids": ids, "logits_to_keep": 1}, {"loss_mask": ones}),
            ("kwargs has unknown keys",),
        ),
        (
            "forward-backward",
            frame({"input_ids": ids, "temperature": -ones}, {"loss_mask": ones}, GRPO),
            ("kwargs.temperature",),
        ),
        (
            "forward-backward",
            frame({"input_ids": ids, "attention_mask": ids}, {"loss_mask": ones}),
            ("kwargs.attention_mask",),
        ),
        (
            "forward-backward",
            frame({"input_ids": ids}, {"loss_mask": ones}, metadata=5),
            ("metadata",),
        ),
        (
            "forward-backward",
            frame({"input_ids": ids}, {"loss_mask": ones}, metadata={"request_chunk": draw_int}),
            ("request_chunk",),
        ),
        (
            "forward-backward",
            frame({"input_ids": ids}, {"loss_mask": ones}, metadata={"deep": nested(200)}),
            ("nests",),
        ),
        (
            "forward-backward",
            frame({"input_ids": ids}, {"loss_mask": ones, "extra": nested(60)}),
            ("nests", "context"),
        ),
        (
            "forward-backward",
            frame(
                {"input_ids": ids},
                {"loss_mask": ones},
                {"loss_fn": "grpo", "config": {"dp_size": 10**30}},
            ),
            ("dp_size",),
        ),
        (
            "forward-backward",
            frame(
                {"input_ids": ids},
                {"loss_mask": ones, "advantages": ones},
                {"loss_fn": "grpo", "config": {"batch_num_tokens": 10**400}},
            ),
            ("batch_num_tokens",),
        ),
    ]


def _json_cases(draw_int: int):
    deep = "[" * (2000 + draw_int) + "]" * (2000 + draw_int)
    return [
        ("", "raw", deep, ("nests",)),
        ("", "raw", '{"sub_job_configs": ' + deep + "}", ("nests",)),
        ("", "raw", "{not json", ("not valid JSON",)),
        ("", "json", [1, 2], ("create-job",)),
        (
            "",
            "json",
            {"sub_job_configs": [{"job_type": "training", "model_name": "m" * (5000 + draw_int)}]},
            ("model_name",),
        ),
        ("", "json", {"job_id": "ok\n", "sub_job_configs": []}, ("job_id",)),
        ("step", "json", {"learning_rate": 10**400}, ("learning_rate",)),
        ("step", "json", {"learning_rate": 10**9 + draw_int}, ("learning_rate",)),
        ("step", "json", {"learning_rate": -1e-3}, ("learning_rate",)),
        ("step", "json", {"learning_rate": "1e-3"}, ("learning_rate",)),
        ("step", "raw", '{"learning_rate": Infinity}', ("learning_rate",)),
        ("step", "json", {"lr": 1e-3}, ("step body has unknown keys",)),
        ("save", "json", {"checkpoint_id": "cp_" + "a" * 32 + "\n"}, ("checkpoint_id",)),
        ("save", "json", {"checkpoint_id": "../../etc"}, ("checkpoint_id",)),
        ("save", "json", {"checkpoint_type": 5}, ("checkpoint_type",)),
        (
            "load",
            "json",
            {"checkpoint_id": "cp_" + "0" * 32, "source_job_id": "../x"},
            ("source_job_id",),
        ),
        (
            "operation",
            "json",
            {"operation_type": "tail-logs", "sub_job_type": "training", "payload": 5},
            ("tail-logs payload",),
        ),
        (
            "operation",
            "json",
            {
                "operation_type": "tail-logs",
                "sub_job_type": "training",
                "payload": {"cursor": "x" * (draw_int + 1)},
            },
            ("cursor",),
        ),
        (
            "operation",
            "json",
            {
                "operation_type": "tail-logs",
                "sub_job_type": "training",
                "payload": {"max_lines": 10**12},
            },
            ("max_lines",),
        ),
        ("operation", "json", {"operation_type": ["forward"]}, ("operation_type",)),
        (
            "operation",
            "json",
            {"operation_type": "forward", "payload": {"kwargs": {"input_ids": [[1, "a"]]}}},
            ("kwargs.input_ids",),
        ),
        (
            "operation",
            "json",
            {"operation_type": "forward", "payload": {"kwargs": {"input_ids": [[10**30]]}}},
            ("kwargs.input_ids",),
        ),
        (
            "operation",
            "json",
            {"operation_type": "forward", "payload": {"payload_b64": 5}},
            ("payload_b64",),
        ),
        (
            "operation",
            "json",
            {"operation_type": "weight-sync", "payload": {"source_sub_job_id": 1}},
            ("source_sub_job_id",),
        ),
    ]


def _generate_cases(draw_int: int):
    def gen(params, prompts=None):
        return wire.dumps({"prompts": prompts or [[1, 2, 3]], "sampling_params": params})

    return [
        (gen({"logprobs": 10**9 + draw_int}), ("logprobs",)),
        (gen({"seed": 2**70 + draw_int}), ("seed",)),
        (gen({"seed": -1 - draw_int}), ("seed",)),
        (gen({"top_k": -2 - draw_int}), ("top_k",)),
        (gen({"temperature": -0.5}), ("temperature",)),
        (gen({"temperature": 1e9}), ("temperature",)),
        (gen({"max_tokens": 0}), ("max_tokens",)),
        (gen({"stop": [""]}), ("stop",)),
        (gen({"stop_token_ids": [VOCAB + draw_int]}), ("stop_token_ids",)),
        (gen({"ignore_eos": "yes"}), ("ignore_eos",)),
        (gen({"n": 2}), ("n=",)),
        (gen({"best_of": 2}), ("unknown keys",)),
        (gen(None, prompts=[[VOCAB + draw_int]]), ("prompts[0]",)),
        (gen(None, prompts=[[]]), ("prompts[0]",)),
        (gen(None, prompts=[[True]]), ("prompts[0]",)),
        (gen(None, prompts=[[1] * 300]), ("prompts[0]",)),
        (wire.dumps([1, 2]), ("prompts",)),
        (wire.dumps({"prompts": [[1]], "sampling_params": [{}, {}]}), ("sampling_params",)),
    ]


def _send_case(backend, job: str, kind: str, index: int, draw: int):
    if kind == "frames":
        cases = _frame_cases(draw)
        path, data, fields = cases[index % len(cases)]
        return post(backend, job, path, data=data), fields
    if kind == "json":
        cases = _json_cases(draw)
        path, how, body, fields = cases[index % len(cases)]
        target = job if path else ""
        if how == "raw":
            return post(backend, target, path, raw=body), fields
        return post(backend, target, path, body=body), fields
    cases = _generate_cases(draw)
    data, fields = cases[index % len(cases)]
    return post(backend, job, "generate", data=data), fields


CASE_COUNTS = {
    "frames": len(_frame_cases(0)),
    "json": len(_json_cases(0)),
    "generate": len(_generate_cases(0)),
}


def test_no_malformed_input_class_reaches_a_500_and_the_job_is_unchanged(client, backend, job):
    before = reference_state(client, job)
    # Every case once, then hypothesis varies them (sizes, values, order).
    for kind, count in CASE_COUNTS.items():
        for index in range(count):
            response, fields = _send_case(backend, job, kind, index, 0)
            assert_named_4xx(response, *fields)
    sent = dict.fromkeys(CASE_COUNTS, 0)

    @FUZZ
    @given(kind=st.sampled_from(sorted(sent)), index=st.integers(0, 40), draw=st.integers(0, 7))
    def one(kind: str, index: int, draw: int) -> None:
        response, fields = _send_case(backend, job, kind, index, draw)
        sent[kind] += 1
        assert_named_4xx(response, *fields)

    one()
    assert all(count > 5 for count in sent.values()), sent
    assert requests.get(f"{backend.base_url}/healthz", timeout=5).ok
    after = reference_state(client, job)
    assert after[0] == pytest.approx(before[0], abs=0)
    assert after[1] == before[1] + 1  # exactly the one lr=0 step reference_state takes


def test_model_forward_kwargs_the_hosted_service_accepts_are_accepted(client, backend, job):
    ids = ids_batch(3)
    mask = torch.ones(ids.shape)
    mask[:, -1] = 0
    plain = client.poll_request(job, client.forward_backward(job, ce(ids)))["avg_loss"]
    upstream = frame(
        {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(ids.shape[1]).expand_as(ids).contiguous(),
            "use_cache": False,
            "temperature": torch.ones(ids.shape),
        },
        {"input_ids": ids, "loss_mask": mask, "advantages": torch.zeros(ids.shape)},
    )
    with_flags = client.poll_request(job, client.forward_backward(job, upstream))["avg_loss"]
    assert with_flags == pytest.approx(plain, rel=1e-6)
    client.poll_request(job, client.step(job, learning_rate=0.0))


def test_a_temperature_tensor_scales_the_logits_before_the_logprobs(client, job):
    ids = ids_batch(4)
    temperature = torch.full(ids.shape, 2.0)
    payload = wire.dumps({"args": (), "kwargs": {"input_ids": ids, "temperature": temperature}})
    result = client.poll_request(
        job, client.forward(job, payload, sub_job_type="training")["request_id"]
    )
    got = torch.as_tensor(result["post_process_outputs"]["logprobs"])[:, :-1]
    model = load_causal_lm(TINY)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float() / 2.0
    want = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_save_honours_a_caller_checkpoint_id_and_rejects_a_taken_one(client, backend, job):
    checkpoint_id = "cp_" + "c" * 32
    result = client.poll_request(job, client.save(job, checkpoint_id=checkpoint_id))
    assert result["checkpoint_id"] == checkpoint_id
    assert f"/checkpoints/{checkpoint_id}/" in result["stage_path"]
    again = post(backend, job, "save", body={"checkpoint_id": checkpoint_id})
    assert again.status_code == 409 and again.json()["code"] == "checkpoint_exists"
    listed = [c["checkpoint_id"] for c in client.list_checkpoints(job)]
    assert listed.count(checkpoint_id) == 1


def test_get_job_reports_each_sub_jobs_device_and_dtype(client, job):
    sub_jobs = client.get_job(job)["sub_jobs"]
    assert {(s["device"], s["dtype"]) for s in sub_jobs} == {("cpu", "float32")}
    assert all(s["info"]["device"] == "cpu" for s in sub_jobs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_asking_for_cuda_without_cuda_fails_job_creation_with_a_clear_400(tmp_path):
    with LocalBackend(tmp_path, device="cuda", threads=1) as gpu_backend:
        body = {"sub_job_configs": [training().to_wire()]}
        response = requests.post(url(gpu_backend), json=body, timeout=30)
        assert response.status_code == 400
        assert "device='cuda' was asked for" in response.json()["message"]


def _process_gone(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    if not status.exists():
        return True
    return "\nState:\tZ" in status.read_text()  # a zombie would mean nobody reaped it


def _wait(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_killed_worker_fails_its_job_with_a_reason_and_is_reaped(client, backend, job):
    victim = start(client, [training(), inference()])
    sampler = next(s for s in client.get_job(victim)["sub_jobs"] if s["job_type"] == "sampling")
    pid = sampler["info"]["pid"]
    in_flight = client.generate(
        victim, [[1, 2, 3]], {"max_tokens": 200, "temperature": 1.0, "ignore_eos": True}
    )
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: client.get_job(victim)["status"] == "failed", what="the job to fail")
    described = client.get_job(victim)
    assert sampler["sub_job_id"] in described["reason"]
    assert "SIGKILL" in described["reason"]
    dead = next(s for s in described["sub_jobs"] if s["sub_job_id"] == sampler["sub_job_id"])
    assert dead["status"] == "failed" and "SIGKILL" in dead["reason"]
    status = requests.get(url(backend, victim, f"requests/{in_flight}"), timeout=30).json()
    assert status["status"] in ("failed", "completed")
    if status["status"] == "failed":
        assert "SIGKILL" in status["error"]
    refused = post(backend, victim, "generate", data=wire.dumps({"prompts": [[1, 2]]}))
    assert refused.status_code == 410 and "SIGKILL" in refused.json()["message"]
    _wait(lambda: _process_gone(pid), what="the dead worker to be reaped")
    # Its training worker was stopped with it; other jobs keep working.
    trainer = next(s for s in described["sub_jobs"] if s["job_type"] == "training")
    _wait(lambda: _process_gone(trainer["info"]["pid"]), what="the job's other worker to stop")
    assert client.poll_request(job, client.forward_backward(job, ce(ids_batch(8))))["avg_loss"] > 0
    client.poll_request(job, client.step(job, learning_rate=0.0))


def test_cancelling_a_job_reports_its_requests_cancelled_not_dead(client, backend):
    doomed = start(client, [training()])
    ids = torch.randint(10, 5000, (4, 128), generator=torch.Generator().manual_seed(9))
    queued = [client.forward_backward(doomed, ce(ids)) for _ in range(4)]
    client.cancel_job(doomed)
    assert client.get_job(doomed)["status"] == "cancelled"
    states = []
    for request_id in queued:
        body = requests.get(url(backend, doomed, f"requests/{request_id}"), timeout=30).json()
        states.append(body["status"])
        assert "died" not in (body["error"] or ""), body
    assert "cancelled" in states and set(states) <= {"cancelled", "completed"}, states
    refused = post(backend, doomed, "step", body={})
    assert refused.status_code == 410 and "cancelled" in refused.json()["message"]


def test_an_upload_cut_off_midway_is_one_info_line_not_a_500(backend, job):
    """A client that disconnects mid-upload is logged once, at info level, without a
    traceback (issue 35: 60 aborted uploads wrote 6,618 log lines of 500s)."""
    import socket
    from urllib.parse import urlsplit

    target = urlsplit(url(backend, job, "forward-backward"))
    before = backend.log_path.read_text()
    for _ in range(3):
        with socket.create_connection((target.hostname, target.port), timeout=10) as sock:
            sock.sendall(
                f"POST {target.path} HTTP/1.1\r\nHost: {target.netloc}\r\n"
                "Content-Type: application/octet-stream\r\nContent-Length: 1000000\r\n\r\n".encode()
                + b"x" * 1000
            )
    time.sleep(1.0)
    assert requests.get(f"{backend.base_url}/healthz", timeout=10).json() == {"status": "ok"}
    added = backend.log_path.read_text()[len(before) :]
    lines = [line for line in added.splitlines() if "disconnected during the upload" in line]
    assert len(lines) == 3 and all(" INFO " in line for line in lines), added[-2000:]
    assert "Traceback" not in added and "unexpected error" not in added


@pytest.mark.parametrize("cursor", ["²", "-1", "1e3", "9" * 40, "٣"])
def test_a_cursor_that_is_not_one_the_server_issued_is_a_400(client, backend, job, cursor):
    from cortex_recipes import raw_forward

    scoring = frame({"input_ids": ids_batch()}, processing={"post": ["compute_logprobs"]})
    request_id = raw_forward.submit(client, job, scoring, sub_job_id=f"{job}:training:0")
    client.poll_request(job, request_id)
    response = requests.get(
        url(backend, job, f"requests/{request_id}"), params={"cursor": cursor}, timeout=30
    )
    assert response.status_code == 400, response.text
    assert "cursor=" in response.json()["message"]
