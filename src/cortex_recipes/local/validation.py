"""Every client request is checked here, once, before any of it reaches a worker.

Invariants:
- Bodies and frames are parsed with bounded size and depth: JSON deeper than
  :data:`MAX_JSON_DEPTH`, a DSSST1 header that is not an object, or chunk metadata of the wrong
  type is a :class:`BackendError` (a 4xx), never an exception from deep inside a parser.
- Every tensor is checked for dtype, shape and range (ids inside the vocabulary, labels inside it
  or the ignore index, masks non-negative and finite for every loss) and every number for type
  and range. The message names the field, the value (abridged) and what is accepted.
- A request that passes validation does not fail later for a reason visible here: the worker
  receives the normalised processing block and sampling parameters and trusts them. The one
  exception is the token length of a text prompt, which only the worker's tokenizer can see.
"""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from cortex_training import wire

from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.sampling import SamplingParams
from cortex_recipes.local.specs import (
    CHECKPOINT_ID_RE,
    JOB_ID_RE,
    MAX_SEED,
    abridge,
    learning_rate,
    reject_unknown_keys,
)

# Nothing the SDK sends nests deeper than ~6 levels; 32 leaves room and stops stack abuse.
MAX_JSON_DEPTH = 32
# The ignore index of next-token targets (torch / Hugging Face convention).
IGNORE_INDEX = -100
# vLLM's default max_logprobs; more is a mistake, not a request.
MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_PROMPTS = 4096
MAX_PROMPT_CHARS = 1 << 20
MAX_TEMPERATURE = 100.0
# Integers beyond int64 cannot become tensors or floats reliably; no field needs them.
MAX_ABS_INT = 2**63 - 1
CHUNK_GROUP_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")

INTEGER_DTYPES = (torch.int64, torch.int32)

# ---------------------------------------------------------------------------------------------
# JSON bodies and DSSST1 frames
# ---------------------------------------------------------------------------------------------


def _depth_exceeds(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list | tuple):
            if depth > limit:
                return True
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return False


def check_depth(value: Any, what: str) -> Any:
    if _depth_exceeds(value, MAX_JSON_DEPTH):
        raise BackendError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def parse_json(raw: bytes, what: str) -> Any:
    """JSON from a request body (empty -> ``{}``), depth-bounded."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except RecursionError as exc:
        raise BackendError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels") from exc
    except ValueError as exc:
        raise BackendError(f"{what} is not valid JSON: {abridge(str(exc), 120)}") from exc
    return check_depth(value, what)


def json_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BackendError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def decode_frame(data: bytes, where: str) -> Any:
    """``wire.loads`` with every failure as a 400 that names ``where``."""
    try:
        value = wire.loads(data)
    except wire.WireError as exc:
        raise BackendError(f"{where}: {exc}") from exc
    except RecursionError as exc:
        raise BackendError(f"{where}: DSSST1 structure nests too deep") from exc
    except Exception as exc:  # malformed JSON inside a header, bad dtypes, ...
        raise BackendError(
            f"{where}: not a valid DSSST1 frame ({type(exc).__name__}: {abridge(str(exc), 120)})"
        ) from exc
    return check_depth(value, where)


@dataclass(frozen=True)
class ChunkDescriptor:
    """A checked ``request_chunk`` header."""

    group_id: str
    index: int
    total: int
    frame_sha256: str
    frame_size: int


def _meta_int(desc: dict, key: str, minimum: int) -> int:
    value = desc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_ABS_INT:
        raise BackendError(f"request_chunk.{key}={abridge(value)} must be an integer >= {minimum}")
    return value


def request_chunk(data: bytes, where: str) -> ChunkDescriptor | None:
    """The frame's ``request_chunk`` descriptor, or None for an unchunked frame."""
    try:
        metadata = wire.read_metadata(data)
    except RecursionError as exc:
        raise BackendError(f"{where}: frame metadata nests too deep") from exc
    except (wire.WireError, ValueError, TypeError) as exc:
        raise BackendError(f"{where}: unreadable frame metadata ({abridge(str(exc))})") from exc
    if not isinstance(metadata, dict):
        raise BackendError(f"{where}: frame metadata must be an object, got {abridge(metadata)}")
    check_depth(metadata, f"{where} metadata")
    if "result_chunk" in metadata:
        raise BackendError(f"{where}: accepts request chunks, got a result chunk")
    if "request_chunk" not in metadata:
        return None
    desc = metadata["request_chunk"]
    if not isinstance(desc, dict):
        raise BackendError(f"request_chunk={abridge(desc)} must be an object")
    group_id = desc.get("chunk_group_id")
    if not isinstance(group_id, str) or not CHUNK_GROUP_ID_RE.fullmatch(group_id):
        raise BackendError(
            f"request_chunk.chunk_group_id={abridge(group_id)} must match "
            f"{CHUNK_GROUP_ID_RE.pattern}"
        )
    total = _meta_int(desc, "total_chunks", 1)
    index = _meta_int(desc, "chunk_idx", 0)
    if index >= total:
        raise BackendError(f"request_chunk.chunk_idx={index} must be < total_chunks={total}")
    sha = desc.get("frame_sha256")
    if not isinstance(sha, str) or not SHA256_RE.fullmatch(sha):
        raise BackendError(f"request_chunk.frame_sha256={abridge(sha)} must be 64 hex digits")
    return ChunkDescriptor(group_id, index, total, sha, _meta_int(desc, "frame_size_bytes", 0))


# ---------------------------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------------------------


def number(
    value: Any,
    where: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    allow_none: bool = False,
) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BackendError(f"{where}={abridge(value)} must be a number")
    if isinstance(value, int) and abs(value) > MAX_ABS_INT:
        raise BackendError(f"{where}={abridge(value)} is out of range")
    if not math.isfinite(value):
        raise BackendError(f"{where}={value!r} must be finite")
    if minimum is not None and value < minimum:
        raise BackendError(f"{where}={abridge(value)} must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise BackendError(f"{where}={abridge(value)} must be <= {maximum}")
    return value


def integer(value: Any, where: str, *, minimum: int, maximum: int = MAX_ABS_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise BackendError(f"{where}={abridge(value)} must be an integer in [{minimum}, {maximum}]")
    return value


def boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise BackendError(f"{where}={abridge(value)} must be true or false")
    return value


# ---------------------------------------------------------------------------------------------
# The processing block
# ---------------------------------------------------------------------------------------------

POST_PROCESSORS = ("compute_logprobs",)
LOSS_FNS = ("causal_cross_entropy", "grpo")
CAUSAL_CE_KEYS = {"batch_num_tokens", "dp_size", "global_batch_size"}
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
GRPO_DEFAULTS: dict[str, Any] = {
    "eps_clip": 0.2,
    "eps_clip_higher": None,
    "loss_agg_mode": "token-mean",
    "entropy_coeff": 0.0,
    "teacher_tau": 0.0,
    "teacher_clip": None,
    "teacher_clip_negative": None,
    "dp_size": None,
    "batch_num_tokens": None,
    "global_batch_size": None,
    "importance_sampling_level": "token",
    "prox_logp_method": "recompute",
    "current_version": None,
}
# Keys the hosted `grpo` knows that change the loss in ways the local backend does not implement.
GRPO_UNSUPPORTED = {
    "c_clip", "behav_imp_weight_cap", "m2_threshold", "use_sapo_loss", "sapo_tau_pos",
    "sapo_tau_neg", "use_decoupled_loss", "use_cispo_loss", "is_weight_clip_max",
    "use_kl_loss", "kl_loss_coef", "kl_loss_type",
}  # fmt: skip
CONTEXT_TENSOR_KEYS = {
    "input_ids",
    "loss_mask",
    "advantages",
    "labels",
    "old_log_probs_shifted",
    "teacher_log_probs_shifted",
    "action_masks",
    "temperature",
    "versions",
}
# Model-forward kwargs. Tensors: the inputs, plus `temperature` (logits are divided by it).
# Flags the SDK and upstream recipes send that do not change the result on this backend (it
# never keeps a KV cache while training and always returns the logits it needs).
KWARG_TENSORS = ("input_ids", "attention_mask", "position_ids", "labels", "temperature")
KWARG_IGNORED_FLAGS = ("use_cache", "return_dict", "output_attentions", "output_hidden_states")
KWARG_KEYS = KWARG_TENSORS + KWARG_IGNORED_FLAGS
FRAME_KEYS = {"args", "kwargs", "context", "processing", "rr_sample_ids", "rr_discard"}


@dataclass(frozen=True)
class Processing:
    """A validated ``processing`` block; ``config`` has every default filled in."""

    loss_fn: str | None
    post: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"loss_fn": self.loss_fn, "post": list(self.post), "config": self.config}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Processing:
        return cls(data["loss_fn"], tuple(data["post"]), dict(data["config"]))


def _config_number(config: dict, key: str, *, minimum: float | None = None) -> float | None:
    return number(config.get(key), f"processing.config.{key}", minimum=minimum, allow_none=True)


def parse_processing(block: Any, *, require_loss: bool) -> Processing:
    """Validate a ``processing`` block; raise :class:`BackendError` naming what is wrong."""
    if block is None:
        if require_loss:
            raise BackendError("processing is required")
        return Processing(loss_fn=None, post=())
    if not isinstance(block, dict):
        raise BackendError(f"processing must be an object, got {type(block).__name__}")
    unknown = set(block) - {"loss_fn", "post", "config"}
    if unknown:
        raise BackendError(
            f"processing has unknown keys {sorted(unknown)}; accepted: loss_fn, post, config"
        )
    loss_fn = block.get("loss_fn")
    if loss_fn is None and require_loss:
        raise BackendError(f"processing.loss_fn is required; accepted: {', '.join(LOSS_FNS)}")
    if loss_fn is not None and loss_fn not in LOSS_FNS:
        raise BackendError(
            f"processing.loss_fn={abridge(loss_fn)} is not registered; "
            f"accepted: {', '.join(LOSS_FNS)}"
        )
    post = block.get("post") or []
    if not isinstance(post, list) or not all(isinstance(p, str) for p in post):
        raise BackendError(f"processing.post={abridge(post)} must be a list of names")
    for name in post:
        if name not in POST_PROCESSORS:
            raise BackendError(
                f"processing.post contains {abridge(name)}, which is not registered; "
                f"accepted: {', '.join(POST_PROCESSORS)}"
            )
    config = block.get("config") or {}
    if not isinstance(config, dict):
        raise BackendError(f"processing.config={abridge(config)} must be an object")
    if loss_fn == "causal_cross_entropy":
        _validate_causal_ce_config(config)
    elif loss_fn == "grpo":
        config = _validate_grpo_config(config)
    elif config:
        raise BackendError("processing.config is only accepted together with a loss_fn")
    return Processing(loss_fn=loss_fn, post=tuple(post), config=dict(config))


def _validate_global_scale(config: dict) -> None:
    dp = config.get("dp_size")
    if dp is not None:
        integer(dp, "processing.config.dp_size", minimum=1)
    bnt = _config_number(config, "batch_num_tokens", minimum=0)
    if dp is not None and bnt is None:
        raise BackendError("processing.config.dp_size requires processing.config.batch_num_tokens")
    if config.get("global_batch_size") is not None:
        integer(config["global_batch_size"], "processing.config.global_batch_size", minimum=1)


def _validate_causal_ce_config(config: dict) -> None:
    unknown = set(config) - CAUSAL_CE_KEYS
    if unknown:
        raise BackendError(
            f"processing.config has unknown keys {sorted(unknown)} for loss_fn "
            f"'causal_cross_entropy'; accepted: {', '.join(sorted(CAUSAL_CE_KEYS))}"
        )
    _validate_global_scale(config)


def _validate_grpo_config(config: dict) -> dict:
    unsupported = set(config) & GRPO_UNSUPPORTED
    if unsupported:
        raise BackendError(
            f"processing.config keys {sorted(unsupported)} are not supported by the local "
            f"backend's grpo; accepted: {', '.join(sorted(GRPO_DEFAULTS))}"
        )
    unknown = set(config) - set(GRPO_DEFAULTS)
    if unknown:
        raise BackendError(
            f"processing.config has unknown keys {sorted(unknown)} for loss_fn 'grpo'; "
            f"accepted: {', '.join(sorted(GRPO_DEFAULTS))}"
        )
    merged = {**GRPO_DEFAULTS, **config}
    number(merged["eps_clip"], "processing.config.eps_clip", minimum=0.0)
    _config_number(merged, "eps_clip_higher", minimum=0.0)
    _config_number(merged, "entropy_coeff")
    tau = number(merged["teacher_tau"], "processing.config.teacher_tau", minimum=0.0)
    clip = _config_number(merged, "teacher_clip", minimum=0.0)
    _config_number(merged, "teacher_clip_negative", minimum=0.0)
    if tau > 0 and not clip:
        raise BackendError(
            f"processing.config.teacher_tau={tau} requires a finite positive teacher_clip, "
            f"got teacher_clip={clip!r}"
        )
    if merged["loss_agg_mode"] not in LOSS_AGG_MODES:
        raise BackendError(
            f"processing.config.loss_agg_mode={abridge(merged['loss_agg_mode'])}; "
            f"accepted: {', '.join(LOSS_AGG_MODES)}"
        )
    if merged["importance_sampling_level"] != "token":
        raise BackendError(
            f"processing.config.importance_sampling_level="
            f"{abridge(merged['importance_sampling_level'])}; the local backend accepts only 'token'"
        )
    if merged["prox_logp_method"] != "recompute":
        raise BackendError(
            f"processing.config.prox_logp_method={abridge(merged['prox_logp_method'])}; "
            f"the local backend accepts only 'recompute'"
        )
    if merged["current_version"] is not None:
        integer(merged["current_version"], "processing.config.current_version", minimum=0)
    _validate_global_scale(merged)
    return merged


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
        if key in ("input_ids", "versions"):
            if not _is_integer_tensor(value):
                raise BackendError(f"{where} must be an int64 or int32 tensor")
        elif key == "labels":
            check_labels(value, where, shape, vocab)
        elif key in ("loss_mask", "action_masks"):
            _check_mask(value, where)
        else:
            _check_float(value, where, finite=key != "teacher_log_probs_shifted")
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
    if loss_fn == "causal_cross_entropy" and "action_masks" in context:
        raise BackendError("loss_fn 'causal_cross_entropy' rejects context.action_masks")
    if loss_fn == "grpo":
        if "advantages" not in context:
            raise BackendError("loss_fn 'grpo' requires context.advantages")
        if processing.config.get("teacher_tau", 0) > 0:
            teacher = context.get("teacher_log_probs_shifted")
            if teacher is None:
                raise BackendError(
                    "processing.config.teacher_tau > 0 requires context.teacher_log_probs_shifted"
                )
            if not teacher.is_floating_point():
                raise BackendError("context.teacher_log_probs_shifted must be a float tensor")
            bad = weighted & ~torch.isfinite(teacher)
            if bool(bad.any()):
                row, col = (int(i) for i in bad.nonzero()[0])
                raise BackendError(
                    f"context.teacher_log_probs_shifted is non-finite at row {row}, "
                    f"position {col}, where loss_mask > 0"
                )
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


# ---------------------------------------------------------------------------------------------
# Generate
# ---------------------------------------------------------------------------------------------

SAMPLING_KEYS = {
    "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
    "logprobs", "ignore_eos", "include_stop_str_in_output", "n", "skip_special_tokens",
}  # fmt: skip
GENERATE_KEYS = {"prompts", "sampling_params", "routing_key", "strict"}


def parse_sampling_params(
    raw: Any, where: str = "sampling_params", *, vocab: int | None = None
) -> SamplingParams:
    if raw is None:
        return SamplingParams()
    if not isinstance(raw, dict):
        raise BackendError(f"{where} must be an object")
    reject_unknown_keys(raw, SAMPLING_KEYS, where)
    if raw.get("n", 1) != 1 or isinstance(raw.get("n", 1), bool):
        raise BackendError(
            f"{where}.n={abridge(raw.get('n'))}: send a prompt n times for n samples"
        )
    stop = raw.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_STRING_CHARS for s in stop)
    ):
        raise BackendError(
            f"{where}.stop={abridge(stop)} must be a string or a list of at most "
            f"{MAX_STOP_STRINGS} non-empty strings of at most {MAX_STOP_STRING_CHARS} characters"
        )
    stop_ids = raw.get("stop_token_ids") or []
    top_id = (vocab or MAX_ABS_INT + 1) - 1
    if not isinstance(stop_ids, list) or len(stop_ids) > MAX_STOP_TOKEN_IDS:
        raise BackendError(
            f"{where}.stop_token_ids={abridge(stop_ids)} must be a list of at most "
            f"{MAX_STOP_TOKEN_IDS} token ids"
        )
    for i, token in enumerate(stop_ids):
        integer(token, f"{where}.stop_token_ids[{i}]", minimum=0, maximum=top_id)
    max_tokens = integer(raw.get("max_tokens", 16), f"{where}.max_tokens", minimum=1)
    top_k = integer(raw.get("top_k", 0), f"{where}.top_k", minimum=-1, maximum=top_id + 1)
    seed = raw.get("seed")
    logprobs = raw.get("logprobs")
    flags = {}
    for flag, default in (
        ("ignore_eos", False),
        ("include_stop_str_in_output", False),
        ("skip_special_tokens", True),
    ):
        flags[flag] = boolean(raw.get(flag, default), f"{where}.{flag}")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=float(
            number(
                raw.get("temperature", 1.0),
                f"{where}.temperature",
                minimum=0.0,
                maximum=MAX_TEMPERATURE,
            )
        ),
        top_p=float(number(raw.get("top_p", 1.0), f"{where}.top_p", minimum=0.0, maximum=1.0))
        or 1.0,
        top_k=max(top_k, 0),
        seed=None if seed is None else integer(seed, f"{where}.seed", minimum=0, maximum=MAX_SEED),
        stop=tuple(stop),
        stop_token_ids=tuple(stop_ids),
        logprobs=None
        if logprobs is None
        else integer(logprobs, f"{where}.logprobs", minimum=0, maximum=MAX_TOP_LOGPROBS),
        **flags,
    )


@dataclass(frozen=True)
class GenerateRow:
    """One prompt of a generate request: its text or token ids and its parameters."""

    prompt: str | list[int]
    params: SamplingParams

    def to_json(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "params": self.params.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GenerateRow:
        return cls(data["prompt"], SamplingParams.from_json(data["params"]))


def validate_generate(frame: Any, *, max_seq_len: int, vocab: int | None) -> list[GenerateRow]:
    if not isinstance(frame, dict) or "prompts" not in frame:
        raise BackendError("generate frame must be an object with prompts")
    reject_unknown_keys(frame, GENERATE_KEYS, "generate frame")
    prompts = frame["prompts"]
    if not isinstance(prompts, list) or not 0 < len(prompts) <= MAX_PROMPTS:
        raise BackendError(
            f"prompts must be a non-empty list of at most {MAX_PROMPTS} strings or token-id lists"
        )
    params = frame.get("sampling_params")
    if isinstance(params, list) and len(params) != len(prompts):
        raise BackendError(f"sampling_params has {len(params)} entries for {len(prompts)} prompts")
    shared = None if isinstance(params, list) else parse_sampling_params(params, vocab=vocab)
    rows = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if not 0 < len(prompt) <= MAX_PROMPT_CHARS:
                raise BackendError(
                    f"prompts[{i}] must be a non-empty string of at most {MAX_PROMPT_CHARS} chars"
                )
        else:
            if (
                not isinstance(prompt, list)
                or not prompt
                or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
            ):
                raise BackendError(
                    f"prompts[{i}] must be a string or a non-empty list of token ids"
                )
            low, high = min(prompt), max(prompt)
            if low < 0 or (vocab and high >= vocab) or high > MAX_ABS_INT:
                raise BackendError(
                    f"prompts[{i}] has token ids outside [0, {vocab or 'vocab'}): "
                    f"min {low}, max {abridge(high)}"
                )
            if len(prompt) >= max_seq_len:
                raise BackendError(
                    f"prompts[{i}] has {len(prompt)} tokens; must be shorter than max_seq_len "
                    f"{max_seq_len}"
                )
        row_params = (
            parse_sampling_params(params[i], f"sampling_params[{i}]", vocab=vocab)
            if shared is None
            else shared
        )
        if not isinstance(prompt, str):
            budget = max_seq_len - len(prompt)
            if row_params.max_tokens > budget:
                row_params = replace(row_params, max_tokens=budget)
        rows.append(GenerateRow(prompt, row_params))
    if frame.get("routing_key") is not None and not isinstance(frame["routing_key"], str):
        raise BackendError(f"routing_key={abridge(frame['routing_key'])} must be a string")
    return rows


# ---------------------------------------------------------------------------------------------
# Small bodies
# ---------------------------------------------------------------------------------------------


def only_keys(body: dict[str, Any], accepted: tuple[str, ...], what: str) -> None:
    reject_unknown_keys(body, accepted, f"{what} body")


def step_learning_rate(body: dict[str, Any]) -> float | None:
    only_keys(body, ("learning_rate",), "step")
    value = body.get("learning_rate")
    return None if value is None else learning_rate(value, "learning_rate")


def checkpoint_id(value: Any, where: str = "checkpoint_id") -> str:
    if not isinstance(value, str) or not CHECKPOINT_ID_RE.fullmatch(value):
        raise BackendError(f"{where}={abridge(value)} is not a checkpoint id (cp_<32 hex>)")
    return value


def job_id(value: Any, where: str = "job_id") -> str:
    if not isinstance(value, str) or not JOB_ID_RE.fullmatch(value):
        raise BackendError(f"{where}={abridge(value)} must match {JOB_ID_RE.pattern}")
    return value


def checkpoint_type(value: Any) -> str:
    kind = "resumable" if value is None else value
    if not isinstance(kind, str) or kind.lower() not in ("resumable", "weights-only"):
        raise BackendError(f"checkpoint_type={abridge(value)}; accepted: resumable, weights-only")
    return kind.lower()
