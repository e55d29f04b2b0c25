"""The real cortex-training SDK over HTTP against the local backend running real fixture models.

Each reference below is computed independently in the test with transformers on the same
fixture weights.
"""

from __future__ import annotations

import pytest
import requests
import torch
from cortex_training import JobType, wire

from cortex_recipes.models import load_causal_lm

from .conftest import TINY, inference, start, training

pytestmark = pytest.mark.e2e

CE = {"loss_fn": "causal_cross_entropy", "post": ["compute_logprobs"], "config": {}}
LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}


def batch(seed: int, rows: int = 2, length: int = 24) -> torch.Tensor:
    return torch.randint(10, 5000, (rows, length), generator=torch.Generator().manual_seed(seed))


def ce_frame(ids: torch.Tensor, weights: torch.Tensor) -> bytes:
    context = {"input_ids": ids, "loss_mask": weights}
    return wire.dumps(
        {"args": (), "kwargs": {"input_ids": ids}, "context": context, "processing": CE}
    )


def run(client, job_id: str, request_id: str) -> dict:
    return client.poll_request(job_id, request_id)


def reference_logprobs(ids: torch.Tensor) -> torch.Tensor:
    model = load_causal_lm(TINY)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    lp = torch.log_softmax(logits, -1)
    return lp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, T-1]: token i+1 given <= i


def shifted(values: torch.Tensor) -> torch.Tensor:
    """[B, T-1] next-token values -> [B, T] prediction-aligned tensor with a zero last column."""
    return torch.cat([values, torch.zeros(values.shape[0], 1)], dim=1)


@pytest.fixture(scope="module")
def fresh(client):
    """A training sub-job that never steps: its weights stay the fixture's."""
    return start(client, [training()])


def test_causal_ce_avg_loss_matches_weighted_next_token_nll(client, fresh):
    ids = batch(1)
    weights = torch.rand(ids.shape, generator=torch.Generator().manual_seed(2))
    weights[0, :5] = 0.0
    weights[1, 10] = 0.5
    weights[:, -1] = 0.0
    result = run(client, fresh, client.forward_backward(fresh, ce_frame(ids, weights)))
    lp = reference_logprobs(ids)
    w = weights[:, :-1]
    expected = float((-lp * w).sum() / w.sum())
    assert result["avg_loss"] == pytest.approx(expected, abs=1e-5)
    returned = result["post_process_outputs"]["logprobs"]
    assert torch.allclose(returned[:, :-1], lp, atol=1e-5)


def reference_grpo(
    lp, old, adv, mask, eps, eps_high, teacher=None, tau=0.0, clip=None, clip_neg=None
):
    adv = adv.clone()
    if tau > 0:
        delta = (teacher - lp).clamp(-(clip_neg or clip), clip)
        adv = adv + tau * delta * mask
    ratio = torch.exp(lp - old)
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps, 1 + eps_high))
    return float((loss * mask).sum() / mask.sum())


@pytest.mark.parametrize("variant", ["on_policy", "old_logprobs", "teacher"])
def test_grpo_avg_loss_matches_reference(client, fresh, variant):
    ids = batch(3)
    gen = torch.Generator().manual_seed(4)
    lp = reference_logprobs(ids)
    mask = torch.zeros(ids.shape)
    mask[:, 8:-1] = 1.0
    adv = torch.randn(ids.shape[0], 1, generator=gen).expand(ids.shape).contiguous()
    config = {"eps_clip": 0.2, "eps_clip_higher": 0.28}
    context = {"input_ids": ids, "loss_mask": mask, "advantages": adv}
    old = lp
    teacher = None
    if variant in ("old_logprobs", "teacher"):
        old = lp + 0.3 * torch.randn(lp.shape, generator=gen)
        context["old_log_probs_shifted"] = shifted(old)
    if variant == "teacher":
        teacher = lp + torch.randn(lp.shape, generator=gen)
        context["teacher_log_probs_shifted"] = shifted(teacher)
        config.update(teacher_tau=0.5, teacher_clip=0.4, teacher_clip_negative=0.6)
    frame = wire.dumps(
        {
            "args": (),
            "kwargs": {"input_ids": ids},
            "context": context,
            "processing": {"loss_fn": "grpo", "post": ["compute_logprobs"], "config": config},
        }
    )
    result = run(client, fresh, client.forward_backward(fresh, frame))
    m = mask[:, :-1]
    expected = reference_grpo(
        lp,
        old,
        adv[:, :-1],
        m,
        0.2,
        0.28,
        teacher,
        config.get("teacher_tau", 0.0),
        config.get("teacher_clip"),
        config.get("teacher_clip_negative"),
    )
    assert result["avg_loss"] == pytest.approx(expected, abs=1e-5)
    metrics = result["metrics"]
    assert metrics["grpo_stats_token_count"] == m.sum()
    if variant == "on_policy":
        assert metrics["clip_ratio"] == 0.0 and metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    if variant == "old_logprobs":
        assert 0.0 < metrics["clip_ratio"] < 1.0
    if variant == "teacher":
        assert metrics["teacher_term_token_count"] == m.sum()
        assert 0.0 < metrics["teacher_clipped_fraction"] < 1.0


@pytest.fixture(scope="module")
def rl_job(client):
    return start(client, [training(), inference(), inference(kind=JobType.LOG_PROBABILITY)])


def test_seeded_generate_is_deterministic_and_token_ids_round_trip(client, rl_job):
    prompt = batch(5, rows=1, length=12)[0].tolist()
    params = {"max_tokens": 8, "temperature": 1.0, "top_p": 0.9, "seed": 11, "logprobs": 0}
    first = run(client, rl_job, client.generate(rl_job, [prompt, prompt], params))["results"]
    again = run(client, rl_job, client.generate(rl_job, [prompt], params))["results"]
    assert first[0]["token_ids"] == first[1]["token_ids"] == again[0]["token_ids"]
    assert first[0]["prompt_token_ids"] == prompt
    other = run(client, rl_job, client.generate(rl_job, [prompt], {**params, "seed": 12}))[
        "results"
    ]
    assert other[0]["token_ids"] != first[0]["token_ids"]


def test_text_prompts_stop_strings_stop_ids_and_length(client, rl_job):
    greedy = {"max_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    base = run(client, rl_job, client.generate(rl_job, ["hello world"], greedy))["results"][0]
    assert base["finish_reason"] == "length" and len(base["token_ids"]) == 12
    assert base["prompt_token_ids"] and base["text"]
    stop_id = base["token_ids"][3]
    by_id = {**greedy, "stop_token_ids": [stop_id]}
    stopped = run(client, rl_job, client.generate(rl_job, ["hello world"], by_id))["results"][0]
    first = base["token_ids"].index(stop_id)
    assert (
        stopped["finish_reason"] == "stop"
        and stopped["token_ids"] == base["token_ids"][: first + 1]
    )
    stop_text = base["text"][len(base["text"]) // 2 :][:3]
    by_text = {**greedy, "stop": [stop_text]}
    cut = run(client, rl_job, client.generate(rl_job, ["hello world"], by_text))["results"][0]
    assert cut["finish_reason"] == "stop" and stop_text not in cut["text"]
    assert base["text"].startswith(cut["text"])


def test_sampler_logprobs_match_log_probability_forward(client, rl_job):
    prompt = batch(6, rows=1, length=10)[0].tolist()
    out = run(
        client,
        rl_job,
        client.generate(
            rl_job, [prompt], {"max_tokens": 6, "temperature": 1.0, "seed": 1, "logprobs": 0}
        ),
    )["results"][0]
    sampled = [float(next(iter(entry.values()))["logprob"]) for entry in out["logprobs"]]
    full = torch.tensor([prompt + out["token_ids"]])
    frame = wire.dumps(
        {"args": (), "kwargs": {"input_ids": full}, "processing": {"post": ["compute_logprobs"]}}
    )
    response = client.forward(rl_job, frame, sub_job_type="log_probability")
    scored = run(client, rl_job, response["request_id"])["post_process_outputs"]["logprobs"][0]
    n = len(out["token_ids"])
    teacher = scored[len(prompt) - 1 : len(prompt) - 1 + n]
    assert torch.allclose(teacher, torch.tensor(sampled), atol=1e-4)


def test_the_raw_dssst1_forward_route_scores_like_the_wrapped_operation(client, rl_job):
    """``POST /{job}/forward`` with the raw frame (what the journeys send, and the form the
    hosted route takes) gives the same logprobs as the SDK's base64-wrapped ``/operation``;
    a body that is not a frame and an unknown sub-job are 400s naming what is wrong."""
    import requests

    from cortex_recipes import raw_forward

    ids = batch(11, rows=2, length=9)
    frame = wire.dumps(
        {"args": (), "kwargs": {"input_ids": ids}, "processing": {"post": ["compute_logprobs"]}}
    )
    scorer = f"{rl_job}:log_prob:0"
    raw = raw_forward.forward(client, rl_job, frame, sub_job_id=scorer)
    wrapped = run(client, rl_job, client.forward(rl_job, frame, sub_job_id=scorer)["request_id"])
    got = raw["post_process_outputs"]["logprobs"]
    assert got.shape == (2, 9) and torch.equal(got, wrapped["post_process_outputs"]["logprobs"])
    by_type = raw_forward.forward(
        client, rl_job, frame, sub_job_id=scorer, sub_job_type="log_probability"
    )
    assert torch.equal(by_type["post_process_outputs"]["logprobs"], got)
    with pytest.raises(requests.HTTPError) as info:
        raw_forward.submit(client, rl_job, b"not a frame", sub_job_id=scorer)
    assert info.value.response.status_code == 400
    assert "forward frame" in info.value.response.json()["message"]
    with pytest.raises(requests.HTTPError) as info:
        raw_forward.submit(client, rl_job, frame, sub_job_id=f"{rl_job}:log_prob:7")
    assert info.value.response.status_code in (400, 404)
    assert "log_prob:7" in info.value.response.json()["message"]


def test_batched_generate_rows_match_rows_sampled_alone(client, rl_job):
    """Prompts of different lengths in one request are left-padded into one batch; each
    row's tokens follow its own seed and its logprobs match the row sampled on its own."""
    prompts = [batch(20 + n, rows=1, length=n)[0].tolist() for n in (5, 12, 9)]
    rows = [{"max_tokens": 6, "temperature": 1.0, "seed": 40 + i, "logprobs": 0} for i in range(3)]
    together = run(client, rl_job, client.generate(rl_job, prompts, rows))["results"]
    for prompt, params, out in zip(prompts, rows, together, strict=True):
        alone = run(client, rl_job, client.generate(rl_job, [prompt], params))["results"][0]
        assert out["token_ids"] == alone["token_ids"]
        assert out["prompt_token_ids"] == prompt
        lp = torch.tensor([float(next(iter(e.values()))["logprob"]) for e in out["logprobs"]])
        lp_alone = torch.tensor(
            [float(next(iter(e.values()))["logprob"]) for e in alone["logprobs"]]
        )
        assert torch.allclose(lp, lp_alone, atol=1e-4)
    assert len({tuple(o["token_ids"]) for o in together}) == 3


def _assert_sampler_matches_trainer(client, job_id):
    prompt = batch(7, rows=1, length=12)[0].tolist()
    out = run(
        client,
        job_id,
        client.generate(job_id, [prompt], {"max_tokens": 4, "temperature": 0.0, "logprobs": 0}),
    )["results"][0]
    ids = torch.tensor([prompt + out["token_ids"]])
    frame = wire.dumps(
        {"args": (), "kwargs": {"input_ids": ids}, "processing": {"post": ["compute_logprobs"]}}
    )
    trainer = run(
        client, job_id, client.forward(job_id, frame, sub_job_type="training")["request_id"]
    )
    trainer_lp = trainer["post_process_outputs"]["logprobs"][
        0, len(prompt) - 1 : len(prompt) - 1 + len(out["token_ids"])
    ]
    sampled = torch.tensor([float(next(iter(e.values()))["logprob"]) for e in out["logprobs"]])
    return trainer_lp, sampled


def train_one_step(client, job_id, seed=8, lr=None):
    ids = batch(seed)
    weights = torch.ones(ids.shape)
    weights[:, -1] = 0
    loss = run(client, job_id, client.forward_backward(job_id, ce_frame(ids, weights)))["avg_loss"]
    return loss, run(client, job_id, client.step(job_id, learning_rate=lr))


def _check_weight_sync(client, job_id, weight_format):
    train_one_step(client, job_id)
    trainer_lp, sampled = _assert_sampler_matches_trainer(client, job_id)
    assert not torch.allclose(trainer_lp, sampled, atol=1e-4), "the step should move the trainer"
    sync = client.weight_sync(
        job_id, f"{job_id}:training:0", [f"{job_id}:sampling:0"], weight_format=weight_format
    )
    run(client, job_id, sync)
    trainer_lp, sampled = _assert_sampler_matches_trainer(client, job_id)
    assert torch.allclose(trainer_lp, sampled, atol=1e-4)


def test_full_weight_sync_makes_sampler_match_trainer(client, rl_job):
    _check_weight_sync(client, rl_job, "hf")


def test_lora_weight_sync_makes_sampler_match_trainer(client):
    job_id = start(client, [training(lora=LORA, lr=1e-2), inference(lora=LORA)])
    _check_weight_sync(client, job_id, "lora")
    client.cancel_job(job_id)


def test_resumable_save_then_load_continues_like_an_uninterrupted_run(client):
    job_id = start(client, [training()])
    before, _ = train_one_step(client, job_id, seed=20)
    after, _ = train_one_step(client, job_id, seed=20)
    assert after < before, "a step on the same batch must lower its loss"
    saved = run(client, job_id, client.save(job_id, checkpoint_type="resumable"))
    assert f"/checkpoints/{saved['checkpoint_id']}/" in saved["stage_path"]
    assert saved["global_steps"] == 2
    train_one_step(client, job_id, seed=21)
    uninterrupted, _ = train_one_step(client, job_id, seed=22)
    run(client, job_id, client.load(job_id, saved["checkpoint_id"]))
    train_one_step(client, job_id, seed=21)
    resumed, step = train_one_step(client, job_id, seed=22)
    assert resumed == pytest.approx(uninterrupted, abs=1e-6)
    assert step["global_steps"] == 4
    ids = [c["checkpoint_id"] for c in client.list_checkpoints(job_id)]
    assert saved["checkpoint_id"] in ids
    client.delete_checkpoint(job_id, saved["checkpoint_id"])
    assert client.list_checkpoints(job_id) == []
    client.cancel_job(job_id)


def test_weights_only_checkpoint_loads_into_a_new_sampling_sub_job(client):
    job_id = start(client, [training(), inference()])
    train_one_step(client, job_id, seed=30)
    saved = run(client, job_id, client.save(job_id, checkpoint_type="weights-only"))
    run(
        client, job_id, client.weight_sync(job_id, f"{job_id}:training:0", [f"{job_id}:sampling:0"])
    )
    source = {"checkpoint_id": saved["checkpoint_id"], "source_job_id": job_id}
    fresh_sampler = start(client, [inference(source=source)])
    prompt = batch(31, rows=1, length=10)[0].tolist()
    params = {"max_tokens": 6, "temperature": 0.0, "logprobs": 0}
    synced = run(client, job_id, client.generate(job_id, [prompt], params))["results"][0]
    loaded = run(client, fresh_sampler, client.generate(fresh_sampler, [prompt], params))[
        "results"
    ][0]
    assert loaded["token_ids"] == synced["token_ids"]
    for a, b in zip(loaded["logprobs"], synced["logprobs"], strict=True):
        assert next(iter(a.values()))["logprob"] == pytest.approx(
            next(iter(b.values()))["logprob"], abs=1e-5
        )
    client.cancel_job(job_id)
    client.cancel_job(fresh_sampler)


def test_generate_completes_while_forward_backward_runs(client, rl_job):
    ids = batch(40, rows=4, length=200)
    weights = torch.ones(ids.shape)
    weights[:, -1] = 0
    training_requests = [client.forward_backward(rl_job, ce_frame(ids, weights)) for _ in range(3)]
    generate_request = client.generate(
        rl_job, [[11, 12, 13]], {"max_tokens": 3, "temperature": 0.0}
    )
    generated = run(client, rl_job, generate_request)
    assert generated["results"][0]["token_ids"]
    for r in training_requests:
        run(client, rl_job, r)
    # Every request has settled now, so these polls answer at once; the generate finished
    # before the training queue it was sent behind.
    generate_done = client.get_request_status(rl_job, generate_request)["updated_at"]
    training_done = [client.get_request_status(rl_job, r)["updated_at"] for r in training_requests]
    assert generate_done < max(training_done), (generate_done, training_done)
    run(client, rl_job, client.step(rl_job, learning_rate=0.0))


def _post(backend, job_id: str, path: str, data: bytes | None = None, json_body=None):
    url = (
        f"{backend.base_url}/api/v2/databases/LOCAL/schemas/PUBLIC/cortex-training/{job_id}/{path}"
    )
    if json_body is not None:
        return requests.post(url, json=json_body, timeout=30)
    return requests.post(
        url, data=data, headers={"Content-Type": "application/octet-stream"}, timeout=30
    )


def _fwd_bwd_chunks(frame: bytes, **options) -> list[bytes]:
    """``frame`` as a forward-backward chunk group of 9000-byte chunks (chunked however small)."""
    return wire.encode_byte_chunks(
        frame, kind="request", operation="fwd-bwd", max_bytes=9000, force_chunk=True, **options
    )


def test_replayed_chunk_group_applies_its_gradient_once(client, backend, fresh):
    ids = batch(50)
    weights = torch.ones(ids.shape)
    weights[:, -1] = 0
    frame = ce_frame(ids, weights)
    chunks = _fwd_bwd_chunks(frame)
    assert len(chunks) > 1
    run(
        client, fresh, client.step(fresh, learning_rate=0.0)
    )  # clear gradients left by earlier tests
    responses = []
    for _ in range(2):  # the whole group, twice
        for chunk in chunks:
            response = _post(backend, fresh, "forward-backward", chunk)
            assert response.status_code == 200, response.text
        responses.append(response.json())
    assert responses[0]["request_id"] == responses[1]["request_id"]
    run(client, fresh, responses[0]["request_id"])
    # lr=0 keeps the weights; the gradient norm tells how many backward passes accumulated.
    twice_sent = run(client, fresh, client.step(fresh, learning_rate=0.0))["grad_norm"]
    run(client, fresh, client.forward_backward(fresh, frame))
    once_sent = run(client, fresh, client.step(fresh, learning_rate=0.0))["grad_norm"]
    assert twice_sent == pytest.approx(once_sent, rel=1e-5)


def test_chunk_group_protocol_errors(backend, fresh):
    ids = batch(51)
    weights = torch.ones(ids.shape)
    chunks = _fwd_bwd_chunks(ce_frame(ids, weights))
    late = _post(backend, fresh, "forward-backward", chunks[1])
    assert late.status_code == 409 and late.json()["code"] == "chunk_group_restart_required"
    other = _fwd_bwd_chunks(ce_frame(batch(52), weights), chunk_group_id="g-conflict")
    assert _post(backend, fresh, "forward-backward", other[0]).status_code == 200
    clash = _fwd_bwd_chunks(ce_frame(ids, weights), chunk_group_id="g-conflict")
    response = _post(backend, fresh, "forward-backward", clash[0])
    assert response.status_code == 409 and response.json()["code"] == "chunk_group_conflict"


BAD_FRAMES = {
    "pickle": (b"\x80\x04\x95" + b"x" * 64, "pickle"),
    "zip": (b"PK\x03\x04" + b"x" * 64, "pickle/torch.save"),
    "not dssst1": (b"\x10\x00\x00\x00\x00\x00\x00\x00{}garbage", "not a valid DSSST1"),
}


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_malformed_frames_are_rejected_and_the_job_stays_usable(client, backend, fresh, name):
    data, message = BAD_FRAMES[name]
    response = _post(backend, fresh, "forward-backward", data)
    assert response.status_code == 400 and message in response.json()["message"]
    ids = batch(60)
    assert (
        run(client, fresh, client.forward_backward(fresh, ce_frame(ids, torch.ones(ids.shape))))[
            "avg_loss"
        ]
        > 0
    )


def _frame(ids, context, processing):
    return wire.dumps(
        {"args": (), "kwargs": {"input_ids": ids}, "context": context, "processing": processing}
    )


def test_bad_payloads_get_400s_that_name_the_problem(client, backend, fresh):
    ids = batch(61)
    ones = torch.ones(ids.shape)
    nan_at_1_3 = torch.zeros(ids.shape)
    nan_at_1_3[1, 3] = float("nan")
    cases = {
        "loss_fn='nope'": _frame(ids, {"loss_mask": ones}, {"loss_fn": "nope"}),
        "unknown keys ['beta']": _frame(ids, {"loss_mask": ones}, {**CE, "config": {"beta": 1}}),
        "context.loss_mask has shape [2, 3]": _frame(ids, {"loss_mask": torch.ones(2, 3)}, CE),
        "context.loss_mask contains non-finite": _frame(
            ids, {"loss_mask": ones * float("nan")}, CE
        ),
        "requires context.advantages": _frame(ids, {"loss_mask": ones}, {"loss_fn": "grpo"}),
        "teacher_log_probs_shifted is non-finite at row 1, position 3": _frame(
            ids,
            {"loss_mask": ones, "advantages": ones, "teacher_log_probs_shifted": nan_at_1_3},
            {"loss_fn": "grpo", "config": {"teacher_tau": 1.0, "teacher_clip": 1.0}},
        ),
        "ids outside": _frame(ids * 0 + 10**7, {"loss_mask": ones}, CE),
    }
    for expected, frame in cases.items():
        response = _post(backend, fresh, "forward-backward", frame)
        assert response.status_code == 400, (expected, response.text)
        assert expected in response.json()["message"], (expected, response.json())
    assert run(client, fresh, client.forward_backward(fresh, ce_frame(ids, ones)))["avg_loss"] > 0


def test_routing_and_missing_resources(client, backend, rl_job):
    frame = wire.dumps({"args": (), "kwargs": {"input_ids": batch(62)}})
    body = {
        "operation_type": "forward",
        "sub_job_type": "sampling",
        "payload": {"payload_b64": "", "content_type": "application/octet-stream"},
    }
    response = _post(backend, rl_job, "operation", json_body=body)
    assert (
        response.status_code == 400
        and "cannot run on sampling sub-job" in response.json()["message"]
    )
    sampler = f"{rl_job}:sampling:0"
    response = _post(
        backend,
        rl_job,
        "operation",
        json_body={
            "operation_type": "weight-sync",
            "sub_job_id": sampler,
            "payload": {"source_sub_job_id": sampler, "target_sub_job_ids": [sampler]},
        },
    )
    assert response.status_code == 400 and "sampling" in response.json()["message"]
    missing = _post(backend, "job-missing", "forward-backward", frame)
    assert missing.status_code == 404 and "job-missing" in missing.json()["message"]
    with pytest.raises(requests.HTTPError) as info:
        client.get_request_status(rl_job, "req-nope")
    assert info.value.response.status_code == 404


def test_oversized_body_is_413(backend, fresh):
    response = _post(backend, fresh, "forward-backward", b"\0" * (3 * 1024 * 1024))
    assert response.status_code == 413 and "exceeds the limit" in response.json()["message"]


def test_bad_job_configs_are_rejected_before_any_worker_starts(client):
    bad = training()
    bad.training.optimizer = {"name": "Lion", "lr": 1e-3}
    with pytest.raises(requests.HTTPError) as info:
        client.create_job([bad])
    assert (
        info.value.response.status_code == 400
        and "only AdamW" in info.value.response.json()["message"]
    )
    absent = training(model="Qwen/Qwen3-0.6B-not-here")
    with pytest.raises(requests.HTTPError) as info:
        client.create_job([absent])
    assert "has no local weights" in info.value.response.json()["message"]


def test_large_results_arrive_as_result_chunks(client, backend, rl_job):
    params = {"max_tokens": 40, "temperature": 1.0, "seed": 5, "logprobs": 20, "ignore_eos": True}
    request_id = client.generate(rl_job, [[11, 12, 13]], params)
    result = run(client, rl_job, request_id)["results"][0]
    assert len(result["token_ids"]) == 40 and all(len(e) >= 20 for e in result["logprobs"])
    url = f"{backend.base_url}/api/v2/databases/LOCAL/schemas/PUBLIC/cortex-training/{rl_job}/requests/{request_id}"
    page = requests.get(url, params={"max_events": 1}, timeout=30).json()
    assert page["result"] is None and page["next_cursor"] == "1"
    assert [e["type"] for e in page["events"]] == ["result_chunk"]


def test_step_clips_gradients_and_reports_lr(client):
    job_id = start(client, [training(clip=0.5)])
    _, step = train_one_step(client, job_id, seed=80, lr=2e-3)
    assert step["last_lr"] == 2e-3 and step["grad_norm"] > 0.5
    client.cancel_job(job_id)
    assert client.get_job(job_id)["status"] == "cancelled"
