"""Training rows -> the prediction-aligned tensors and the frames every journey submits.

One row type, one shift, one pad-id rule, one builder per processor:

- :class:`Row` is **token-aligned**: ``weights[t]``, ``advantages[t]`` and
  ``sampler_logprobs[t]`` describe token ``token_ids[t]`` (how much predicting it counts,
  its credit, the sampler's logprob of it). SFT conversations (``supervision``), sampled
  rollouts (:func:`rollout_row`), TITO episodes and prime-rl samples all become rows.
- :func:`shift` is the one place that turns a token-aligned row into the
  **prediction-aligned** row the Cortex processors read (``loss_mask``,
  ``advantages``, ``old_log_probs_shifted``, ``teacher_log_probs_shifted``): column ``i``
  holds the value of token ``i + 1``, because the logits at position ``i`` predict token
  ``i + 1``; the last column is 0. :func:`prediction_column` is the same fact read the other
  way (which column scores token ``t``), for cutting scores out of a model's
  prediction-aligned output (teacher scoring).
- :func:`pad_id` is the one pad-id rule: the tokenizer's ``pad_token_id``, else its
  ``eos_token_id``, else an error. Padding is on the right and never trained on (its mask is
  0), so the choice never changes a loss; it only has to be a real token id.
- :func:`pad_batch` right-pads rows of different lengths into a :class:`Batch`; per-token
  values other than the mask are 0 wherever the mask is 0. :func:`sft_frame`
  (``causal_cross_entropy``), :func:`grpo_frame` (GRPO, TITO episodes, the prime-rl trainer
  adapter) and :func:`opd_frame` (``grpo`` with the teacher term) serialise a batch.
- :func:`for_ranks` fits a frame to a training sub-job of ``n_gpus`` data-parallel ranks, as
  hosted Cortex runs it: filler rows up to the rank count (it refuses fewer rows than ranks),
  and the loss scaled globally (``dp_size``, ``batch_num_tokens``) so that the mean of the
  ranks' losses is the loss of the whole batch. With one rank a frame is sent as built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from cortex_training import wire

from cortex_recipes import grpo_loss
from cortex_recipes.rollouts import Rollout

RESPONSE_OPTIONS = {"response_options": {"format": "dssst1", "delivery": "chunked"}}


class FrameError(ValueError):
    """A row or batch that cannot become a training frame."""


@dataclass(frozen=True)
class Row:
    """One training sequence, token-aligned (index ``t`` describes ``token_ids[t]``)."""

    token_ids: list[int]
    weights: list[float]  # how much predicting token t counts (0: context only)
    advantages: list[float] | None = None  # per-token credit (GRPO)
    sampler_logprobs: list[float] | None = None  # the behaviour policy's logprob of token t

    def __post_init__(self) -> None:
        for name in ("weights", "advantages", "sampler_logprobs"):
            values = getattr(self, name)
            if values is not None and len(values) != len(self.token_ids):
                raise FrameError(
                    f"Row.{name} has {len(values)} values for {len(self.token_ids)} token ids; "
                    "accepted: one value per token (token-aligned)"
                )


def shift(values: Sequence[float]) -> list[float]:
    """Token-aligned -> prediction-aligned: column ``i`` holds ``values[i + 1]``; the last is 0.

    The one next-token shift of the repository.
    """
    return [*(float(v) for v in values[1:]), 0.0] if len(values) else []


def prediction_column(token_index: int) -> int:
    """The column of a prediction-aligned row that scores token ``token_index`` (:func:`shift`)."""
    if token_index < 1:
        raise FrameError(
            f"token_index={token_index}: the first token is never predicted; accepted: >= 1"
        )
    return token_index - 1


def pad_id(tokenizer) -> int:
    """The one pad-id rule: ``pad_token_id``, else ``eos_token_id``, else :class:`FrameError`."""
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    raise FrameError(
        f"tokenizer {getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)!r} has "
        f"pad_token_id={getattr(tokenizer, 'pad_token_id', None)!r} and "
        f"eos_token_id={getattr(tokenizer, 'eos_token_id', None)!r}; a batch needs one of them "
        "(a non-negative token id) to right-pad rows"
    )


def rollout_row(rollout: Rollout, advantage: float | None = None) -> Row:
    """A sampled completion as a row: trained (weight 1) on the completion, context on the prompt."""
    prompt, completion = len(rollout.prompt_ids), len(rollout.completion_ids)
    return Row(
        token_ids=rollout.ids,
        weights=[0.0] * prompt + [1.0] * completion,
        advantages=None if advantage is None else [float(advantage)] * (prompt + completion),
        sampler_logprobs=[0.0] * prompt + [float(x) for x in rollout.sampler_logprobs],
    )


@dataclass(frozen=True)
class Batch:
    """Right-padded, prediction-aligned tensors ``[rows, width]`` (see the module doc)."""

    input_ids: torch.Tensor  # long; padding is the pad id
    loss_mask: torch.Tensor  # float32; 0 on context, on the last column and on padding
    advantages: torch.Tensor | None = None
    old_log_probs_shifted: torch.Tensor | None = None
    teacher_log_probs_shifted: torch.Tensor | None = None

    def with_teacher(self, teacher_log_probs_shifted: torch.Tensor) -> Batch:
        """The batch with teacher scores already placed on its mask's columns."""
        if tuple(teacher_log_probs_shifted.shape) != tuple(self.loss_mask.shape):
            raise FrameError(
                f"teacher_log_probs_shifted has shape {list(teacher_log_probs_shifted.shape)}; "
                f"accepted: the batch's {list(self.loss_mask.shape)}"
            )
        return replace(self, teacher_log_probs_shifted=teacher_log_probs_shifted)


def _padded(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for r, row in enumerate(rows):
        out[r, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def pad_batch(rows: Sequence[Row], pad_id: int) -> Batch:
    """Right-pad ``rows`` with ``pad_id`` and shift every per-token field once."""
    if not rows:
        raise FrameError("pad_batch needs at least one row")
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or pad_id < 0:
        raise FrameError(f"pad_id={pad_id!r}; accepted: a non-negative token id (frames.pad_id)")
    width = max(len(r.token_ids) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for r, row in enumerate(rows):
        input_ids[r, : len(row.token_ids)] = torch.tensor(row.token_ids, dtype=torch.long)
    mask = _padded([shift(r.weights) for r in rows], width)
    trained = mask > 0

    def field(name: str) -> torch.Tensor | None:
        values = [getattr(r, name) for r in rows]
        if all(v is None for v in values):
            return None
        if any(v is None for v in values):
            missing = [i for i, v in enumerate(values) if v is None]
            raise FrameError(f"rows {missing} have no {name} but others do; accepted: all or none")
        return torch.where(trained, _padded([shift(v) for v in values], width), 0.0)

    return Batch(input_ids, mask, field("advantages"), field("sampler_logprobs"))


def _frame(batch: Batch, context: dict[str, torch.Tensor], processing: dict) -> bytes:
    return wire.dumps(
        {
            "args": (),
            "kwargs": {"input_ids": batch.input_ids},
            "context": {"input_ids": batch.input_ids, "loss_mask": batch.loss_mask, **context},
            "processing": processing,
        },
        metadata=RESPONSE_OPTIONS,
    )


def sft_processing() -> dict:
    """The one processing block of every public SFT run (a fresh dict per call)."""
    return {"loss_fn": "causal_cross_entropy", "post": ["compute_logprobs"], "config": {}}


def sft_frame(batch: Batch) -> bytes:
    """``causal_cross_entropy`` frame: no labels; context holds input_ids and the float mask."""
    return _frame(batch, {}, sft_processing())


def legacy_labels_frame(batch: Batch) -> bytes:
    """Compatibility only: model-side loss from ``labels``; fractional weights collapse to 0/1."""
    labels = torch.full_like(batch.input_ids, -100)
    # labels are token-aligned (the model shifts them): undo the shift of the mask.
    supervised = batch.loss_mask[:, :-1] > 0
    labels[:, 1:] = torch.where(supervised, batch.input_ids[:, 1:], labels[:, 1:])
    return wire.dumps(
        {"args": (), "kwargs": {"input_ids": batch.input_ids, "labels": labels}},
        metadata=RESPONSE_OPTIONS,
    )


def _rl_context(batch: Batch, loss: str, *, teacher: bool) -> dict[str, torch.Tensor]:
    needed = ["advantages", "old_log_probs_shifted"] + (["teacher_log_probs_shifted"] * teacher)
    missing = [name for name in needed if getattr(batch, name) is None]
    if missing:
        raise FrameError(f"a {loss} frame needs {', '.join(missing)}; the batch has none")
    return {name: getattr(batch, name) for name in needed}


def grpo_frame(
    batch: Batch, loss_config: dict[str, Any], prox_logp_shifted: torch.Tensor | None = None
) -> bytes:
    """``grpo`` frame: per-token advantages and the sampler's logprobs (the PPO behaviour
    policy), and for the decoupled loss the proximal policy's logprobs (prediction-aligned,
    the batch's shape; 0 where nothing is scored)."""
    context = _rl_context(batch, "grpo", teacher=False)
    if prox_logp_shifted is not None:
        if tuple(prox_logp_shifted.shape) != tuple(batch.loss_mask.shape):
            raise FrameError(
                f"prox_logp_shifted has shape {list(prox_logp_shifted.shape)}; accepted: the "
                f"batch's {list(batch.loss_mask.shape)}"
            )
        scored = batch.loss_mask > 0
        context["prox_logp_shifted"] = torch.where(
            scored, prox_logp_shifted.float(), torch.zeros_like(batch.loss_mask)
        )
    return _frame(
        batch,
        context,
        {"loss_fn": "grpo", "config": grpo_loss.with_defaults_named(loss_config)},
    )


def opd_frame(batch: Batch, advantages: torch.Tensor, config: dict[str, Any]) -> bytes:
    """On-policy distillation: ``grpo`` with ``teacher_log_probs_shifted`` and the profile's
    full processor ``config`` (teacher ``tau`` and clipping), plus the student's logprobs.

    ``advantages`` [rows, width] are the base advantages; the processor adds the teacher term.
    """
    if tuple(advantages.shape) != tuple(batch.loss_mask.shape):
        raise FrameError(
            f"advantages have shape {list(advantages.shape)}; accepted: the batch's "
            f"{list(batch.loss_mask.shape)}"
        )
    batch = replace(batch, advantages=advantages)
    return _frame(
        batch,
        _rl_context(batch, "grpo (on-policy distillation)", teacher=True),
        {"loss_fn": "grpo", "post": ["compute_logprobs"], "config": config},
    )


def teacher_frame(input_ids: torch.Tensor) -> bytes:
    """``forward`` frame for a ``log_probability`` sub-job: prediction-aligned logprobs back."""
    return wire.dumps(
        {
            "args": (),
            "kwargs": {"input_ids": input_ids},
            "processing": {"post": ["compute_logprobs"]},
        }
    )


# Row tensors of a frame that are token ids (filler rows repeat a real row, so every rank runs a
# real sequence) and that say where a row attends; every other per-row tensor is zero on filler
# rows (labels -100), so a filler row carries no loss and no gradient.
_ID_FIELDS = ("input_ids", "attention_mask", "position_ids")
# Aggregations whose loss is a token sum over a global token count: exact under any sharding.
_GLOBAL_AGGREGATIONS = ("token-mean",)


def _filled(name: str, value: torch.Tensor, rows: int, total: int) -> torch.Tensor:
    extra = total - rows
    if name in _ID_FIELDS:
        filler = value[:1].expand(extra, *value.shape[1:])
    elif name == "labels":
        filler = torch.full((extra, *value.shape[1:]), -100, dtype=value.dtype)
    else:
        filler = torch.zeros((extra, *value.shape[1:]), dtype=value.dtype)
    return torch.cat([value, filler])


def for_ranks(frame: bytes, ranks: int) -> bytes:
    """``frame`` fitted to a training sub-job of ``ranks`` data-parallel ranks (see the module
    doc); ``frame`` itself when ``ranks`` is 1. Hosted Cortex shards a batch's rows over its
    ranks, each rank's loss is a local mean and the ranks' gradients are averaged: with
    ``dp_size`` = ``ranks`` and ``batch_num_tokens`` = the scored tokens (the loss_mask's sum)
    each rank's loss is its token sum over the global count, and their mean is the whole
    batch's token mean, whichever rows a rank holds (filler rows included)."""
    if ranks <= 1:
        return frame
    body = wire.loads(frame)
    kwargs, context = body.get("kwargs") or {}, body.get("context") or {}
    rows = int(kwargs["input_ids"].shape[0])
    processing = dict(body.get("processing") or {})
    config = dict(processing.get("config") or {})
    if processing.get("loss_fn") is not None:
        aggregation = config.get("loss_agg_mode", "token-mean")
        if processing["loss_fn"] == "grpo" and aggregation not in _GLOBAL_AGGREGATIONS:
            raise FrameError(
                f"loss_agg_mode={aggregation!r} averages per rank on a {ranks}-rank training "
                f"sub-job, so the loss would depend on how rows shard; use "
                f"{' or '.join(_GLOBAL_AGGREGATIONS)} (or n_gpus=1)"
            )
        mask = context.get("loss_mask")
        if mask is None:
            raise FrameError("a frame with a loss_fn needs context.loss_mask")
        scored = mask.sum() if processing["loss_fn"] == "causal_cross_entropy" else (mask > 0).sum()
        scored = float(scored)
        config.setdefault("dp_size", ranks)
        config.setdefault("batch_num_tokens", int(scored) if scored.is_integer() else scored)
        processing["config"] = config
        body["processing"] = processing
    if rows < ranks:
        for part in (kwargs, context):
            for name, value in list(part.items()):
                if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == rows:
                    part[name] = _filled(name, value, rows, ranks)
    return wire.dumps(body, metadata=wire.read_metadata(frame) or None)


def filler_rows(input_ids: torch.Tensor, ranks: int) -> torch.Tensor:
    """``input_ids`` with copies of its first row appended up to ``ranks`` rows (a no-grad
    forward on a sub-job of ``ranks`` ranks); the caller keeps the first ``len(input_ids)``."""
    if input_ids.shape[0] >= ranks:
        return input_ids
    return _filled("input_ids", input_ids, input_ids.shape[0], ranks)
