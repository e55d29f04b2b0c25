"""Hosted-conformance mode (``serve --hosted``, the ``local-hosted`` connection): each rule of
cortex_recipes.local.hosted refuses or ignores what hosted Cortex documents it does not accept,
the default mode still accepts it, and OPD's teacher scoring runs end to end in that mode."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import torch
from cortex_training import wire

from cortex_recipes import raw_forward
from cortex_recipes.local import LocalBackend
from cortex_recipes.local.hosted import RULES
from tests import extras
from tests.e2e.conftest import TINY, inference, start, training
from tests.e2e.hosted import hosted_mode_ran, metrics, run_hosted

pytestmark = pytest.mark.e2e

BASE = "api/v2/databases/LOCAL/schemas/PUBLIC/cortex-training"


@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    with LocalBackend(tmp_path_factory.mktemp("hosted"), threads=1, hosted=True) as running:
        client = running.client(max_retries=0, poll_interval=0.02, poll_timeout=300)
        yield running, client
        client.close()


@pytest.fixture(scope="module")
def job(hosted):
    _, client = hosted
    return start(client, [training(), inference()])


def post(backend, job_id: str, path: str, body: dict) -> requests.Response:
    return requests.post(f"{backend.base_url}/{BASE}/{job_id}/{path}", json=body, timeout=60)


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
    assert result["post_process_outputs"]["logprobs"].shape == (2, 6)


def test_a_callers_checkpoint_id_is_ignored(hosted, job):
    _, client = hosted
    wanted = "cp_" + "d" * 32
    saved = client.poll_request(job, client.save(job, checkpoint_id=wanted))
    assert saved["checkpoint_id"].startswith("cp_") and saved["checkpoint_id"] != wanted
    assert wanted not in saved["stage_path"]
    again = client.poll_request(job, client.save(job, checkpoint_id=wanted))
    assert again["checkpoint_id"] not in (wanted, saved["checkpoint_id"])  # no 409 either


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
    """Each rule is a difference between the modes: the default backend takes all four."""
    from cortex_recipes.models import resolve_model_path

    job = start(client, [training(str(resolve_model_path(TINY))), inference()])
    try:
        wrapped = client.forward(job, frame(), sub_job_id=f"{job}:training:0")
        assert client.poll_request(job, wrapped["request_id"])["post_process_outputs"]
        wanted = "cp_" + "e" * 32
        assert (
            client.poll_request(job, client.save(job, checkpoint_id=wanted))["checkpoint_id"]
            == wanted
        )
    finally:
        client.cancel_job(job)


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
