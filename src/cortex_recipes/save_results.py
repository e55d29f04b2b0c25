"""What a ``save`` answered, in every shape a Cortex endpoint documents, read in one place.

The local backend answers ``checkpoint_id``, ``checkpoint_type``, ``stage_path`` and
``checkpoint_path``. Hosted Cortex documents ``checkpoint_id`` among a save result's fields, but
in practice carries the id only inside ``stage_path`` (``.../checkpoints/cp_<id>/...``, the SDK's
REST reference 1.7; its catalog smoke test derives it from there). :func:`normalised` gives the
journeys one shape whichever answered: the id (from the result, else from the path), the type
(from the result, else the one asked for) and the path.
"""

from __future__ import annotations

import re
from typing import Any

# A checkpoint id as the service issues them: ``cp_`` and hex (a UUID, with or without dashes).
CHECKPOINT_SEGMENT = re.compile(r"/checkpoints/(cp_[0-9A-Za-z-]+)(?:/|$)")


class SaveResultError(RuntimeError):
    """A save result that names no checkpoint."""


def checkpoint_id(saved: Any) -> str:
    """The id of the checkpoint a save result describes: ``checkpoint_id`` when present, else
    the ``cp_<id>`` segment of ``stage_path`` (or ``checkpoint_path``)."""
    if not isinstance(saved, dict):
        raise SaveResultError(f"save result is {type(saved).__name__}, not an object")
    given = saved.get("checkpoint_id")
    if isinstance(given, str) and given:
        return given
    for key in ("stage_path", "checkpoint_path"):
        path = saved.get(key)
        if isinstance(path, str):
            match = CHECKPOINT_SEGMENT.search(path)
            if match:
                return match.group(1)
    raise SaveResultError(
        "save result names no checkpoint: no checkpoint_id, and neither stage_path nor "
        f"checkpoint_path holds a /checkpoints/cp_<id>/ segment (keys: {sorted(saved)})"
    )


def normalised(saved: Any, checkpoint_type: str) -> dict[str, Any]:
    """``saved`` with ``checkpoint_id`` and ``checkpoint_type`` filled in (the type asked for
    when the result does not say) and ``stage_path`` present (None when not given)."""
    out = dict(saved) if isinstance(saved, dict) else {}
    out["checkpoint_id"] = checkpoint_id(saved)
    out["checkpoint_type"] = out.get("checkpoint_type") or checkpoint_type
    out.setdefault("stage_path", out.get("checkpoint_path"))
    return out
