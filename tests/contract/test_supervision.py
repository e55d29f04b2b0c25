"""Renderer weights -> next-token loss masks, and the SFT forward-backward payload."""

from __future__ import annotations

import functools

import pytest
import torch
from cortex_training import wire
from hypothesis import given, settings
from hypothesis import strategies as st

from cortex_recipes.frames import Row, legacy_labels_frame, sft_frame, shift
from cortex_recipes.models import load_tokenizer
from cortex_recipes.supervision import (
    SupervisionError,
    TrainOnWhat,
    collate,
    make_renderer,
    render_supervised,
)
from tests import extras

pytestmark = pytest.mark.contract

SETUPS = {
    "qwen3-renderer": ("tiny-qwen3", "qwen3"),
    "smollm2-template": ("smollm2-135m-instruct", "chat_template"),
    "smollm2-default-renderer": ("smollm2-135m-instruct", "default"),
}
# The qwen3 renderer comes from the `renderers` package (the sft extra).
NEEDS = {"qwen3-renderer": extras.requires("sft")}
SETUP_NAMES = [pytest.param(n, marks=NEEDS.get(n, ())) for n in sorted(SETUPS)]

# A few conversations the renderer comparisons run on: no system turn (SmolLM2's template adds
# its own), a system turn, several turns, and text whose tokens could merge across a boundary.
COMPARED = [
    [{"role": "user", "content": "Who trained you?"}, {"role": "assistant", "content": "Me."}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "  x é 3.5"},
        {"role": "assistant", "content": "yes! the cat"},
    ],
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ],
]


@functools.cache
def setup(name: str):
    model, renderer = SETUPS[name]
    tokenizer = load_tokenizer(model)
    return tokenizer, make_renderer(tokenizer, renderer)


words = st.sampled_from(["hi", "ok", "12", "the cat", "3.5", "  x", "yes!", "Snowflake", "é"])
text = st.lists(words, min_size=1, max_size=4).map(" ".join)
weight = st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0])


@st.composite
def conversations(draw):
    turns = draw(st.integers(1, 3))
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(text)})
    for _ in range(turns):
        messages.append({"role": "user", "content": draw(text)})
        messages.append({"role": "assistant", "content": draw(text), "weight": draw(weight)})
    return messages


def _supervised_text(tokenizer, example: Row, target: float) -> str:
    return tokenizer.decode(
        [t for t, w in zip(example.token_ids, example.weights, strict=True) if w == target]
    )


@pytest.mark.parametrize("name", SETUP_NAMES)
@settings(max_examples=40, deadline=None)
@given(messages=conversations(), train_on=st.sampled_from(list(TrainOnWhat)))
def test_weights_follow_messages_and_mask_is_next_token_aligned(name, messages, train_on):
    tokenizer, renderer = setup(name)
    example = render_supervised(messages, tokenizer, renderer, train_on)
    assistant = [m for m in messages if m["role"] == "assistant"]
    selected = assistant[-1:] if train_on == TrainOnWhat.LAST_ASSISTANT_MESSAGE else assistant
    expected = {m["weight"] for m in selected if m["weight"] > 0}
    assert set(example.weights) - {0.0} == expected  # weights preserved, not collapsed
    for w in expected:
        supervised = _supervised_text(tokenizer, example, w)
        for message in selected:
            if message["weight"] == w:
                assert (
                    message["content"].strip() in supervised
                )  # a boundary-merged space stays context
        assert supervised.endswith(tokenizer.eos_token)  # trained through the turn close
    mask = shift(example.weights)
    assert len(mask) == len(example.token_ids) and mask[-1] == 0.0
    assert mask[:-1] == example.weights[1:]


@pytest.mark.parametrize("name", SETUP_NAMES)
def test_user_system_and_unselected_tokens_are_never_supervised(name):
    tokenizer, renderer = setup(name)
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "question one"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "question two"},
        {"role": "assistant", "content": "second answer", "weight": 0.5},
    ]
    last = render_supervised(messages, tokenizer, renderer, TrainOnWhat.LAST_ASSISTANT_MESSAGE)
    supervised = _supervised_text(tokenizer, last, 0.5)
    assert "second answer" in supervised and "first answer" not in supervised
    assert "question" not in supervised and "sys" not in supervised
    assert set(last.weights) == {0.0, 0.5}


@pytest.mark.parametrize(
    ("renderer", "message"),
    [
        ("chat_template", r"does not extend its earlier render at messages\[1\]"),
        ("default", r"does not extend the render of messages\[:1\] token for token"),
    ],
)
def test_template_that_rewrites_history_is_rejected(renderer, message):
    tokenizer, _ = setup("smollm2-template")
    broken = tokenizer.chat_template.replace(
        "{% for message in messages %}", "{% for message in messages[-2:] %}"
    )
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    tokenizer.chat_template = broken
    with pytest.raises(SupervisionError, match=message):
        render_supervised(
            COMPARED[2],
            tokenizer,
            make_renderer(tokenizer, renderer),
            TrainOnWhat.ALL_ASSISTANT_MESSAGES,
        )


@pytest.mark.parametrize("messages", COMPARED)
def test_default_renderer_reproduces_the_smollm2_chat_template_token_for_token(messages):
    tokenizer, renderer = setup("smollm2-default-renderer")
    expected = list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False))
    assert list(renderer.render(messages).token_ids) == expected


def test_qwen3_renderer_refuses_the_smollm2_tokenizer():
    """Why SmolLM2 renders through ``default``: the Qwen3 renderer needs Qwen's
    ``<|endoftext|>`` special token, which SmolLM2's vocabulary only has as its unknown token,
    so the package refuses to build it (and it would not add SmolLM2's default system turn)."""
    tokenizer, _ = setup("smollm2-template")
    with pytest.raises(AssertionError, match="endoftext"):
        make_renderer(tokenizer, "qwen3")


@pytest.mark.parametrize("messages", COMPARED)
def test_default_renderer_supervises_what_the_chat_template_path_supervises(messages):
    tokenizer, renderer = setup("smollm2-default-renderer")
    weighted = [
        {**m, "weight": 0.2 if i % 4 == 1 else 1.0} if m["role"] == "assistant" else m
        for i, m in enumerate(messages)
    ]
    for train_on in TrainOnWhat:
        ours = render_supervised(weighted, tokenizer, renderer, train_on)
        assert ours == render_supervised(weighted, tokenizer, None, train_on)


def test_bad_message_weight_names_the_message():
    tokenizer, renderer = setup("qwen3-renderer")
    with pytest.raises(SupervisionError, match=r"messages\[1\].weight=-1"):
        render_supervised(
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "weight": -1}],
            tokenizer,
            renderer,
            TrainOnWhat.ALL_ASSISTANT_MESSAGES,
        )


def _example(n: int, supervised_from: int, w: float = 1.0) -> Row:
    return Row(list(range(100, 100 + n)), [0.0] * supervised_from + [w] * (n - supervised_from))


@pytest.mark.parametrize("max_seq_len", [5, 6, 7, 8, 9, 10])
def test_truncation_keeps_alignment_at_and_around_the_boundary(max_seq_len):
    example = _example(9, supervised_from=6, w=0.5)  # tokens 6, 7, 8 supervised
    batch = collate([example, _example(4, 1)], pad_id=0, max_seq_len=max_seq_len)
    if max_seq_len <= 6:  # nothing supervised survives: the example is dropped, never sent
        assert batch.n_dropped == 1 and batch.input_ids.shape[0] == 1
        return
    row_ids, row_mask = batch.input_ids[0], batch.loss_mask[0]
    kept = min(9, max_seq_len)
    assert row_ids[:kept].tolist() == list(range(100, 100 + kept))
    expected = [0.0] * 5 + [0.5] * (kept - 6) + [0.0]  # column i weights token i + 1
    assert row_mask[:kept].tolist() == expected
    assert batch.n_truncated == (1 if max_seq_len < 9 else 0)


def test_padding_is_right_and_never_supervised():
    batch = collate([_example(3, 1), _example(6, 2, w=0.25)], pad_id=7, max_seq_len=16)
    assert batch.input_ids.tolist()[0] == [100, 101, 102, 7, 7, 7]
    assert batch.loss_mask.tolist()[0] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert batch.loss_mask.tolist()[1] == [0.0, 0.25, 0.25, 0.25, 0.25, 0.0]


def test_batch_with_nothing_supervised_is_an_error():
    with pytest.raises(SupervisionError, match="no example"):
        collate([_example(4, 4)], pad_id=0, max_seq_len=8)


def test_sft_payload_decodes_to_the_causal_cross_entropy_contract():
    batch = collate([_example(5, 2, w=0.5), _example(3, 1)], pad_id=0, max_seq_len=8)
    frame = wire.loads(sft_frame(batch))
    assert frame["processing"] == {
        "loss_fn": "causal_cross_entropy",
        "post": ["compute_logprobs"],
        "config": {},
    }
    assert set(frame["kwargs"]) == {"input_ids"}  # no labels
    assert torch.equal(frame["kwargs"]["input_ids"], batch.input_ids)
    assert torch.equal(frame["context"]["input_ids"], batch.input_ids)
    mask = frame["context"]["loss_mask"]
    assert mask.dtype == torch.float32
    assert mask.tolist() == [[0.0, 0.5, 0.5, 0.5, 0.0], [1.0, 1.0, 0.0, 0.0, 0.0]]


def test_legacy_labels_payload_marks_the_same_tokens():
    batch = collate([_example(5, 2, w=0.5)], pad_id=0, max_seq_len=8)
    frame = wire.loads(legacy_labels_frame(batch))
    assert "processing" not in frame
    assert frame["kwargs"]["labels"].tolist() == [[-100, -100, 102, 103, 104]]
