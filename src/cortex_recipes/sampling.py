"""Generate through the SDK and poll: exact prompt token ids in, token ids and text out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def chat_prompt_ids(tokenizer, user_text: str) -> list[int]:
    """Token ids of a one-user-turn chat prompt ending with the assistant opener."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def generate(
    client, job_id: str, prompts: Sequence[list[int]], params: dict[str, Any]
) -> list[dict]:
    request_id = client.generate(job_id, [list(p) for p in prompts], params)
    return client.poll_request(job_id, request_id)["results"]


def greedy_answers(
    client, job_id: str, tokenizer, questions: Sequence[str], *, max_tokens: int
) -> list[str]:
    """Greedy answers to single-turn questions, stopping at the end-of-turn token."""
    params = {
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stop_token_ids": [tokenizer.eos_token_id],
    }
    from cortex_recipes.progress import task

    prompts = [chat_prompt_ids(tokenizer, q) for q in questions]
    with task(f"eval: {len(prompts)} greedy answers"):
        results = generate(client, job_id, prompts, params)
    return [tokenizer.decode(r["token_ids"], skip_special_tokens=True).strip() for r in results]
