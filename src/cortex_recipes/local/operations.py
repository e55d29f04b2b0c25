"""``POST /{job}/operation``: the operation table.

Each ``operation_type`` maps to one handler ``(backend, job_id, body) -> response``; an unknown
type is a 400 that lists the table. ``tail-logs`` reads a job in any state (logs matter most
after a failure); every other operation needs a running job.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, Protocol

from cortex_recipes.local import bodies, hosted
from cortex_recipes.local.data_plane import DataPlane
from cortex_recipes.local.dispatch import Dispatcher, route
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.jobs import JobRegistry
from cortex_recipes.local.specs import JOB_TYPES, abridge
from cortex_recipes.local.weight_sync import start_weight_sync


class Parts(Protocol):
    """What an operation handler uses of the backend (:class:`cortex_recipes.local.backend.Backend`
    is one), named here so this table does not import the backend that imports it."""

    hosted: bool
    registry: JobRegistry
    dispatcher: Dispatcher
    data_plane: DataPlane


BODY_KEYS = ("operation_type", "sub_job_id", "sub_job_type", "payload")
# A page of log lines; more in one response is a client mistake.
MAX_LOG_LINES = 10_000


def _forward(backend: Parts, job_id: str, body: dict) -> dict[str, Any]:
    job = backend.registry.require_running(job_id)
    payload = body.get("payload")
    if backend.hosted and isinstance(payload, dict) and "payload_b64" in payload:
        raise hosted.refuse(
            "forward-raw-dssst1",
            "operation forward: a base64-wrapped DSSST1 payload (payload.payload_b64) is not "
            "accepted; post the raw frame to /{job_id}/forward (cortex_recipes.raw_forward)",
        )
    return backend.data_plane.forward(
        job, body.get("sub_job_id"), body.get("sub_job_type"), body.get("payload")
    )


def _weight_sync(backend: Parts, job_id: str, body: dict) -> dict[str, Any]:
    job = backend.registry.require_running(job_id)
    return start_weight_sync(
        backend.dispatcher,
        job,
        backend.registry.job_dir(job_id),
        body.get("sub_job_id"),
        body.get("sub_job_type"),
        body.get("payload"),
    )


def _reset_prefix_cache(backend: Parts, job_id: str, body: dict) -> dict[str, Any]:
    job = backend.registry.require_running(job_id)
    spec = route(
        job,
        "reset-prefix-cache",
        body.get("sub_job_id"),
        body.get("sub_job_type"),
        ("sampling",),
        ("sampling",),
    )
    payload = body.get("payload")
    payload = bodies.json_object({} if payload is None else payload, "reset-prefix-cache payload")
    bodies.only_keys(
        payload, ("drain", "timeout_s", "retry_interval_s"), "reset-prefix-cache payload"
    )
    drain = bodies.boolean(payload.get("drain", True), "reset-prefix-cache payload.drain")
    timeout_s = bodies.number(
        payload.get("timeout_s", 60.0), "reset-prefix-cache payload.timeout_s",
        minimum=0.0, maximum=MAX_DRAIN_S,
    )  # fmt: skip
    interval = bodies.number(
        payload.get("retry_interval_s", 0.1), "reset-prefix-cache payload.retry_interval_s",
        minimum=0.001, maximum=10.0,
    )  # fmt: skip
    waited = 0.0
    if backend.hosted and drain:  # rule prefix-cache-drain
        waited = _drain(job, spec.sub_job_id, timeout_s, interval)
    return {
        "job_id": job_id,
        "sub_job_id": spec.sub_job_id,
        "reset": True,
        "drained_s": round(waited, 3),
        "note": "the local backend keeps no prefix cache",
    }


# The longest a draining reset may wait; the SDK's default is 60 s.
MAX_DRAIN_S = 3600.0


def _drain(job, sub_job_id: str, timeout_s: float, interval: float) -> float:
    """Wait until ``sub_job_id`` holds no generate rows (running or queued), as hosted's
    draining reset does; the seconds waited, or a 408 naming the rows left after ``timeout_s``."""
    t0 = time.monotonic()
    while True:
        with job.lock:
            rows = job.sampler_rows.get(sub_job_id, 0)
        waited = time.monotonic() - t0
        if rows <= 0:
            return waited
        if waited >= timeout_s:
            raise hosted.refuse(
                "prefix-cache-drain",
                f"reset-prefix-cache with drain=true timed out after timeout_s={timeout_s}: "
                f"{rows} generate row(s) still in flight on {sub_job_id}; send drain=false to "
                "reset without waiting for them",
                status=408,
            )
        time.sleep(min(interval, max(timeout_s - waited, 0.001)))


# A pause that nobody lifts ends by itself (a client that died between its pause and resume
# must not stop the sampler for good); prime-rl's weight update allows 720 s.
DEFAULT_PAUSE_S = 900.0
MAX_PAUSE_S = 3600.0


def _sampling_worker(backend: Parts, job_id: str, body: dict, op: str):
    job = backend.registry.require_running(job_id)
    spec = route(
        job, op, body.get("sub_job_id"), body.get("sub_job_type"), ("sampling",), ("sampling",)
    )
    return spec, job.workers[spec.sub_job_id]


def _pause_generation(backend: Parts, job_id: str, body: dict) -> dict[str, Any]:
    """A local-backend extension (hosted Cortex has no such operation): hold the sampler's
    decoding at its next step boundary, rows and their caches kept, until
    ``resume-generation`` or ``payload.max_s``. Requests still arrive and queue; weight syncs,
    cancels and forwards still run. This is what prime-rl's ``/pause?mode=keep`` asks of vLLM."""
    payload = body.get("payload")
    payload = bodies.json_object({} if payload is None else payload, "pause-generation payload")
    bodies.only_keys(payload, ("max_s",), "pause-generation payload")
    max_s = payload.get("max_s", DEFAULT_PAUSE_S)
    if (
        isinstance(max_s, bool)
        or not isinstance(max_s, int | float)
        or not 0 < max_s <= MAX_PAUSE_S
    ):
        raise BackendError(
            f"pause-generation payload.max_s={abridge(max_s)}; accepted: seconds, above 0 and "
            f"at most {MAX_PAUSE_S:g}"
        )
    spec, worker = _sampling_worker(backend, job_id, body, "pause-generation")
    worker.pause(float(max_s))
    return {"job_id": job_id, "sub_job_id": spec.sub_job_id, "paused": True, "max_s": max_s}


def _resume_generation(backend: Parts, job_id: str, body: dict) -> dict[str, Any]:
    """Lift ``pause-generation`` (a no-op when the sampler is not paused)."""
    if body.get("payload") not in (None, {}):
        raise BackendError(
            f"resume-generation takes no payload; got {abridge(body.get('payload'))}"
        )
    spec, worker = _sampling_worker(backend, job_id, body, "resume-generation")
    worker.resume()
    return {"job_id": job_id, "sub_job_id": spec.sub_job_id, "paused": False}


def _cancel_request(backend: Parts, job_id: str, body: dict) -> dict[str, Any]:
    job = backend.registry.require_running(job_id)
    payload = body.get("payload")
    if not isinstance(payload, dict) or not isinstance(payload.get("request_id"), str):
        raise BackendError("cancel-request needs payload.request_id (a string)")
    return job.requests.cancel(payload["request_id"])


def _tail_logs(backend: Parts, job_id: str, body: dict) -> dict[str, Any]:
    job = backend.registry.get(job_id)
    sub_job_id, sub_job_type = body.get("sub_job_id"), body.get("sub_job_type")
    payload = body.get("payload")
    if payload is None:
        payload = {}
    payload = bodies.json_object(payload, "tail-logs payload")
    bodies.only_keys(payload, ("cursor", "max_lines"), "tail-logs payload")
    if sub_job_id is None and sub_job_type is None and len(job.specs) > 1:
        raise BackendError(
            "tail-logs needs sub_job_id or sub_job_type when a job has several sub-jobs"
        )
    spec = route(job, "tail-logs", sub_job_id, sub_job_type, JOB_TYPES, JOB_TYPES)
    cursor = payload.get("cursor") or "0"
    if not isinstance(cursor, str | int) or not re.fullmatch(r"\d{1,15}", str(cursor)):
        raise BackendError(
            f"tail-logs cursor={abridge(cursor)} must be a cursor this server issued"
        )
    max_lines = bodies.integer(
        payload.get("max_lines") or 200, "tail-logs max_lines", minimum=1, maximum=MAX_LOG_LINES
    )
    path = job.workers[spec.sub_job_id].log_path
    data = path.read_bytes() if path.exists() else b""
    start = min(int(cursor), len(data))
    lines = data[start:].splitlines(keepends=True)[:max_lines]
    end = start + sum(len(line) for line in lines)
    entries = [{"line": line.decode("utf-8", "replace").rstrip("\n")} for line in lines]
    return {"entries": entries, "next_cursor": str(end), "eof": end >= len(data)}


OPERATIONS: dict[str, Callable[[Parts, str, dict], dict[str, Any]]] = {
    "forward": _forward,
    "weight-sync": _weight_sync,
    "reset-prefix-cache": _reset_prefix_cache,
    "cancel-request": _cancel_request,
    "pause-generation": _pause_generation,
    "resume-generation": _resume_generation,
    "tail-logs": _tail_logs,
}


def run_operation(backend: Parts, job_id: str, body: Any) -> dict[str, Any]:
    body = bodies.json_object(body, "operation")
    bodies.only_keys(body, BODY_KEYS, "operation")
    op = body.get("operation_type")
    accepted = [
        name for name in OPERATIONS if not (backend.hosted and name in hosted.LOCAL_OPERATIONS)
    ]
    handler = OPERATIONS.get(op) if op in accepted else None
    if handler is None:
        message = f"operation_type={abridge(op)} is not supported; accepted: {', '.join(accepted)}"
        if op in hosted.LOCAL_OPERATIONS:
            raise hosted.refuse("no-local-operations", message)
        raise BackendError(message)
    return handler(backend, job_id, body)
