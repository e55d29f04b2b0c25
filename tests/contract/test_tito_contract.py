"""TITO contracts: token extension across turns, no re-encoding of prefixes, action masks,
template rejection, over-long trajectories, and the gateway's wire format.

The real verifiers TrainClient, the real renderers Qwen3 renderer and the real Qwen3 tokenizer
run here. Only the sampler behind the gateway is scripted (a narrow fake): it answers the
first turn with a ``facts_lookup`` call and the second with the tool's answer, as token ids
from the real tokenizer.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from tests import extras

pytest.importorskip("verifiers", reason=extras.reason("tito"))

import renderers.base
import requests
import torch
import verifiers.v1 as vf
from cortex_training import wire
from transformers import AutoTokenizer
from verifiers.v1.clients import resolve_client
from verifiers.v1.clients.train import ElasticRendererPool
from verifiers.v1.configs.client import TrainClientConfig

from cortex_recipes.envs.glossary import (
    FACTS,
    GlossaryConfig,
    GlossaryTaskset,
    GlossaryToolset,
    GlossaryToolsetConfig,
    tool_specs,
)
from cortex_recipes.gateway import Gateway, create_gateway_app, derived_seed
from cortex_recipes.models import resolve_model_path
from cortex_recipes.supervision import make_renderer
from cortex_recipes.tito.episode import (
    PrefixExtensionError,
    TurnRecord,
    check_extension,
    run_episode,
)
from cortex_recipes.tito.prefix import TemplateExtensionError, check_linear_history
from cortex_recipes.tito.training import demonstration, episode_frame, wire_tools

pytestmark = pytest.mark.contract

MODEL = "tiny-qwen3"


@pytest.fixture(scope="module")
def tokenizer_path():
    return str(resolve_model_path(MODEL))


@pytest.fixture(scope="module")
def tokenizer(tokenizer_path):
    return AutoTokenizer.from_pretrained(tokenizer_path)


class ScriptedSampler:
    """Turn 1: a facts_lookup call for the task's entity; turn 2: the answer in tags."""

    def __init__(self, tokenizer, entity: str):
        self.tokenizer = tokenizer
        self.entity = entity
        self.calls: list[dict] = []
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def __call__(self, prompt_ids: list[int], params: dict) -> dict:
        seen = self.tokenizer.decode(prompt_ids)  # the fake's own view, not the client's path
        if "<tool_response>" in seen:
            text = f"<think>\n\n</think>\n\n<answer>{FACTS[self.entity]}</answer>"
        else:
            call = {"name": "facts_lookup", "arguments": {"name": self.entity.title()}}
            text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.end]
        ids = ids[: params.get("max_tokens", len(ids))]
        self.calls.append({"prompt": list(prompt_ids), "params": dict(params), "completion": ids})
        return {
            "token_ids": ids,
            "logprobs": [{str(t): {"logprob": -0.25}} for t in ids],
            "finish_reason": "stop" if ids[-1] == self.end else "length",
        }


class EncodeSpy:
    """Records every text the client-side tokenizer encodes."""

    def __init__(self):
        self.texts: list[str] = []


@pytest.fixture
def spy(monkeypatch, tokenizer_path):
    record = EncodeSpy()
    original = renderers.base.load_tokenizer

    def load_with_spy(name, *args, **kwargs):
        tok = original(name, *args, **kwargs)
        base = type(tok)

        class Spy(base):
            def __call__(self, text, *a, **k):
                record.texts.extend([text] if isinstance(text, str) else list(text))
                return base.__call__(self, text, *a, **k)

            def encode(self, text, *a, **k):
                record.texts.append(text)
                return base.encode(self, text, *a, **k)

        tok.__class__ = Spy
        return tok

    monkeypatch.setattr(renderers.base, "load_tokenizer", load_with_spy)
    monkeypatch.setattr(ElasticRendererPool, "_renderers", {})
    return record


def play(tokenizer_path, sampler, *, entity="ada lovelace", max_model_len=1024, max_tokens=64):
    tasks = {t.data.name.lower(): t for t in GlossaryTaskset(GlossaryConfig()).load()}
    toolset = GlossaryToolset(GlossaryToolsetConfig())
    app = create_gateway_app(sampler, model=MODEL, max_model_len=max_model_len)
    with Gateway(app) as gateway:
        import os

        os.environ.setdefault("CORTEX_TITO_GATEWAY_KEY", "local")
        client = resolve_client(
            TrainClientConfig(
                base_url=gateway.base_url,
                api_key_var="CORTEX_TITO_GATEWAY_KEY",
                renderer=__import__("renderers.configs", fromlist=["x"]).Qwen3RendererConfig(),
                renderer_model_name=tokenizer_path,
            )
        )
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(
                run_episode(
                    client,
                    model=MODEL,
                    task=tasks[entity],
                    toolset=toolset,
                    tools=tool_specs(toolset),
                    sampling=vf.SamplingConfig(temperature=1.0, max_tokens=max_tokens),
                    session_id="contract",
                    max_turns=4,
                )
            ), app
        finally:
            loop.close()


def test_each_turn_extends_the_previous_prompt_and_completion(tokenizer, tokenizer_path, spy):
    sampler = ScriptedSampler(tokenizer, "ada lovelace")
    episode, app = play(tokenizer_path, sampler)
    assert episode.stop == "answered" and episode.reward == 1.0
    assert len(episode.turns) == 2 and episode.tool_turns == 1
    first, second = episode.turns
    assert not first.bridged and second.bridged
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == (
        first.prompt_ids + first.completion_ids
    )
    # The gateway saw exactly the ids the client rendered; the trace is that token stream.
    assert [p for _, p, _ in app.state.requests] == [first.prompt_ids, second.prompt_ids]
    assert episode.token_ids == second.prompt_ids + second.completion_ids
    assert episode.branches == 1


def test_prefixes_are_never_decoded_and_re_encoded(tokenizer, tokenizer_path, spy):
    sampler = ScriptedSampler(tokenizer, "marie curie")
    episode, _ = play(tokenizer_path, sampler, entity="marie curie")
    assert episode.stop == "answered"
    call_text = tokenizer.decode(episode.turns[0].completion_ids)
    prompt_text = GlossaryTaskset(GlossaryConfig()).load()[1].data.prompt
    assert spy.texts, "the spy saw no encoding at all; it is not wired to the client's tokenizer"
    turn2 = [t for t in spy.texts if FACTS["marie curie"] in t]
    assert turn2, "the tool result (new tail) should have been encoded"
    sampled_call = '"arguments": {"name": "Marie Curie"}'
    for text in spy.texts:
        assert sampled_call not in text, f"a sampled tool call was re-encoded: {text!r}"
        assert call_text not in text
    # The user prompt is encoded once, for the first turn only.
    assert sum(prompt_text in t for t in spy.texts) <= 1


def test_action_mask_is_exactly_the_sampled_tokens(tokenizer, tokenizer_path, spy):
    sampler = ScriptedSampler(tokenizer, "alan turing")
    episode, _ = play(tokenizer_path, sampler, entity="alan turing")
    expected = [False] * len(episode.token_ids)
    for turn in episode.turns:
        start = len(turn.prompt_ids)
        for i in range(start, start + len(turn.completion_ids)):
            expected[i] = True
    assert episode.sampled_mask == expected
    fact_ids = tokenizer.encode(FACTS["alan turing"], add_special_tokens=False)
    text = tokenizer.decode(episode.token_ids)
    assert "<tool_response>" in text
    response_start = text.index("<tool_response>")
    masked_text = tokenizer.decode(
        [t for t, m in zip(episode.token_ids, episode.sampled_mask, strict=True) if m]
    )
    assert "<tool_response>" not in masked_text, "tool tokens must be context only"
    assert response_start > 0 and len(fact_ids) > 0
    assert len(episode.logprobs) == len(episode.token_ids)
    assert all(
        lp == -0.25 for lp, m in zip(episode.logprobs, episode.sampled_mask, strict=True) if m
    )

    frame, stats = episode_frame([[episode, episode]], pad_id=0, loss_config={})
    ctx = wire.loads(frame)["context"]
    shifted = torch.tensor([float(m) for m in episode.sampled_mask[1:]] + [0.0])
    assert torch.equal(ctx["loss_mask"][0], shifted)
    assert stats["trainable_tokens"] == 2 * sum(episode.sampled_mask)
    assert not ctx["advantages"].any()  # equal rewards in the group: zero advantage


def test_over_long_trajectory_stops_and_keeps_what_was_sampled(tokenizer, tokenizer_path, spy):
    sampler = ScriptedSampler(tokenizer, "grace hopper")
    first_prompt_len = None

    def probe(prompt_ids, params):
        nonlocal first_prompt_len
        first_prompt_len = first_prompt_len or len(prompt_ids)
        return sampler(prompt_ids, params)

    # Room for the first turn only: the second prompt is longer than max_model_len.
    demo = play(tokenizer_path, ScriptedSampler(tokenizer, "grace hopper"), entity="grace hopper")[
        0
    ]
    limit = len(demo.turns[1].prompt_ids) - 1
    episode, _ = play(tokenizer_path, probe, entity="grace hopper", max_model_len=limit)
    assert episode.stop == "overlong" and episode.reward == 0.0
    assert len(episode.turns) == 1 and episode.turns[0].tool_calls
    assert len(episode.token_ids) < limit
    assert sum(episode.sampled_mask) == len(episode.turns[0].completion_ids)


def test_templates_that_cannot_extend_turns_are_rejected(tokenizer):
    from renderers import create_renderer
    from renderers.configs import DefaultRendererConfig

    tools = wire_tools(tool_specs(GlossaryToolset(GlossaryToolsetConfig())))
    ok = check_linear_history(
        make_renderer(tokenizer, "qwen3"),
        demonstration("ada lovelace", FACTS["ada lovelace"]),
        tools,
    )
    assert ok["turns"] == 2
    chat_template = create_renderer(tokenizer, DefaultRendererConfig(tool_parser="qwen3"))
    with pytest.raises(TemplateExtensionError, match="cannot bridge to assistant message 3"):
        check_linear_history(
            chat_template, demonstration("ada lovelace", FACTS["ada lovelace"]), tools
        )


def test_a_turn_that_rewrites_history_is_rejected_naming_it():
    turns = [
        TurnRecord([1, 2, 3], [4, 5], [-1.0, -1.0], False, "tool_calls", [{}]),
        TurnRecord([1, 2, 3, 4, 5, 6, 7], [8], [-1.0], True, "tool_calls", [{}]),
        TurnRecord([1, 2, 3, 9, 5, 6, 7, 8, 10], [11], [-1.0], True, "stop", []),
    ]
    check_extension(turns[:2])
    with pytest.raises(PrefixExtensionError, match="turn 2's prompt .* differ at token 3"):
        check_extension(turns)


def test_gateway_speaks_the_generate_wire_format(tokenizer):
    sampler = ScriptedSampler(tokenizer, "ada lovelace")
    app = create_gateway_app(sampler, model=MODEL, max_model_len=64, base_seed=7)
    with Gateway(app) as gateway:
        root = gateway.base_url.removesuffix("/v1")
        models = requests.get(f"{gateway.base_url}/models", timeout=10).json()
        assert models["data"][0] == {"id": MODEL, "object": "model", "max_model_len": 64}
        body = {
            "model": MODEL,
            "token_ids": [1, 2, 3],
            "sampling_params": {"max_tokens": 4, "logprobs": 1, "top_k": -1},
        }
        out = requests.post(
            f"{root}/inference/v1/generate", json=body, headers={"X-Session-ID": "s"}, timeout=10
        ).json()
        choice = out["choices"][0]
        assert len(choice["token_ids"]) == 4 and choice["finish_reason"] == "length"
        assert [e["token"] for e in choice["logprobs"]["content"]] == [
            f"token_id:{t}" for t in choice["token_ids"]
        ]
        assert sampler.calls[-1]["params"]["seed"] == derived_seed("s", 3, 7)
        assert "top_k" not in sampler.calls[-1]["params"]
        bad = requests.post(
            f"{root}/inference/v1/generate",
            json={**body, "sampling_params": {"beam_width": 2}},
            timeout=10,
        )
        assert bad.status_code == 400 and "beam_width" in bad.json()["error"]
        wrong = requests.post(
            f"{root}/inference/v1/generate", json={**body, "model": "other"}, timeout=10
        )
        assert wrong.status_code == 404
        long = requests.post(
            f"{root}/inference/v1/generate", json={**body, "token_ids": list(range(64))}, timeout=10
        )
        assert long.status_code == 400 and "max_model_len is 64" in long.json()["error"]
