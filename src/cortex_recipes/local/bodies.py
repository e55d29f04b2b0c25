"""Request bodies, before any of their content is used: JSON and DSSST1 frames parsed with
bounded size and depth, chunk descriptors, numbers, ids and the small bodies.

A body deeper than :data:`MAX_JSON_DEPTH`, a DSSST1 header that is not an object, or chunk
metadata of the wrong type is a :class:`BackendError` (a 4xx), never an exception from deep
inside a parser. Every number is checked for type and range; the message names the field, the
value (abridged) and what is accepted. Part of the backend's one check of every request
(:mod:`frame_checks`, :mod:`loss_schemas`, :mod:`generate_params`): a request that passes does
not fail later for a reason visible here.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from cortex_training import wire

from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.specs import (
    CHECKPOINT_ID_RE,
    JOB_ID_RE,
    abridge,
    learning_rate,
    reject_unknown_keys,
)

# Nothing the SDK sends nests deeper than ~6 levels; 32 leaves room and stops stack abuse.
MAX_JSON_DEPTH = 32
MAX_TEMPERATURE = 100.0  # a sampling or training temperature
# Integers beyond int64 cannot become tensors or floats reliably; no field needs them.
MAX_ABS_INT = 2**63 - 1
CHUNK_GROUP_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")

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


JSON_BODY = "JSON body"
DSSST1_HEADER = "DSSST1 frame header (its JSON metadata)"
DSSST1_FRAME = "DSSST1 frame"


def too_deep(what: str, fmt: str) -> BackendError:
    """The 400 for a structure nested past :data:`MAX_JSON_DEPTH`, naming the format."""
    return BackendError(f"{what}: the {fmt} nests deeper than {MAX_JSON_DEPTH} levels")


def check_depth(value: Any, what: str, fmt: str = JSON_BODY) -> Any:
    if _depth_exceeds(value, MAX_JSON_DEPTH):
        raise too_deep(what, fmt)
    return value


def parse_json(raw: bytes, what: str) -> Any:
    """JSON from a request body (empty -> ``{}``), depth-bounded."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except RecursionError as exc:
        raise too_deep(what, JSON_BODY) from exc
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
        raise too_deep(where, DSSST1_FRAME) from exc
    except Exception as exc:  # malformed JSON inside a header, bad dtypes, ...
        raise BackendError(
            f"{where}: not a valid DSSST1 frame ({type(exc).__name__}: {abridge(str(exc), 120)})"
        ) from exc
    return check_depth(value, where, DSSST1_FRAME)


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
        raise too_deep(where, DSSST1_HEADER) from exc
    except (wire.WireError, ValueError, TypeError) as exc:
        raise BackendError(f"{where}: unreadable frame metadata ({abridge(str(exc))})") from exc
    if not isinstance(metadata, dict):
        raise BackendError(f"{where}: frame metadata must be an object, got {abridge(metadata)}")
    check_depth(metadata, where, DSSST1_HEADER)
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
