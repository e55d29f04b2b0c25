"""The continuous batcher on tiny-qwen3, in process: rows that join a running batch, leave it,
carry their own parameters and are cancelled give what each row gives when sampled alone."""

from __future__ import annotations

import pytest
import torch

from cortex_recipes.local.batcher import Batcher, Limits, Pending, common_prefix
from cortex_recipes.local.decoding import SamplingParams, _Row
from cortex_recipes.models import load_causal_lm, load_tokenizer
from cortex_recipes.models.fixtures import TINY_QWEN3

pytestmark = pytest.mark.contract


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return load_causal_lm(TINY_QWEN3).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TINY_QWEN3)


def prompt(seed: int, length: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, 5000, (length,), generator=g).tolist()


def request(tokenizer, key, prompts, params: SamplingParams) -> Pending:
    rows = [
        _Row(
            tokenizer,
            p,
            params,
            {tokenizer.eos_token_id},
            torch.Generator().manual_seed(params.seed if params.seed is not None else 0),
        )
        for p in prompts
    ]
    return Pending(key=key, rows=rows)


def drain(batcher: Batcher, version: int = 0, max_steps: int = 10_000) -> list[Pending]:
    done: list[Pending] = []
    for _ in range(max_steps):
        if not batcher.busy:
            return done
        done.extend(batcher.step(version))
    raise AssertionError("the batcher did not finish")


def alone(model, tokenizer, p: list[int], params: SamplingParams) -> dict:
    batcher = Batcher(model, pad_id=0)
    req = request(tokenizer, "alone", [p], params)
    batcher.add(req)
    assert drain(batcher) == [req]
    return req.rows[0].result()


def test_rows_that_join_mid_decode_sample_what_they_sample_alone(model, tokenizer):
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)
    hot = SamplingParams(
        max_tokens=7, temperature=0.9, top_k=50, seed=3, ignore_eos=True, logprobs=2
    )
    batcher = Batcher(model, pad_id=0)
    first = request(tokenizer, 1, [prompt(1, 5), prompt(2, 17)], greedy)
    batcher.add(first)
    finished = []
    for _ in range(4):  # prefill + 3 decode steps before the next request arrives
        finished += batcher.step(0)
    second = request(tokenizer, 2, [prompt(3, 30)], hot)  # longer than the running cache
    batcher.add(second)
    finished += drain(batcher)
    # The short request joined later and left first; the batch emptied at the end.
    assert finished == [second, first]
    assert batcher.cache is None and not batcher.slots
    for req, params in ((first, greedy), (second, hot)):
        for row in req.rows:
            ref = alone(model, tokenizer, row.prompt_ids, params)
            out = row.result()
            assert out["token_ids"] == ref["token_ids"]
            assert len(out["token_ids"]) == params.max_tokens
            got = torch.tensor(
                [
                    e[str(t)]["logprob"]
                    for e, t in zip(out["logprobs"], out["token_ids"], strict=True)
                ]
            )
            want = torch.tensor(
                [
                    e[str(t)]["logprob"]
                    for e, t in zip(ref["logprobs"], ref["token_ids"], strict=True)
                ]
            )
            assert torch.allclose(got, want, atol=1e-4)


def test_row_limits_queue_rows_until_a_slot_frees(model, tokenizer):
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    batcher = Batcher(model, pad_id=0, limits=Limits(max_rows=2))
    reqs = [request(tokenizer, i, [prompt(10 + i, 6)], params) for i in range(3)]
    for r in reqs:
        batcher.add(r)
    batcher.step(0)
    assert len(batcher.slots) == 2 and len(batcher.waiting) == 1
    done = drain(batcher)
    assert done == reqs
    for r in reqs:
        assert (
            r.rows[0].result()["token_ids"]
            == alone(model, tokenizer, r.rows[0].prompt_ids, params)["token_ids"]
        )


def test_token_limit_admits_a_lone_oversized_row(model, tokenizer):
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    batcher = Batcher(model, pad_id=0, limits=Limits(max_tokens=8))
    big, small = (request(tokenizer, k, [prompt(k, 20)], params) for k in (1, 2))
    batcher.add(big)
    batcher.add(small)
    batcher.step(0)
    assert [s.request for s in batcher.slots] == [big] and len(batcher.waiting) == 1
    assert drain(batcher) == [big, small]


def test_cancel_drops_running_and_waiting_rows_and_the_rest_finish(model, tokenizer):
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    batcher = Batcher(model, pad_id=0, limits=Limits(max_rows=2))
    keep, doomed = (request(tokenizer, k, [prompt(k, 8), prompt(k + 5, 3)], params) for k in (1, 2))
    batcher.add(keep)
    batcher.add(doomed)
    batcher.step(0)
    assert batcher.cancel(2) is doomed
    assert batcher.cancel(2) is None
    assert drain(batcher) == [keep]
    for row in keep.rows:
        assert (
            row.result()["token_ids"]
            == alone(model, tokenizer, row.prompt_ids, params)["token_ids"]
        )


def test_each_result_names_the_weight_versions_of_its_tokens(model, tokenizer):
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    batcher = Batcher(model, pad_id=0)
    req = request(tokenizer, 1, [prompt(4, 5)], params)
    batcher.add(req)
    batcher.step(3)  # prefill: token 0 under version 3
    batcher.step(3)  # token 1
    drain(batcher, version=4)  # tokens 2..5 after a weight update between two steps
    out = req.rows[0].result()
    assert out["weight_versions"] == [3, 4]
    assert out["weight_version_starts"] == [0, 2]


def test_stop_strings_and_ids_finish_rows_inside_a_shared_batch(model, tokenizer):
    free = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    p = prompt(7, 9)
    ref = alone(model, tokenizer, p, free)["token_ids"]
    stop_id = SamplingParams(
        max_tokens=10, temperature=0.0, ignore_eos=True, stop_token_ids=(ref[3],)
    )
    batcher = Batcher(model, pad_id=0)
    a, b = request(tokenizer, 1, [p], stop_id), request(tokenizer, 2, [p], free)
    batcher.add(a)
    batcher.add(b)
    assert drain(batcher) == [a, b]
    cut = ref.index(ref[3]) + 1
    assert a.rows[0].result()["token_ids"] == ref[:cut]
    assert a.rows[0].result()["finish_reason"] == "stop"
    assert b.rows[0].result()["token_ids"] == ref
    assert b.rows[0].result()["finish_reason"] == "length"


def logprobs_of(out: dict) -> torch.Tensor:
    return torch.tensor(
        [e[str(t)]["logprob"] for e, t in zip(out["logprobs"], out["token_ids"], strict=True)]
    )


def test_common_prefix_leaves_every_prompt_a_token_of_its_own():
    assert common_prefix([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert common_prefix([[1, 2, 3], [1, 2, 3, 4]]) == 2  # one prompt is the other's prefix
    assert common_prefix([[7, 2], [8, 2]]) == 0


def test_prompts_sharing_a_prefix_prefill_it_once_and_sample_what_they_sample_alone(
    model, tokenizer
):
    """A group whose prompts share a prefix of at least MIN_SHARED_PREFIX tokens runs the
    prefix once and each rest after it (identical prompts once in all): every row still gets
    the tokens it gets alone and its logprobs within 1e-4, greedy and seeded sampling alike,
    including a row that joins the running batch afterwards."""
    system = prompt(20, 24)
    prompts = [system + prompt(21, 5), system + prompt(22, 11), system + prompt(21, 5)]
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)
    hot = SamplingParams(max_tokens=6, temperature=1.0, seed=5, ignore_eos=True, logprobs=1)
    calls = []
    hook = model.register_forward_pre_hook(
        lambda _m, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    try:
        batcher = Batcher(model, pad_id=0)
        first = request(tokenizer, 1, prompts, greedy)
        sampled = request(tokenizer, 2, prompts, hot)
        batcher.add(first)
        batcher.add(sampled)
        batcher.step(0)  # the prefill of all six rows
        # the prefix once, then the two distinct rests (11 tokens wide): not 6 rows x 35
        assert calls == [(1, 24), (2, 11)]
        batcher.step(0)
        late = request(tokenizer, 3, [system + prompt(23, 3)], greedy)
        batcher.add(late)
        done = drain(batcher)
    finally:
        hook.remove()
    assert sorted(r.key for r in done) == [1, 2, 3]
    for req, params in ((first, greedy), (sampled, hot), (late, greedy)):
        for row in req.rows:
            ref = alone(model, tokenizer, row.prompt_ids, params)
            out = row.result()
            assert out["token_ids"] == ref["token_ids"]
            assert torch.allclose(logprobs_of(out), logprobs_of(ref), atol=1e-4)
    # the two identical prompts under the same seed drew the same tokens
    assert sampled.rows[0].result()["token_ids"] == sampled.rows[2].result()["token_ids"]
