"""The model frames of ``forward_backward`` and ``forward``: their keys, tensors (dtype, shape
and range: ids inside the vocabulary, labels inside it or the ignore index, masks non-negative
and finite for every loss), context and temperature, checked before any of it reaches a worker.
The message names the field, the value (abridged) and what is accepted.
"""

from __future__ import annotations  # noqa: I001 (kept: reordering would change the code digest of records being qualified; sort with the next behaviour change)

import base64
from typing import Any

import torch
from cortex_training import wire

from cortex_recipes.local.bodies import MAX_TEMPERATURE, boolean, number
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local import losses
from cortex_recipes.local.loss_schemas import Processing, parse_processing
from cortex_recipes.local.specs import (
    abridge,
    reject_unknown_keys,
)

# The ignore index of next-token targets (torch / Hugging Face convention).
IGNORE_INDEX = -100
INTEGER_DTYPES = (torch.int64, torch.int32)
CONTEXT_TENSOR_KEYS = {
    "input_ids",
    "loss_mask",
    "advantages",
    "labels",
    "old_log_probs_shifted",
    "teacher_log_probs_shifted",
    "prox_logp_shifted",
    "ref_log_probs_shifted",
    "prompt_group_ids",
    "action_masks",
    "temperature",
    "versions",
}
# Other policies' logprobs may be -inf where nothing is scored; the loss that reads one checks it
# where loss_mask > 0 (cortex_recipes.local.losses).
SCORED_FINITE = ("teacher_log_probs_shifted", "prox_logp_shifted", "ref_log_probs_shifted")
# Model-forward kwargs. Tensors: the inputs, plus `temperature` (logits are divided by it).
# Flags the SDK and upstream recipes send that do not change the result on this backend (it
# never keeps a KV cache while training and always returns the logits it needs).
KWARG_TENSORS = ("input_ids", "attention_mask", "position_ids", "labels", "temperature")
KWARG_IGNORED_FLAGS = ("use_cache", "return_dict", "output_attentions", "output_hidden_states")
KWARG_KEYS = KWARG_TENSORS + KWARG_IGNORED_FLAGS
FRAME_KEYS = {"args", "kwargs", "context", "processing", "rr_sample_ids", "rr_discard"}

# ---------------------------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------------------------


def _is_integer_tensor(value: torch.Tensor) -> bool:
    return value.dtype in INTEGER_DTYPES


def _describe(value: Any) -> str:
    if torch.is_tensor(value):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    return type(value).__name__


def check_token_ids(value: Any, where: str, vocab: int | None) -> torch.Tensor:
    """A [batch, seq] int64/int32 tensor of ids inside the vocabulary."""
    if not torch.is_tensor(value) or value.dim() != 2 or not _is_integer_tensor(value):
        raise BackendError(
            f"{where} must be an int64 or int32 tensor of shape [batch, seq_len], "
            f"got {_describe(value)}"
        )
    if value.numel() == 0:
        raise BackendError(f"{where} is empty")
    if vocab and (int(value.min()) < 0 or int(value.max()) >= vocab):
        raise BackendError(
            f"{where} has ids outside [0, {vocab}): min {int(value.min())}, max {int(value.max())}"
        )
    return value


def check_labels(value: Any, where: str, shape: tuple[int, ...], vocab: int | None) -> None:
    if not torch.is_tensor(value) or not _is_integer_tensor(value):
        raise BackendError(f"{where} must be an int64 or int32 tensor, got {_describe(value)}")
    if tuple(value.shape) != shape:
        raise BackendError(f"{where} has shape {list(value.shape)}; expected {list(shape)}")
    valid = value == IGNORE_INDEX
    valid |= value >= 0
    if vocab:
        valid &= (value < vocab) | (value == IGNORE_INDEX)
    if not bool(valid.all()):
        bad = int(value[~valid].flatten()[0])
        raise BackendError(
            f"{where} contains {bad}; labels must be token ids in [0, {vocab or 'vocab'}) "
            f"or the ignore index {IGNORE_INDEX}"
        )


def _check_float(value: torch.Tensor, where: str, *, finite: bool) -> None:
    if not torch.is_tensor(value) or value.dtype == torch.bool or value.is_complex():
        raise BackendError(f"{where} must be a real tensor, got {_describe(value)}")
    if finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise BackendError(f"{where} contains non-finite values")


def check_temperature(value: Any, where: str, shape: tuple[int, ...]) -> None:
    """A positive, finite temperature: a scalar, one per row ([B] or [B, 1]) or per token."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        number(value, where, minimum=1e-6, maximum=MAX_TEMPERATURE)
        return
    if not torch.is_tensor(value) or not value.is_floating_point():
        raise BackendError(f"{where} must be a float tensor, got {_describe(value)}")
    allowed = [(), (shape[0],), (shape[0], 1), shape]
    if tuple(value.shape) not in allowed:
        raise BackendError(
            f"{where} has shape {list(value.shape)}; accepted: [], [{shape[0]}], "
            f"[{shape[0]}, 1] or {list(shape)}"
        )
    if not bool(torch.isfinite(value).all()) or not bool((value > 0).all()):
        raise BackendError(f"{where} must be positive and finite everywhere")


def _check_mask(value: torch.Tensor, where: str) -> None:
    _check_float(value, where, finite=True)
    if bool((value < 0).any()):
        raise BackendError(f"{where} has negative weights; weights must be >= 0")


def validate_context(
    processing: Processing, context: Any, input_ids: torch.Tensor, vocab: int | None = None
) -> dict[str, torch.Tensor]:
    """Check context tensors against the loss's needs and the batch shape (no model needed)."""
    if context is None:
        context = {}
    if not isinstance(context, dict):
        raise BackendError(f"context must be an object, got {type(context).__name__}")
    reject_unknown_keys(context, CONTEXT_TENSOR_KEYS, "context")
    shape = tuple(input_ids.shape)
    for key, value in context.items():
        where = f"context.{key}"
        if key == "temperature":
            check_temperature(value, where, shape)
            continue
        if not torch.is_tensor(value):
            raise BackendError(f"{where} must be a tensor, got {type(value).__name__}")
        if tuple(value.shape) != shape:
            raise BackendError(
                f"{where} has shape {list(value.shape)}; expected {list(shape)} "
                f"(the shape of kwargs.input_ids)"
            )
        if key in ("input_ids", "versions", "prompt_group_ids"):
            if not _is_integer_tensor(value):
                raise BackendError(f"{where} must be an int64 or int32 tensor")
        elif key == "labels":
            check_labels(value, where, shape, vocab)
        elif key in ("loss_mask", "action_masks"):
            _check_mask(value, where)
        else:
            _check_float(value, where, finite=key not in SCORED_FINITE)
    if "input_ids" in context and not torch.equal(context["input_ids"].long(), input_ids.long()):
        raise BackendError("context.input_ids differs from kwargs.input_ids")
    loss_fn = processing.loss_fn
    if loss_fn is None:
        return context
    if "loss_mask" not in context:
        raise BackendError(f"loss_fn {loss_fn!r} requires context.loss_mask")
    weighted = context["loss_mask"] > 0
    labels = context.get("labels")
    if labels is not None and bool(((labels == IGNORE_INDEX) & weighted).any()):
        raise BackendError(
            f"context.labels is {IGNORE_INDEX} at a position where loss_mask > 0; "
            "mask that position or give it a target"
        )
    losses.get(loss_fn).check_context(processing.config, context, weighted)
    return context


# ---------------------------------------------------------------------------------------------
# Model frames (forward-backward and forward)
# ---------------------------------------------------------------------------------------------


def frame_temperature(frame: dict[str, Any]) -> Any:
    """The temperature a frame asks for (kwargs or context), or None."""
    kwargs = frame.get("kwargs") or {}
    context = frame.get("context") or {}
    return kwargs.get("temperature", context.get("temperature"))


def _temperature_is_neutral(value: Any) -> bool:
    if value is None:
        return True
    if torch.is_tensor(value):
        return bool((value == 1).all())
    return value == 1


def validate_model_frame(
    frame: Any, *, max_seq_len: int, vocab: int | None, training: bool
) -> Processing:
    """Check a forward(-backward) frame; return its normalised processing block."""
    if not isinstance(frame, dict) or not isinstance(frame.get("kwargs"), dict):
        raise BackendError("frame must be an object with a kwargs object")
    reject_unknown_keys(frame, FRAME_KEYS, "frame")
    if frame.get("args") not in (None, (), []):
        raise BackendError("frame.args must be empty; pass tensors as kwargs")
    kwargs = frame["kwargs"]
    reject_unknown_keys(kwargs, KWARG_KEYS, "kwargs")
    for flag in KWARG_IGNORED_FLAGS:
        if flag in kwargs:
            boolean(kwargs[flag], f"kwargs.{flag}")
    ids = check_token_ids(kwargs.get("input_ids"), "kwargs.input_ids", vocab)
    shape = tuple(ids.shape)
    if shape[1] > max_seq_len:
        raise BackendError(
            f"kwargs.input_ids has seq_len {shape[1]}, above the sub-job's max_seq_len "
            f"{max_seq_len}"
        )
    attention = kwargs.get("attention_mask")
    if attention is not None:
        if not torch.is_tensor(attention) or tuple(attention.shape) != shape:
            raise BackendError(f"kwargs.attention_mask must be a tensor of shape {list(shape)}")
        if attention.is_floating_point() or not bool(((attention == 0) | (attention == 1)).all()):
            raise BackendError("kwargs.attention_mask must hold only 0 and 1 (integer or bool)")
    positions = kwargs.get("position_ids")
    if positions is not None:
        if not torch.is_tensor(positions) or tuple(positions.shape) not in (shape, (1, shape[1])):
            raise BackendError(
                f"kwargs.position_ids must be a tensor of shape {list(shape)} or [1, {shape[1]}]"
            )
        if not _is_integer_tensor(positions) or bool((positions < 0).any()):
            raise BackendError("kwargs.position_ids must be non-negative int64 or int32")
        if int(positions.max()) >= max_seq_len:
            raise BackendError(
                f"kwargs.position_ids reaches {int(positions.max())}, beyond max_seq_len "
                f"{max_seq_len}"
            )
    if kwargs.get("labels") is not None:
        check_labels(kwargs["labels"], "kwargs.labels", shape, vocab)
    if "temperature" in kwargs:
        check_temperature(kwargs["temperature"], "kwargs.temperature", shape)
    processing = parse_processing(frame.get("processing"), require_loss=False)
    if not training and processing.loss_fn is not None:
        raise BackendError("forward runs no loss; remove processing.loss_fn")
    context = validate_context(processing, frame.get("context"), ids, vocab)
    if "temperature" in kwargs and "temperature" in context:
        a, b = torch.as_tensor(kwargs["temperature"]), torch.as_tensor(context["temperature"])
        if not torch.equal(*torch.broadcast_tensors(a.float(), b.float())):
            raise BackendError("kwargs.temperature and context.temperature differ; send one")
    if processing.loss_fn == "causal_cross_entropy" and not _temperature_is_neutral(
        frame_temperature(frame)
    ):
        raise BackendError(
            "loss_fn 'causal_cross_entropy' requires temperature 1 (or none) in kwargs/context"
        )
    if training and processing.loss_fn is None and kwargs.get("labels") is None:
        raise BackendError("forward-backward without processing needs kwargs.labels")
    return processing


def forward_payload_bytes(payload: Any) -> bytes:
    """The DSSST1 bytes of a ``forward`` payload: the raw frame (the ``/forward`` route),
    base64-wrapped bytes (the SDK's ``/operation`` forward) or a JSON frame."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, dict) and "payload_b64" in payload:
        encoded = payload["payload_b64"]
        if not isinstance(encoded, str):
            raise BackendError("payload.payload_b64 must be a base64 string")
        try:
            return base64.b64decode(encoded, validate=True)
        except (ValueError, TypeError) as exc:
            raise BackendError(f"payload.payload_b64 is not valid base64: {exc}") from exc
    if isinstance(payload, dict):
        kwargs = payload.get("kwargs")
        if not isinstance(kwargs, dict):
            raise BackendError("forward payload needs a kwargs object")
        tensors = {}
        for key, value in kwargs.items():
            if key not in ("input_ids", "attention_mask", "position_ids", "labels"):
                raise BackendError(
                    f"forward payload kwargs.{abridge(key)} is not accepted in a JSON payload; "
                    "accepted: input_ids, attention_mask, position_ids, labels"
                )
            try:
                tensors[key] = torch.tensor(value, dtype=torch.long)
            except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
                raise BackendError(
                    f"forward payload kwargs.{key} must be a list of integer lists: "
                    f"{abridge(str(exc))}"
                ) from exc
        frame: dict[str, Any] = {"args": (), "kwargs": tensors}
        if "processing" in payload:
            frame["processing"] = payload["processing"]
        return wire.dumps(frame)
    raise BackendError("forward payload must be DSSST1 bytes (payload_b64) or a JSON object")
