"""Sampled completions as exact token ids and the sampler's logprob of each.

A rollout's sequence is ``prompt_ids + completion_ids``; :func:`cortex_recipes.frames.rollout_row`
turns it into a training row (weights on the completion) and
:func:`cortex_recipes.frames.pad_batch` into prediction-aligned tensors, where a completion of
``C`` tokens after a prompt of ``P`` occupies columns ``P - 1 .. P + C - 2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logprobs: list[float]  # the sampler's logprob of each completion token
    finish_reason: str = "length"

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


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
        logprobs = []
        for token, entry in zip(result["token_ids"], entries, strict=True):
            chosen = entry.get(str(token)) or next(iter(entry.values()))
            logprobs.append(float(chosen["logprob"]))
        out.append(
            Rollout(
                list(prompt),
                list(result["token_ids"]),
                logprobs,
                result.get("finish_reason") or "length",
            )
        )
    return out
