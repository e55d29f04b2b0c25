"""The offline fixture models: deterministic builds, faithful tokenizers, a working forward."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from cortex_recipes.models import build_fixture, load_causal_lm, load_tokenizer
from cortex_recipes.models.fixtures import SMOLLM2_135M_INSTRUCT, SMOLLM2_STUDENT, TINY_QWEN3

pytestmark = pytest.mark.contract


def _digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def user_turn(tok, content: str) -> dict:
    """One user message through the chat template, with the generation prompt (pt tensors)."""
    return tok.apply_chat_template(
        [{"role": "user", "content": content}],
        add_generation_prompt=True,
        return_dict=True,
        return_tensors="pt",
    )


@pytest.mark.parametrize(
    "name",
    [
        TINY_QWEN3,
        pytest.param(SMOLLM2_STUDENT, marks=pytest.mark.slow),
        pytest.param(SMOLLM2_135M_INSTRUCT, marks=pytest.mark.slow),
    ],
)
def test_fixture_builds_are_byte_identical(name, tmp_path):
    first = build_fixture(name, root=tmp_path / "a")
    second = build_fixture(name, root=tmp_path / "b")
    digests = _digests(first)
    assert "model.safetensors" in digests and "tokenizer.json" in digests
    assert digests == _digests(second)


def test_tiny_qwen3_has_about_ten_million_parameters():
    model = load_causal_lm(TINY_QWEN3)
    n_params = sum(p.numel() for p in model.parameters())
    assert 9_000_000 <= n_params <= 11_000_000
    assert model.config.tie_word_embeddings


def test_tiny_qwen3_uses_the_shipped_qwen3_chat_template():
    tok = load_tokenizer(TINY_QWEN3)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids("<tool_call>") == 151657
    assert tok.eos_token == "<|im_end|>"


@pytest.mark.parametrize("name", [TINY_QWEN3, SMOLLM2_STUDENT, SMOLLM2_135M_INSTRUCT])
def test_fixture_forward_pass_gives_finite_next_token_logprobs(name):
    tok = load_tokenizer(name)
    model = load_causal_lm(name)
    ids = user_turn(tok, "What is 12 + 30?")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape[:2] == ids.shape
    assert logits.shape[-1] >= len(tok)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    assert torch.isfinite(logprobs).all()


SMOLLM2_ROUND_TRIP = [
    "0",
    "7 8 9",
    "12345678901234567890",
    "    1",
    "\t42",
    " 3.14159",
    "x\n\n  42.5\t7",
    "1,000,000 and 2 000",
    "  \n \t  ",
    "line one\r\nline 2   ",
    "v1.2.3-rc4",
    "€100 ≈ ¥15,800",
]


@pytest.mark.parametrize("text", SMOLLM2_ROUND_TRIP)
def test_smollm2_tokenizer_round_trips_digits_and_whitespace(text):
    tok = load_tokenizer(SMOLLM2_135M_INSTRUCT)
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    pieces = tok.convert_ids_to_tokens(ids)
    # SmolLM2 splits every digit into its own token (the GGUF converter in transformers loses it).
    for piece in pieces:
        assert sum(c in "0123456789" for c in piece) <= 1, (text, pieces)


def test_smollm2_tokenizer_keeps_whitespace_before_digits_as_one_token():
    tok = load_tokenizer(SMOLLM2_135M_INSTRUCT)
    assert tok.convert_ids_to_tokens(tok.encode("    1", add_special_tokens=False)) == [
        "ĠĠĠĠ",
        "1",
    ]
    assert tok.encode("hello", add_special_tokens=False) == tok.encode(
        "hello", add_special_tokens=True
    ), "no BOS is prepended"


def test_smollm2_greedy_answer_is_coherent():
    tok = load_tokenizer(SMOLLM2_135M_INSTRUCT)
    model = load_causal_lm(SMOLLM2_135M_INSTRUCT)
    enc = user_turn(tok, "What is the capital of France?")
    out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_smollm2_student_shares_the_smollm2_tokenizer():
    student, teacher = load_tokenizer(SMOLLM2_STUDENT), load_tokenizer(SMOLLM2_135M_INSTRUCT)
    assert student.get_vocab() == teacher.get_vocab()
    assert student.chat_template == teacher.chat_template
