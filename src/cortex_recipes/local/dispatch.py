"""Routing a call to a sub-job, and running it as an asynchronous request.

Invariants:
- Routing picks exactly one sub-job of an allowed type (an explicit ``sub_job_id``, else the
  first of ``sub_job_type``, else the first of the default types) or raises a 400 naming why.
- Work runs either on the sub-job's worker (one command in its FIFO) or, for multi-step
  operations such as save and weight sync, in a server thread; either way the caller gets a
  request id at once and the request settles exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cortex_training import wire

from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.jobs import Job
from cortex_recipes.local.request_store import Request
from cortex_recipes.local.specs import JOB_TYPES, SubJobSpec, abridge
from cortex_recipes.local.worker_handles import WorkerDied, WorkerStopped

log = logging.getLogger(__name__)


def route(
    job: Job,
    operation: str,
    sub_job_id: Any,
    sub_job_type: Any,
    allowed: tuple[str, ...],
    default: tuple[str, ...],
) -> SubJobSpec:
    if sub_job_type is not None and sub_job_type not in JOB_TYPES:
        raise BackendError(
            f"sub_job_type={abridge(sub_job_type)}; accepted: {', '.join(JOB_TYPES)}"
        )
    if sub_job_id is not None:
        spec = job.sub_job(sub_job_id)
        if sub_job_type is not None and spec.job_type != sub_job_type:
            raise BackendError(
                f"sub_job_id={sub_job_id!r} is a {spec.job_type} sub-job, not "
                f"sub_job_type={sub_job_type!r}"
            )
    elif sub_job_type is not None:
        matches = job.of_type(sub_job_type)
        if not matches:
            raise BackendError(f"job {job.job_id} has no {sub_job_type!r} sub-job")
        spec = matches[0]
    else:
        spec = next((s for t in default for s in job.of_type(t)), None)
        if spec is None:
            raise BackendError(
                f"{operation} needs a sub-job of type {' or '.join(allowed)}; "
                f"job {job.job_id} has none"
            )
    if spec.job_type not in allowed:
        raise BackendError(
            f"operation {operation!r} cannot run on {spec.job_type} sub-job {spec.sub_job_id}; "
            f"it runs on {' or '.join(allowed)} sub-jobs"
        )
    return spec


def training_sub_job(job: Job, operation: str) -> str:
    training = job.of_type("training")
    if not training:
        raise BackendError(f"{operation} needs a training sub-job; job {job.job_id} has none")
    return training[0].sub_job_id


class Dispatcher:
    """Runs work for requests: worker commands, or server-side functions in a thread pool."""

    def __init__(self, threads: int = 8):
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="orchestrate")

    def on_worker(
        self, job: Job, sub_job_id: str, operation: str, header: dict, body: bytes = b""
    ) -> Request:
        request = job.requests.new(sub_job_id, operation)
        handle = job.workers[sub_job_id]
        future = handle.submit({**header, "id": request.request_id}, body)
        request.future = future
        request.canceller = lambda: handle.cancel(future)
        future.add_done_callback(request.complete_from)
        return request

    def in_server(
        self, job: Job, sub_job_id: str, operation: str, fn: Callable[[], dict[str, Any]]
    ) -> Request:
        request = job.requests.new(sub_job_id, operation)

        def run() -> None:
            request.start()
            try:
                request.finish(result=wire.dumps(fn()))
            except WorkerStopped as exc:
                request.cancel(f"cancelled: {exc}")
            except (BackendError, WorkerDied) as exc:
                request.finish(error=str(exc))
            except Exception as exc:
                log.exception("%s failed", operation)
                request.finish(error=f"{operation} failed: {type(exc).__name__}: {exc}")

        self._pool.submit(run)
        return request

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def worker_result(reply, what: str) -> dict[str, Any]:
    """The decoded result of a worker reply, or a BackendError naming ``what`` failed."""
    if not reply.ok:
        raise BackendError(f"{what} failed: {reply.error}")
    return wire.loads(reply.body)
