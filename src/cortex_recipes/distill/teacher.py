"""Score student rollouts with a frozen teacher and align the scores to the training mask.

The teacher sees the exact prompt and sampled token ids (never decoded and re-encoded text)
through the public ``forward`` operation on a ``log_probability`` sub-job. Its per-token
log-probabilities come back prediction-aligned (column ``i`` scores token ``i + 1``); each
row's completion scores are cut out with an explicit offset and checked against the training
``loss_mask`` before anything trains on them. Missing, mis-sized, misaligned or non-finite
results stop the step with :class:`TeacherScoreError` naming the row and position.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cortex_recipes import frames, raw_forward
from cortex_recipes.grpo_loss import teacher_clip_bounds
from cortex_recipes.rollouts import Rollout


class TeacherScoreError(RuntimeError):
    """Teacher results that cannot be trained on; nothing from this step is applied."""


class TeacherAlignmentError(TeacherScoreError):
    """``forward`` scores that do not line up with the sampled tokens they claim to score."""


class TokenizerMismatchError(ValueError):
    """Teacher and student do not share token ids, so teacher scores would be meaningless."""


@dataclass(frozen=True)
class TeacherScores:
    """Per row: the column of the first completion prediction, and one score per completion token."""

    offsets: list[int]
    values: list[list[float]]


def check_same_tokenizer(student, teacher) -> None:
    """Reject a teacher/student pair whose vocabularies or chat templates differ."""
    if student.get_vocab() != teacher.get_vocab():
        raise TokenizerMismatchError(
            "teacher and student tokenizers have different vocabularies "
            f"({len(teacher.get_vocab())} vs {len(student.get_vocab())} entries); "
            "on-policy distillation scores the student's exact token ids, so both must share one tokenizer"
        )
    if student.chat_template != teacher.chat_template:
        raise TokenizerMismatchError(
            "teacher and student chat templates differ; prompts would be rendered differently"
        )


def extract_scores(result: Any, rollouts: Sequence[Rollout], width: int) -> TeacherScores:
    """Cut each row's completion scores out of a teacher ``forward`` result (or its logprobs
    tensor), wherever the endpoint put them (:func:`cortex_recipes.raw_forward.logprobs_of`)."""
    try:
        logprobs = result if torch.is_tensor(result) else raw_forward.logprobs_of(result)
    except raw_forward.RawForwardError as exc:
        raise TeacherScoreError(f"teacher forward: {exc}") from None
    if not torch.is_tensor(logprobs) or tuple(logprobs.shape) != (len(rollouts), width):
        shape = list(logprobs.shape) if torch.is_tensor(logprobs) else type(logprobs).__name__
        raise TeacherScoreError(
            f"teacher logprobs have shape {shape}; expected [{len(rollouts)}, {width}] (rows, padded length)"
        )
    offsets, values = [], []
    for r, rollout in enumerate(rollouts):
        start = frames.prediction_column(len(rollout.prompt_ids))  # scores completion token 0
        offsets.append(start)
        values.append(logprobs[r, start : start + len(rollout.completion_ids)].tolist())
    return TeacherScores(offsets, values)


def align_to_mask(scores: TeacherScores, loss_mask: torch.Tensor) -> torch.Tensor:
    """``teacher_log_probs_shifted`` [B, T]: scores placed where ``loss_mask`` is set, 0 elsewhere.

    Every row must have exactly one score per masked column, starting at the first masked
    column, all finite.
    """
    rows, width = loss_mask.shape
    if len(scores.values) != rows or len(scores.offsets) != rows:
        raise TeacherScoreError(f"teacher returned {len(scores.values)} rows for a batch of {rows}")
    out = torch.zeros(rows, width)
    for r in range(rows):
        columns = (loss_mask[r] > 0).nonzero().flatten().tolist()
        values = scores.values[r]
        if len(values) != len(columns):
            raise TeacherScoreError(
                f"row {r}: teacher returned {len(values)} scores for {len(columns)} scored positions"
            )
        if columns and scores.offsets[r] != columns[0]:
            raise TeacherScoreError(
                f"row {r}: teacher scores start at position {scores.offsets[r]} but the first "
                f"scored position is {columns[0]} (misaligned by {scores.offsets[r] - columns[0]})"
            )
        if columns and columns != list(range(columns[0], columns[0] + len(columns))):
            raise TeacherScoreError(f"row {r}: scored positions are not contiguous")
        for k, (column, value) in enumerate(zip(columns, values, strict=True)):
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise TeacherScoreError(
                    f"row {r}, position {column} (completion token {k}): teacher score {value!r} is not finite"
                )
            out[r, column] = float(value)
    return out


def score(
    client, job_id: str, teacher_sub_job_id: str, rollouts: Sequence[Rollout], pad_id: int
) -> frames.Batch:
    """Teacher-score rollouts: their batch (mask, sampler logprobs) with aligned teacher scores."""
    batch = frames.pad_batch([frames.rollout_row(r) for r in rollouts], pad_id)
    try:
        logprobs = raw_forward.score(client, job_id, batch.input_ids, sub_job_id=teacher_sub_job_id)
    except raw_forward.RawForwardError as exc:
        raise TeacherScoreError(f"teacher forward: {exc}") from None
    scores = extract_scores(logprobs, rollouts, batch.input_ids.shape[1])
    return batch.with_teacher(align_to_mask(scores, batch.loss_mask))


def check_alignment(
    client,
    job_id: str,
    scorer_sub_job_id: str,
    rollouts: Sequence[Rollout],
    pad_id: int,
    tolerance: float,
) -> dict[str, float | int]:
    """The scoring path must score the tokens that were sampled, at the columns that train.

    ``rollouts`` come from a sampler and ``scorer_sub_job_id`` holds that sampler's weights
    (the OPD student trainer before its first step). Scored through :func:`score` -- the exact
    path teacher scores take -- each sampled token's ``forward`` logprob must equal the
    sampler's own logprob at the same ``loss_mask`` column. A scorer whose columns are off by
    one passes the shape, count and offset checks (they are built from the same rollouts as
    the mask) but scores the neighbouring token, which differs by nats, and fails here.
    ``tolerance`` bounds the mean absolute difference (nats) over scored tokens.
    """
    batch = score(client, job_id, scorer_sub_job_id, rollouts, pad_id)
    mask = batch.loss_mask > 0
    positions = int(mask.sum())
    if positions == 0:
        raise TeacherAlignmentError("alignment probe: the sampler returned no completion tokens")
    diff = (batch.teacher_log_probs_shifted - batch.old_log_probs_shifted).abs() * mask
    mean = float(diff.sum()) / positions
    row, column = divmod(int(diff.argmax()), diff.shape[1])
    worst = {
        "row": row,
        "position": column,
        "sampler_logprob": round(float(batch.old_log_probs_shifted[row, column]), 5),
        "forward_logprob": round(float(batch.teacher_log_probs_shifted[row, column]), 5),
    }
    if not math.isfinite(mean) or mean > tolerance:
        raise TeacherAlignmentError(
            f"alignment probe: forward logprobs differ from the sampler's on the same token ids "
            f"by {mean:.4f} nats on average over {positions} tokens (tolerance {tolerance}); "
            f"worst: row {row}, position {column}, sampler {worst['sampler_logprob']}, forward "
            f"{worst['forward_logprob']}. The scores are not aligned with the sampled tokens "
            f"(an off-by-one scores the neighbouring token)"
        )
    return {
        "positions": positions,
        "mean_abs_diff": round(mean, 6),
        "max_abs_diff": round(float(diff.max()), 6),
        "tolerance": tolerance,
    }


def reverse_kl_on_samples(
    student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor
) -> float:
    """Mean of ``log p_student - log p_teacher`` over sampled tokens (a k1 estimate of KL(s || t))."""
    n = float(mask.sum())
    return float(((student - teacher) * mask).sum()) / n if n else 0.0


def teacher_baseline(
    student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, config: dict
) -> torch.Tensor:
    """Base advantages: minus the batch mean of the teacher term the processor will add.

    The processor adds ``tau * clamp(teacher - student)`` per token. Subtracting its mean over
    the batch is a constant baseline: the expected gradient is unchanged, but sampled tokens
    are no longer all pushed down at once when the teacher scores every one of them lower.
    """
    tau = float(config.get("teacher_tau", 0.0))
    if tau == 0.0 or not bool(mask.any()):
        return torch.zeros_like(mask)
    clip_neg, clip = teacher_clip_bounds(config)
    term = tau * (teacher - student).clamp(-clip_neg, clip)
    mean = float((term * mask).sum() / mask.sum())
    return -mean * mask
