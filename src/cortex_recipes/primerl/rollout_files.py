"""prime-rl's rollout files: ``<output_dir>/rollouts/step_<N>/rank_<r>.bin`` -> training rows.

Each file is ``msgspec.msgpack`` of ``list[MicroBatch]``, written to ``rank_<r>.bin.tmp`` and
renamed, so a file that exists is complete. ``MicroBatch`` is an ``array_like`` struct: each
micro-batch is a msgpack array of up to 16 entries in this order (trailing defaults omitted):
``input_ids, loss_mask, advantages, inference_logprobs, position_ids, sequence_lengths,
temperatures, env_names, seq_lens, ref_logprobs, routed_experts, mm_kwargs, mm_token_type_ids,
rl_weights, ce_weights, ref_kl_weights`` (prime-rl 559b447, ``transports/rollouts/types.py``).
The struct below is this project's own statement of that wire shape.

Invariants:
- decoding is typed (nothing is unpickled) and fails closed: a file that does not decode, or
  whose per-token fields disagree in length, raises :class:`RolloutFileError` naming the file,
  the micro-batch index and the field;
- rows are packed: a micro-batch holds several samples back to back, split by
  ``sequence_lengths``; every per-token field is token-aligned (entry ``t`` is about token
  ``t``), as prime-rl writes it. The next-token shift happens later, in one place
  (:func:`cortex_recipes.frames.shift`);
- features this trainer cannot honour (multimodal, routed experts, reference-KL and CE
  components, fractional ``rl_weights``) are refused, never silently dropped.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec


class MicroBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    input_ids: list[int]
    loss_mask: list[bool]
    advantages: list[float]
    inference_logprobs: list[float]
    position_ids: list[int]
    sequence_lengths: list[int]
    temperatures: list[float]
    env_names: list[str]
    seq_lens: list[int]
    ref_logprobs: list[float] | None = None
    routed_experts: Any = None
    mm_kwargs: Any = None
    mm_token_type_ids: list[int] | None = None
    rl_weights: list[float] | None = None
    ce_weights: list[float] | None = None
    ref_kl_weights: list[float] | None = None


FIELDS = MicroBatch.__struct_fields__
PER_TOKEN = ("loss_mask", "advantages", "inference_logprobs", "position_ids", "temperatures")
UNSUPPORTED = ("routed_experts", "mm_kwargs", "mm_token_type_ids", "ce_weights", "ref_kl_weights")
_PATH = re.compile(r"`\$\[(\d+)\]\[(\d+)\]")


class RolloutFileError(ValueError):
    """A rollout file the trainer refuses; the message names the file and the field."""


@dataclass(frozen=True)
class Sample:
    """One sample: token-aligned ids, trainable mask, advantages and sampler logprobs."""

    input_ids: list[int]
    loss_mask: list[bool]
    advantages: list[float]
    inference_logprobs: list[float]
    env_name: str


def rollout_path(output_dir: Path, step: int, rank: int = 0) -> Path:
    return Path(output_dir) / "rollouts" / f"step_{step}" / f"rank_{rank}.bin"


def _where(message: str) -> str:
    match = _PATH.search(message)
    if not match:
        return ""
    index, field = int(match.group(1)), int(match.group(2))
    name = FIELDS[field] if field < len(FIELDS) else f"entry {field} (MicroBatch has {len(FIELDS)})"
    return f" (micro-batch {index}, field {name})"


def decode(data: bytes, path: Path) -> list[MicroBatch]:
    try:
        return msgspec.msgpack.decode(data, type=list[MicroBatch])
    except msgspec.ValidationError as exc:
        raise RolloutFileError(f"{path}: {exc}{_where(str(exc))}") from exc
    except msgspec.DecodeError as exc:
        raise RolloutFileError(f"{path}: not a msgpack list of MicroBatch: {exc}") from exc


def check(batch: MicroBatch, index: int, path: Path) -> None:
    where = f"{path}: micro-batch {index}"
    n = len(batch.input_ids)
    if n == 0:
        raise RolloutFileError(f"{where}: field input_ids is empty")
    for name in (*PER_TOKEN, "env_names", "ref_logprobs", "rl_weights"):
        value = getattr(batch, name)
        if value is not None and len(value) != n:
            raise RolloutFileError(
                f"{where}: field {name} has {len(value)} entries for {n} input_ids"
            )
    for name in UNSUPPORTED:
        if getattr(batch, name) is not None:
            raise RolloutFileError(
                f"{where}: field {name} is set; the Cortex trainer adapter supports text GRPO "
                f"only ({', '.join(UNSUPPORTED)} must be nil)"
            )
    if batch.rl_weights is not None and any(w not in (0.0, 1.0) for w in batch.rl_weights):
        raise RolloutFileError(f"{where}: field rl_weights holds weights other than 0 and 1")
    lengths = batch.sequence_lengths
    if not lengths or any(x <= 0 for x in lengths) or sum(lengths) != n:
        raise RolloutFileError(
            f"{where}: field sequence_lengths={lengths} must be positive and sum to "
            f"{n} (len(input_ids))"
        )
    for name in ("advantages", "inference_logprobs"):
        bad = next((t for t, x in enumerate(getattr(batch, name)) if not math.isfinite(x)), None)
        if bad is not None:
            raise RolloutFileError(f"{where}: field {name}[{bad}] is not finite")


def unpack(batch: MicroBatch) -> list[Sample]:
    """Split a packed micro-batch into its samples (``rl_weights`` 0 removes a token)."""
    rows, start = [], 0
    for length in batch.sequence_lengths:
        end = start + length
        mask = list(batch.loss_mask[start:end])
        if batch.rl_weights is not None:
            mask = [m and w > 0 for m, w in zip(mask, batch.rl_weights[start:end], strict=True)]
        rows.append(
            Sample(
                input_ids=list(batch.input_ids[start:end]),
                loss_mask=mask,
                advantages=list(batch.advantages[start:end]),
                inference_logprobs=list(batch.inference_logprobs[start:end]),
                env_name=batch.env_names[start] if batch.env_names else "",
            )
        )
        start = end
    return rows


def read_rows(path: Path) -> list[Sample]:
    """Every sample of a rollout file that has a trainable token, in file order."""
    path = Path(path)
    batches = decode(path.read_bytes(), path)
    if not batches:
        raise RolloutFileError(f"{path}: holds no micro-batch")
    rows = []
    for index, batch in enumerate(batches):
        check(batch, index, path)
        rows.extend(r for r in unpack(batch) if any(r.loss_mask))
    if not rows:
        raise RolloutFileError(f"{path}: field loss_mask has no trainable token in any sample")
    return rows
