"""Sampled completions as exact token ids, and the prediction-aligned tensors built from them.

A row is ``prompt_ids + completion_ids``. Column ``i`` of every ``*_shifted`` tensor and of
the mask scores token ``i + 1``, so a completion of ``C`` tokens after a prompt of ``P``
occupies columns ``P - 1 .. P + C - 2``; the last column is never trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


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


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def completion_mask(rollouts: Sequence[Rollout], width: int) -> torch.Tensor:
    """Prediction-aligned mask: 1 where column ``i`` predicts a sampled completion token."""
    mask = torch.zeros(len(rollouts), width)
    for r, rollout in enumerate(rollouts):
        start = len(rollout.prompt_ids) - 1
        mask[r, start : start + len(rollout.completion_ids)] = 1.0
    return mask


def sampler_logprobs_shifted(rollouts: Sequence[Rollout], width: int) -> torch.Tensor:
    """The sampler's logprobs placed like the mask (the behaviour policy for PPO ratios)."""
    out = torch.zeros(len(rollouts), width)
    for r, rollout in enumerate(rollouts):
        start = len(rollout.prompt_ids) - 1
        out[r, start : start + len(rollout.completion_ids)] = torch.tensor(rollout.sampler_logprobs)
    return out
