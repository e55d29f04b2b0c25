"""Continuous batching through SDK -> HTTP -> sampling worker: concurrent requests share decode
steps and give what they give alone; cancel, weight updates, a pause and a full queue act
between steps; a poll is answered the moment its request settles."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from cortex_training import SubJobConfig, wire

from tests.e2e.conftest import TINY, inference, start, training

pytestmark = pytest.mark.e2e

BASE = "api/v2/databases/LOCAL/schemas/PUBLIC/cortex-training"


def url(backend, job_id: str, path: str) -> str:
    return f"{backend.base_url}/{BASE}/{job_id}/{path}"


def prompt(seed: int, length: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, 5000, (length,), generator=g).tolist()


@pytest.fixture(scope="module")
def job(client):
    job_id = start(client, [training(), inference()])
    yield job_id
    client.cancel_job(job_id)


def status(backend, job_id, request_id) -> dict:
    return requests.get(url(backend, job_id, f"requests/{request_id}"), timeout=60).json()


def status_now(backend, job_id, request_id) -> str:
    """The request's status without the held poll (a cursor is never held)."""
    answer = requests.get(
        url(backend, job_id, f"requests/{request_id}"), params={"cursor": "0"}, timeout=60
    )
    return answer.json()["status"]


def training_frame(seed: int) -> bytes:
    """A one-row cross-entropy batch: a step on it changes the trainer's weights."""
    ids = torch.tensor([prompt(seed, 24)])
    return wire.dumps(
        {
            "kwargs": {"input_ids": ids},
            "context": {"loss_mask": torch.ones(ids.shape)},
            "processing": {"loss_fn": "causal_cross_entropy", "post": [], "config": {}},
        }
    )


def operation(backend, job_id, body: dict) -> requests.Response:
    return requests.post(url(backend, job_id, "operation"), json=body, timeout=60)


def test_concurrent_greedy_requests_equal_serial_ones(client, job):
    """Greedy rows do not depend on which other requests shared their decode steps."""
    prompts = [prompt(i, 4 + 3 * i) for i in range(8)]
    params = [
        {"max_tokens": 10 + 2 * i, "temperature": 0.0, "ignore_eos": True, "logprobs": 0}
        for i in range(8)
    ]
    serial = [
        client.poll_request(job, client.generate(job, [p], q))["results"][0]
        for p, q in zip(prompts, params, strict=True)
    ]
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(
            pool.map(
                lambda i: client.poll_request(job, client.generate(job, [prompts[i]], params[i]))[
                    "results"
                ][0],
                range(8),
            )
        )
    for a, b in zip(serial, together, strict=True):
        assert a["token_ids"] == b["token_ids"]
        lp_a = torch.tensor(
            [e[str(t)]["logprob"] for e, t in zip(a["logprobs"], a["token_ids"], strict=True)]
        )
        lp_b = torch.tensor(
            [e[str(t)]["logprob"] for e, t in zip(b["logprobs"], b["token_ids"], strict=True)]
        )
        assert torch.allclose(lp_a, lp_b, atol=1e-4)


def test_a_short_request_joins_a_running_one_and_leaves_first(client, backend, job):
    long_id = client.generate(
        job, [prompt(1, 6)], {"max_tokens": 240, "temperature": 1.0, "seed": 1, "ignore_eos": True}
    )
    time.sleep(0.2)  # the long request is decoding
    short_id = client.generate(
        job,
        [prompt(2, 9), prompt(3, 4)],
        [
            {"max_tokens": 3, "temperature": 0.0},
            {"max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "seed": 5, "logprobs": 1},
        ],
    )
    short = client.poll_request(job, short_id)["results"]
    assert status(backend, job, long_id)["status"] in ("pending", "running", "completed")
    long = client.poll_request(job, long_id)["results"][0]
    long_status, short_status = status(backend, job, long_id), status(backend, job, short_id)
    # It joined while the long one ran, and finished before it.
    assert long_status["started_at"] < short_status["started_at"]
    assert short_status["updated_at"] < long_status["updated_at"]
    assert len(long["token_ids"]) == 240
    assert [len(r["token_ids"]) for r in short] == [3, 5]
    # Each row keeps its own parameters: the same rows sent alone give the same tokens.
    alone = client.poll_request(
        job,
        client.generate(
            job, [prompt(3, 4)], {"max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "seed": 5}
        ),
    )["results"][0]
    assert alone["token_ids"] == short[1]["token_ids"]
    assert len(short[1]["logprobs"][0]) == 2  # the sampled token and the top-1


def test_cancel_stops_a_request_mid_decode_and_the_sampler_keeps_serving(client, backend, job):
    doomed = client.generate(
        job, [prompt(4, 8)], {"max_tokens": 240, "temperature": 1.0, "ignore_eos": True}
    )
    time.sleep(0.3)  # about a fifth of its decode steps
    answer = client.cancel_request(job, doomed)
    assert answer["cancelled"] is True and answer["status"] == "cancelled", answer
    body = status(backend, job, doomed)
    assert body["status"] == "cancelled" and body["result"] is None
    assert body["started_at"] is not None  # it was decoding, not waiting, when it left
    after = client.poll_request(
        job, client.generate(job, [prompt(5, 5)], {"max_tokens": 4, "temperature": 0.0})
    )
    assert len(after["results"][0]["token_ids"]) == 4
    # Cancelling a finished request changes nothing.
    finished = client.cancel_request(job, doomed)
    assert finished["cancelled"] is True and finished["status"] == "cancelled"


def test_a_weight_update_lands_between_decode_steps_and_results_name_the_versions(client, job):
    trainer = f"{job}:training:0"
    sampler = f"{job}:sampling:0"
    client.poll_request(job, client.forward_backward(job, training_frame(6)))
    client.poll_request(job, client.step(job, learning_rate=1e-2))
    running = client.generate(
        job,
        [prompt(7, 6)] * 16,
        {"max_tokens": 240, "temperature": 1.0, "seed": 2, "ignore_eos": True},
    )
    time.sleep(0.2)
    synced = client.poll_request(
        job, client.weight_sync(job, trainer, [sampler], weight_format="hf")
    )
    results = client.poll_request(job, running)["results"]
    version = synced["weight_version"]
    for r in results:
        assert r["weight_versions"] == [version - 1, version], r["weight_versions"]
        start_new = r["weight_version_starts"][1]
        assert 0 < start_new < 240
    fresh = client.poll_request(
        job, client.generate(job, [prompt(8, 5)], {"max_tokens": 3, "temperature": 0.0})
    )
    assert fresh["results"][0]["weight_versions"] == [version]


def test_a_pause_holds_decoding_rows_while_the_weights_change_under_them(client, backend, job):
    trainer = f"{job}:training:0"
    sampler = f"{job}:sampling:0"
    running = client.generate(
        job,
        [prompt(14, 6)] * 4,
        {"max_tokens": 240, "temperature": 1.0, "seed": 3, "ignore_eos": True},
    )
    time.sleep(0.1)
    paused = operation(backend, job, {"operation_type": "pause-generation", "sub_job_id": sampler})
    assert paused.ok and paused.json()["paused"] is True, paused.text
    # While paused: a training step and a weight sync run (they are commands, not decode steps);
    # the held rows do not finish, and a request arriving now waits with them.
    client.poll_request(job, client.forward_backward(job, training_frame(13)))
    client.poll_request(job, client.step(job, learning_rate=1e-2))
    synced = client.poll_request(
        job, client.weight_sync(job, trainer, [sampler], weight_format="hf")
    )
    late = client.generate(job, [prompt(15, 5)], {"max_tokens": 3, "temperature": 0.0})
    time.sleep(2.0)  # longer than all 240 steps of these rows take unpaused on a CPU core
    assert status_now(backend, job, running) == "running"
    assert status_now(backend, job, late) in ("pending", "running")
    resumed = operation(
        backend, job, {"operation_type": "resume-generation", "sub_job_id": sampler}
    )
    assert resumed.ok and resumed.json()["paused"] is False, resumed.text
    version = synced["weight_version"]
    for r in client.poll_request(job, running)["results"]:
        assert len(r["token_ids"]) == 240
        # every token decoded after the pause is the new version's
        assert r["weight_versions"] == [version - 1, version], r["weight_versions"]
    assert client.poll_request(job, late)["results"][0]["weight_versions"] == [version]


def test_pause_generation_refuses_what_it_cannot_do(backend, job):
    def refused(body: dict) -> str:
        answer = operation(backend, job, body)
        assert answer.status_code == 400, answer.text
        return answer.json()["message"]

    sampler, trainer = f"{job}:sampling:0", f"{job}:training:0"
    pause = {"operation_type": "pause-generation", "sub_job_id": sampler}
    assert "payload.max_s=0" in refused({**pause, "payload": {"max_s": 0}})
    assert "payload.max_s=True" in refused({**pause, "payload": {"max_s": True}})
    assert "max_s" in refused({**pause, "payload": {"mode": "keep"}})
    assert "sampling" in refused({**pause, "sub_job_id": trainer})
    resume = {"operation_type": "resume-generation", "sub_job_id": sampler}
    assert "no payload" in refused({**resume, "payload": {"max_s": 1}})
    # a resume with nothing paused changes nothing
    assert operation(backend, job, resume).ok


def test_a_full_sampler_answers_429_and_an_oversized_request_400(client, backend):
    small = SubJobConfig.sampling_job(
        TINY,
        max_seq_len=256,
        n_gpus=1,
        extra_sampling={"vllm_config": {"max_num_seqs": 1, "max_queued_rows": 1}},
        seed=0,
    )
    job_id = start(client, [small])
    busy = {"max_tokens": 240, "temperature": 1.0, "ignore_eos": True}
    first = client.generate(job_id, [prompt(9, 4)], busy)
    second = client.generate(job_id, [prompt(10, 4)], busy)
    refused = requests.post(
        url(backend, job_id, "generate"),
        data=wire.dumps({"prompts": [prompt(11, 4)], "sampling_params": busy}),
        timeout=30,
    )
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "sampler_queue_full"
    assert "limit 2" in refused.json()["message"]
    too_big = requests.post(
        url(backend, job_id, "generate"),
        data=wire.dumps({"prompts": [prompt(12, 4)] * 3}),
        timeout=30,
    )
    assert too_big.status_code == 400 and "max_queued_rows 1" in too_big.json()["message"]
    client.cancel_request(job_id, first)
    client.cancel_request(job_id, second)
    # Room again once they settle.
    done = client.poll_request(
        job_id, client.generate(job_id, [prompt(13, 4)], {"max_tokens": 2, "temperature": 0.0})
    )
    assert len(done["results"][0]["token_ids"]) == 2
    client.cancel_job(job_id)


def test_a_poll_is_answered_when_its_request_settles_not_before(client, backend, job):
    request_id = client.generate(
        job, [prompt(14, 6)], {"max_tokens": 240, "temperature": 1.0, "ignore_eos": True}
    )
    body = status(backend, job, request_id)  # one poll, held until the result is ready
    assert body["status"] == "completed" and body["result"] is not None
