"""Hosted-conformance rules of the data plane (cortex_recipes.local.hosted), each shown both
ways: the shape a journey relied on under the local backend's generous answers fails in
hosted-conformance mode, and the journeys' readers (save_results, raw_forward, rollouts,
frames.for_ranks) pass."""

from __future__ import annotations

import pytest
import requests
import torch
from cortex_training import wire

from cortex_recipes import frames, raw_forward, save_results
from cortex_recipes.local import LocalBackend
from cortex_recipes.rollouts import rollouts_from_results
from tests.e2e.conftest import inference, start, training

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    with LocalBackend(tmp_path_factory.mktemp("hosted-dp"), threads=1, hosted=True) as running:
        client = running.client(max_retries=0, poll_interval=0.02, poll_timeout=300)
        yield running, client
        client.close()


@pytest.fixture(scope="module")
def job(hosted):
    """A job whose training sub-job has two ranks (n_gpus=2, simulated on one device)."""
    _, client = hosted
    return start(client, [training(n_gpus=2), inference()])


def batch(rows: list[list[int]], masks: list[list[float]]) -> frames.Batch:
    return frames.pad_batch([frames.Row(r, m) for r, m in zip(rows, masks, strict=True)], 0)


# Three rows with very different scored-token counts: per-rank means differ from the batch mean.
ROWS = [[11, 12, 13, 14, 15, 16, 17, 18], [21, 22, 23, 24, 25, 26, 27, 28], [31, 32, 33, 34]]
MASKS = [[0, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1], [0, 1, 1, 1]]


def test_a_save_result_carries_the_id_only_in_its_path(hosted, job):
    _, client = hosted
    saved = client.poll_request(job, client.save(job, checkpoint_type="weights-only"))
    assert "checkpoint_id" not in saved and "checkpoint_type" not in saved
    with pytest.raises(KeyError):
        saved["checkpoint_id"]  # what the journeys indexed before
    normal = save_results.normalised(saved, "weights-only")
    listed = [c["checkpoint_id"] for c in client.list_checkpoints(job)]
    assert normal["checkpoint_id"] in listed and normal["checkpoint_id"] in saved["stage_path"]
    assert normal["checkpoint_type"] == "weights-only"


def test_forward_logprobs_are_not_in_post_process_outputs(hosted, job):
    _, client = hosted
    ids = torch.tensor(ROWS[:2])
    trainer = f"{job}:training:0"
    places = set()
    for _ in range(2):
        result = raw_forward.forward(client, job, frames.teacher_frame(ids), sub_job_id=trainer)
        assert result["post_process_outputs"] == {}  # what the journeys read before
        places.add("batch" if "batch" in result else "top")
        assert raw_forward.logprobs_of(result).shape == (2, 8)
    assert places == {"batch", "top"}  # both documented placements are served
    scored = raw_forward.score(client, job, ids[:1], sub_job_id=trainer)  # padded to 2 ranks
    assert scored.shape == (1, 8) and torch.isfinite(scored).all()


def test_sampler_logprob_entries_are_floats(hosted, job):
    _, client = hosted
    params = {"max_tokens": 4, "temperature": 1.0, "seed": 3, "logprobs": 0}
    [result] = client.poll_request(job, client.generate(job, [[11, 12, 13]], params))["results"]
    entries = result["logprobs"]
    assert entries and all(isinstance(v, float) for e in entries for v in e.values())
    with pytest.raises(TypeError):
        entries[0][str(result["token_ids"][0])]["logprob"]  # what the readers did before
    [rollout] = rollouts_from_results([[11, 12, 13]], [result])
    assert rollout.sampler_logprobs == [
        e[str(t)] for e, t in zip(entries, result["token_ids"], strict=True)
    ]


def test_fewer_rows_than_ranks_are_refused_and_filler_rows_are_accepted(hosted, job):
    _, client = hosted
    one = frames.sft_frame(batch(ROWS[:1], MASKS[:1]))
    with pytest.raises(requests.HTTPError) as info:
        client.forward_backward(job, one)
    message = info.value.response.json()["message"]
    assert info.value.response.status_code == 400 and "rule rows-per-rank" in message
    assert "n_gpus=2" in message
    result = client.poll_request(job, client.forward_backward(job, frames.for_ranks(one, 2)))
    assert result["metrics"]["loss_token_count"] == 7  # the filler row carries no loss


def test_causal_cross_entropy_without_compute_logprobs_is_refused(hosted, job):
    _, client = hosted
    b = batch(ROWS[:2], MASKS[:2])
    body = {
        "args": (),
        "kwargs": {"input_ids": b.input_ids},
        "context": {"input_ids": b.input_ids, "loss_mask": b.loss_mask},
        "processing": {"loss_fn": "causal_cross_entropy", "config": {}},
    }
    with pytest.raises(requests.HTTPError) as info:
        client.forward_backward(job, wire.dumps(body))
    assert "rule cce-needs-compute-logprobs" in info.value.response.json()["message"]


def test_the_loss_is_the_mean_of_per_rank_means_unless_scaled_globally(hosted, job):
    """Two ranks: rows 0-1 and row 2. Unscaled, the loss is the mean of the ranks' token means
    (not the batch's); the journeys' frames.for_ranks scales it back to the batch token mean."""
    _, client = hosted
    b = batch(ROWS, MASKS)
    trainer = f"{job}:training:0"
    logprobs = raw_forward.score(client, job, b.input_ids, sub_job_id=trainer)
    nll = -(logprobs * b.loss_mask)
    batch_mean = float(nll.sum() / b.loss_mask.sum())
    rank_means = float(
        (nll[:2].sum() / b.loss_mask[:2].sum() + nll[2:].sum() / b.loss_mask[2:].sum()) / 2
    )
    assert abs(batch_mean - rank_means) > 1e-3  # the example distinguishes the two
    plain = client.poll_request(job, client.forward_backward(job, frames.sft_frame(b)))
    fitted = client.poll_request(
        job, client.forward_backward(job, frames.for_ranks(frames.sft_frame(b), 2))
    )
    assert plain["avg_loss"] == pytest.approx(rank_means, abs=1e-4)
    assert fitted["avg_loss"] == pytest.approx(batch_mean, abs=1e-4)


def test_a_draining_reset_waits_for_rows_and_times_out(hosted, job):
    _, client = hosted
    params = {"max_tokens": 200, "temperature": 1.0, "seed": 1, "ignore_eos": True}
    request_id = client.generate(job, [[11, 12, 13]], params)
    with pytest.raises(requests.HTTPError) as info:
        client.reset_prefix_cache(job, drain=True, timeout_s=0.2)
    assert info.value.response.status_code == 408
    assert "rule prefix-cache-drain" in info.value.response.json()["message"]
    assert client.reset_prefix_cache(job, drain=False)["drained_s"] == 0.0
    client.poll_request(job, request_id)
    assert client.reset_prefix_cache(job, drain=True, timeout_s=5.0)["reset"] is True


def test_the_forward_falls_back_to_the_documented_operation_route(hosted, job, caplog):
    """An endpoint without the raw /forward (404) is probed once; scoring then goes through
    the documented /operation forward with a JSON payload, with the same numbers."""
    backend, _ = hosted
    client = backend.client(max_retries=0, poll_interval=0.02, poll_timeout=300)
    send = client._send

    def without_raw_route(method, url, **kwargs):
        if url.endswith(f"/{job}/forward"):
            response = requests.Response()
            response.status_code, response.url = 404, url
            raise requests.HTTPError("404 Not Found", response=response)
        return send(method, url, **kwargs)

    client._send = without_raw_route
    trainer = f"{job}:training:0"
    ids = torch.tensor(ROWS[:2])
    with caplog.at_level("INFO", logger="cortex_recipes.raw_forward"):
        fallback = raw_forward.score(client, job, ids, sub_job_id=trainer)
        again = raw_forward.score(client, job, ids, sub_job_id=trainer)
    _, reference_client = hosted
    direct = raw_forward.score(reference_client, job, ids, sub_job_id=trainer)
    assert torch.allclose(fallback, direct, atol=1e-5) and torch.equal(fallback, again)
    assert sum("using the documented /operation forward" in r.message for r in caplog.records) == 1
    client.close()


def test_the_default_mode_answers_the_local_way(client):
    """The same calls on the default backend: ids in save results, logprobs in
    post_process_outputs, dict logprob entries, one row on one rank."""
    job = start(client, [training(), inference()])
    try:
        saved = client.poll_request(job, client.save(job, checkpoint_type="weights-only"))
        assert saved["checkpoint_id"] == save_results.checkpoint_id(saved)
        ids = torch.tensor(ROWS[:1])
        result = raw_forward.forward(
            client, job, frames.teacher_frame(ids), sub_job_id=f"{job}:training:0"
        )
        assert result["post_process_outputs"]["logprobs"].shape == (1, 8)
        params = {"max_tokens": 2, "temperature": 1.0, "seed": 3, "logprobs": 0}
        [out] = client.poll_request(job, client.generate(job, [[11, 12]], params))["results"]
        assert all(isinstance(v, dict) for e in out["logprobs"] for v in e.values())
    finally:
        client.cancel_job(job)
