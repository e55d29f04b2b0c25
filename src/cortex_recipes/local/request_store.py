"""Asynchronous requests of one job: their lifecycle, their results, and result paging.

Invariants:
- A request moves ``pending -> running -> completed | failed | cancelled`` exactly once to a
  final state; ``done`` is set when it does.
- A job keeps at most :data:`MAX_REQUESTS_KEPT` requests (oldest dropped first), so the bytes it
  holds are bounded by that many results.
- A result travels inline (base64 DSSST1) up to ``result_chunk_bytes``, else as
  ``result_chunk`` events paged by an integer cursor.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from cortex_training import wire

from cortex_recipes.local.errors import BackendError, NotFound
from cortex_recipes.local.worker_handles import WorkerCancelled, WorkerReply, WorkerStopped

# Enough for every request a journey polls to stay pollable; a bound on the memory results hold.
MAX_REQUESTS_KEPT = 512
# The most result_chunk events one poll returns.
MAX_EVENTS_PER_POLL = 512
# How long a poll of an unfinished request is held waiting for it to settle: long enough that a
# step's result goes back the moment it is ready, short enough for any client's read timeout.
POLL_HOLD_S = 20.0
# How long cancel-request waits for its target to settle before it reports the target's status.
CANCEL_SETTLE_S = 10.0


@dataclass
class Request:
    request_id: str
    job_id: str
    sub_job_id: str
    operation: str
    status: str = "pending"
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    started_at: float | None = None
    result: bytes | None = None
    error: str | None = None
    future: Future | None = None
    # Asks whoever runs the request to drop it (set for requests that run on a worker).
    canceller: Callable[[], bool] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    _callbacks: list[Callable[[], None]] = field(default_factory=list)
    _settle: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self.status, self.started_at = "running", time.time()

    def _settled(self, status: str, result: bytes | None, error: str | None) -> None:
        with self._settle:
            if self.done.is_set():
                return
            self.status, self.result, self.error = status, result, error
            self.updated_at = time.time()
            self.done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def finish(self, *, result: bytes | None = None, error: str | None = None) -> None:
        self._settled("failed" if error is not None else "completed", result, error)

    def cancel(self, reason: str) -> None:
        self._settled("cancelled", None, reason)

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the settling thread) once the request settles; at once if
        it has."""
        with self._settle:
            if not self.done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def forget_callback(self, callback: Callable[[], None]) -> None:
        with self._settle, contextlib.suppress(ValueError):
            self._callbacks.remove(callback)

    def complete_from(self, future: Future) -> None:
        """Settle this request from a worker future (the future's done callback)."""
        if future.cancelled():
            self.cancel("cancelled before it started")
            return
        exc = future.exception()
        if isinstance(exc, WorkerCancelled):
            self.started_at = exc.started_at
            self.cancel("cancelled by request")
        elif isinstance(exc, WorkerStopped):
            self.cancel(f"cancelled: {exc}")
        elif exc is not None:
            self.finish(error=str(exc))
        else:
            reply: WorkerReply = future.result()
            self.started_at = reply.started_at
            if reply.ok:
                self.finish(result=reply.body)
            else:
                self.finish(error=reply.error or "failed")


class RequestStore:
    """The requests of one job."""

    def __init__(self, job_id: str, *, result_chunk_bytes: int, poll_wait_s: float):
        self.job_id = job_id
        self.result_chunk_bytes = result_chunk_bytes
        # A status poll of an unfinished request is held up to poll_wait_s until it settles
        # (:meth:`wait`): the answer goes out the moment the result is ready, so a client's
        # sleep between polls adds nothing, and a tight polling loop steals no CPU.
        self.poll_wait_s = poll_wait_s
        self._requests: OrderedDict[str, Request] = OrderedDict()
        self._lock = threading.Lock()

    def new(self, sub_job_id: str, operation: str) -> Request:
        request = Request(
            request_id=f"req-{uuid.uuid4().hex}",
            job_id=self.job_id,
            sub_job_id=sub_job_id,
            operation=operation,
        )
        with self._lock:
            self._requests[request.request_id] = request
            while len(self._requests) > MAX_REQUESTS_KEPT:
                self._requests.popitem(last=False)
        return request

    def get(self, request_id: str) -> Request:
        request = self._requests.get(request_id)
        if request is None:
            raise NotFound(f"request {request_id!r} not found in job {self.job_id}")
        return request

    def unfinished(self) -> list[Request]:
        with self._lock:
            return [r for r in self._requests.values() if not r.done.is_set()]

    def fail_unfinished(self, reason: str, *, cancelled: bool) -> None:
        """Settle every unfinished request (a dead worker's or a cancelled job's)."""
        for request in self.unfinished():
            if cancelled:
                request.cancel(reason)
            else:
                request.finish(error=reason)

    def cancel(self, request_id: str) -> dict[str, Any]:
        """Cancel a request that has not finished, queued or running (a generation leaves its
        batch at the next decode step); report whether it ended cancelled."""
        request = self.get(request_id)
        # A worker request's canceller withdraws it or asks its worker to drop it; the worker
        # future then settles the request. Server-side requests cannot be cancelled.
        if not request.done.is_set() and request.canceller is not None and request.canceller():
            request.done.wait(CANCEL_SETTLE_S)
        cancelled = request.status == "cancelled"
        return {"request_id": request_id, "cancelled": cancelled, "status": request.status}

    async def wait(self, request_id: str) -> None:
        """Wait (without holding a thread) until the request settles or ``poll_wait_s``
        passes, so a client's poll returns the moment its result is ready."""
        request = self.get(request_id)
        if request.done.is_set() or self.poll_wait_s <= 0:
            return
        loop = asyncio.get_running_loop()
        settled = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(lambda: settled.done() or settled.set_result(None))

        request.on_done(wake)
        try:
            await asyncio.wait_for(settled, self.poll_wait_s)
        except TimeoutError:
            pass
        finally:
            request.forget_callback(wake)

    def status(self, request_id: str, cursor: str | None, max_events: int | None) -> dict:
        # Checked first, whatever the request's state: only ASCII digits this server could have
        # issued (str.isdigit would take '²', which int() refuses).
        if cursor and not re.fullmatch(r"[0-9]{1,12}", cursor):
            raise BackendError(f"cursor={cursor[:40]!r} is not a cursor this server issued")
        request = self.get(request_id)
        status = request.status
        if status == "pending" and request.future is not None and request.future.running():
            status = "running"
        body: dict[str, Any] = {
            "request_id": request.request_id,
            "job_id": self.job_id,
            "sub_job_id": request.sub_job_id,
            "operation": request.operation,
            "status": status,
            "created_at": request.created_at,
            "updated_at": request.updated_at,
            "started_at": request.started_at,
            "error": request.error,
            "result": None,
            "events": [],
            "next_cursor": "",
        }
        if status != "completed" or request.result is None:
            return body
        frame = request.result
        if len(frame) <= self.result_chunk_bytes:
            body["result"] = {
                "wire_format": wire.WIRE_FORMAT_VERSION,
                "encoding": "base64",
                "payload_b64": base64.b64encode(frame).decode("ascii"),
                "content_type": "application/octet-stream",
            }
            return body
        chunks = wire.encode_byte_chunks(frame, kind="result", max_bytes=self.result_chunk_bytes)
        start = int(cursor) if cursor else 0
        if not 0 <= start <= len(chunks):
            raise BackendError(f"cursor={cursor!r} is out of range [0, {len(chunks)}]")
        limit = max(1, min(int(max_events or 16), MAX_EVENTS_PER_POLL))
        page = chunks[start : start + limit]
        body["events"] = [
            {
                "type": "result_chunk",
                "payload_b64": base64.b64encode(chunk).decode("ascii"),
                "payload_sha256": hashlib.sha256(chunk).hexdigest(),
            }
            for chunk in page
        ]
        end = start + len(page)
        body["next_cursor"] = str(end) if end < len(chunks) else ""
        return body
