"""Sampled completions as exact token ids and the sampler's logprob of each.

A rollout's sequence is ``prompt_ids + completion_ids``; :func:`cortex_recipes.frames.rollout_row`
turns it into a training row (weights on the completion) and
:func:`cortex_recipes.frames.pad_batch` into prediction-aligned tensors, where a completion of
``C`` tokens after a prompt of ``P`` occupies columns ``P - 1 .. P + C - 2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logprobs: list[float]  # the sampler's logprob of each completion token
    finish_reason: str = "length"

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


def chosen_logprob(entry: Any, token: int) -> float:
    """The sampled ``token``'s logprob from one position's logprob entry, in any shape a
    Cortex sampler documents: a dict keyed by the token id (a string here, a string or an int
    on hosted Cortex) whose value is ``{"logprob": x}`` (the local backend) or ``x`` itself (a
    float, as hosted answers), or a bare float. An entry without the token is read only when it
    holds exactly one candidate."""
    if isinstance(entry, int | float) and not isinstance(entry, bool):
        return float(entry)
    if not isinstance(entry, dict) or not entry:
        raise ValueError(f"logprob entry {entry!r:.80} for token {token} is not a dict or number")
    for key in (str(token), token):
        if key in entry:
            value = entry[key]
            break
    else:
        if len(entry) != 1:
            raise ValueError(f"logprob entry has no candidate for sampled token {token}")
        value = next(iter(entry.values()))
    if isinstance(value, dict):
        value = value.get("logprob")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"logprob of token {token} is {value!r:.80}; accepted: a number")
    return float(value)


def rollouts_from_results(prompts: Sequence[list[int]], results: Sequence[dict]) -> list[Rollout]:
    """Rollouts from generate results requested with ``logprobs=0`` (one entry per token)."""
    out = []
    for i, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        entries = result.get("logprobs")
        if entries is None or len(entries) != len(result["token_ids"]):
            raise ValueError(
                f"generate result {i} has {len(entries or [])} logprob entries for "
                f"{len(result['token_ids'])} tokens; request logprobs=0"
            )
        logprobs = [
            chosen_logprob(entry, token)
            for token, entry in zip(result["token_ids"], entries, strict=True)
        ]
        out.append(
            Rollout(
                list(prompt),
                list(result["token_ids"]),
                logprobs,
                result.get("finish_reason") or "length",
            )
        )
    return out
