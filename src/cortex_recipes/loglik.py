"""Held-out answer log-likelihood through the backend's ``forward``, and the weight comparison.

An SFT profile whose data trains one answer at full weight and another at a fractional weight
shows the weight working by how much each answer's held-out log-likelihood rises. An item is a
held-out user prompt with a taught answer; its score is the mean log-probability per answer
token (the tokens the SFT mask supervises: the answer through its turn-closing token) given
the prompt, rendered the way the profile renders its training data. Scores come from a
``forward`` with ``compute_logprobs`` on the training sub-job, whose log-probabilities are
prediction-aligned (column ``i`` scores token ``i + 1``), like the SFT ``loss_mask``.

:func:`compare_weights` turns scores before and after training into per-item gains and the
paired difference ``mean(full gain - down gain)`` with a bootstrap interval over the item
pairs (item ``k`` of each answer is asked the same way, so pairing removes the prompt's
difficulty from the comparison).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from cortex_recipes import frames, intervals, raw_forward
from cortex_recipes.supervision import TrainOnWhat, render_supervised


class LoglikError(RuntimeError):
    """Scores that cannot be computed or trusted (no answer token, a bad forward result)."""


def scoring_rows(
    tokenizer, renderer, items: Sequence[tuple[str, str]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` [B, T] (right-padded) and a prediction-aligned 0/1 answer mask [B, T]
    for ``(prompt, answer)`` items, rendered as one user turn and one assistant turn."""
    rows = []
    for k, (prompt, answer) in enumerate(items):
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        example = render_supervised(
            messages, tokenizer, renderer, TrainOnWhat.ALL_ASSISTANT_MESSAGES
        )
        scored = [1.0 if w > 0 else 0.0 for w in example.weights]
        if not any(scored[1:]):
            raise LoglikError(f"item {k} ({prompt!r}): the answer renders to no scored token")
        rows.append(frames.Row(example.token_ids, scored))
    if not rows:
        raise LoglikError("no items to score")
    batch = frames.pad_batch(rows, frames.pad_id(tokenizer))
    return batch.input_ids, batch.loss_mask


def logprob_frame(input_ids: torch.Tensor) -> bytes:
    """A ``forward`` frame that returns per-token log-probabilities of ``input_ids``."""
    return frames.teacher_frame(input_ids)


def mean_target_logprobs(logprobs: Any, mask: torch.Tensor) -> list[float]:
    """Per row: the mean of ``logprobs`` over the columns ``mask`` selects."""
    if not torch.is_tensor(logprobs) or tuple(logprobs.shape) != tuple(mask.shape):
        shape = list(logprobs.shape) if torch.is_tensor(logprobs) else type(logprobs).__name__
        raise LoglikError(f"logprobs have shape {shape}; expected {list(mask.shape)}")
    means = []
    for r in range(mask.shape[0]):
        selected = logprobs[r][mask[r] > 0].double()
        if selected.numel() == 0:
            raise LoglikError(f"row {r}: no scored position")
        value = float(selected.mean())
        if not math.isfinite(value):
            raise LoglikError(f"row {r}: mean log-probability {value!r} is not finite")
        means.append(value)
    return means


def answer_logprobs(
    client, job_id: str, sub_job_id: str, tokenizer, renderer, items: Sequence[tuple[str, str]]
) -> list[float]:
    """Mean log-probability per answer token of each ``(prompt, answer)`` item, scored by
    ``forward`` on ``sub_job_id`` (a training or ``log_probability`` sub-job)."""
    input_ids, mask = scoring_rows(tokenizer, renderer, items)
    try:
        logprobs = raw_forward.score(client, job_id, input_ids, sub_job_id=sub_job_id)
    except raw_forward.RawForwardError as exc:
        raise LoglikError(str(exc)) from None
    return mean_target_logprobs(logprobs, mask)


def comparison_items(spec) -> dict[str, list[tuple[str, str]]]:
    """The scored items of a :class:`cortex_recipes.sft.WeightComparison`, by side."""
    return {
        side: [(prompt, behaviour.answer) for prompt in behaviour.prompts]
        for side, behaviour in (("full", spec.full), ("down", spec.down))
    }


def score_comparison(client, job_id: str, sub_job_id: str, tokenizer, renderer, spec) -> dict:
    """``{"full": [...], "down": [...]}``: per-item scores of both answers, in one forward."""
    items = comparison_items(spec)
    scores = answer_logprobs(
        client, job_id, sub_job_id, tokenizer, renderer, items["full"] + items["down"]
    )
    n = len(items["full"])
    return {"full": scores[:n], "down": scores[n:]}


def compare_weights(
    before: dict[str, Sequence[float]],
    after: dict[str, Sequence[float]],
    *,
    full_weight: float,
    down_weight: float,
) -> dict[str, Any]:
    """Per-item gains of both answers and the paired difference of the gains (full - down)."""
    gains = {}
    for side in ("full", "down"):
        if len(before[side]) != len(after[side]):
            raise LoglikError(
                f"{side}: {len(before[side])} scores before training and {len(after[side])} after"
            )
        gains[side] = [b - a for a, b in zip(before[side], after[side], strict=True)]
    return {
        "full_weight": full_weight,
        "down_weight": down_weight,
        "before": {side: list(before[side]) for side in ("full", "down")},
        "after": {side: list(after[side]) for side in ("full", "down")},
        "gains": gains,
        "full_gain": intervals.bootstrap_mean("full-weight answer gain", gains["full"]),
        "down_gain": intervals.bootstrap_mean("down-weighted answer gain", gains["down"]),
        "gain_difference": intervals.paired_difference(
            "full minus down-weighted gain", gains["down"], gains["full"]
        ),
    }
