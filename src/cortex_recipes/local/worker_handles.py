"""Server-side handles to worker processes: spawn, readiness, a FIFO of commands, and death.

Invariants:
- Commands are sent in submission order as soon as the worker is ready, without waiting for
  the previous reply (a sampling worker batches the generate commands it holds); each carries a
  ``seq`` and its reply is matched by it. A worker runs its commands in arrival order.
- :meth:`WorkerHandle.cancel` withdraws a command not yet sent, or asks the worker to drop it
  (a generation mid-decode leaves at the next step); its future then fails with
  :class:`WorkerCancelled`.
- A worker's exit is always noticed and reaped (no zombie): a reaper thread waits on the
  process. An exit nobody asked for is a death: the handle records which worker died and how
  (exit code or signal), fails the command in flight and every queued one with
  :class:`WorkerDied`, refuses new ones, and tells its owner through ``on_death``.
- A stop that was asked for (cancel, shutdown) is not a death: commands still queued or in
  flight fail with :class:`WorkerStopped`, which the request store reports as ``cancelled``.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cortex_recipes.local.cores import CoreBalancer
from cortex_recipes.local.devices import worker_visible_devices
from cortex_recipes.local.protocol import ConnectionClosed, recv_message, send_message
from cortex_recipes.local.specs import WorkerSpec
from cortex_recipes.local.worker_spawn import (
    STOP_TIMEOUT_S,
    SparePool,
    describe_exit,
    spawn_worker,
    stop_process,
    worker_env,
)

log = logging.getLogger(__name__)


@dataclass
class WorkerReply:
    ok: bool
    body: bytes
    error: str | None
    started_at: float | None


class WorkerDied(RuntimeError):
    """The worker process exited without being asked to, or could not start."""


class WorkerStopped(RuntimeError):
    """The worker was stopped on purpose (its job was cancelled or the server stops)."""


class WorkerCancelled(RuntimeError):
    """The command was cancelled (``cancel-request``) before it completed; ``started_at`` is
    when the worker had started it (None if it never had)."""

    def __init__(self, message: str, started_at: float | None = None):
        super().__init__(message)
        self.started_at = started_at


class WorkerHandle:
    """One sub-job's worker process and the threads that feed and reap it."""

    def __init__(
        self,
        spec: WorkerSpec,
        run_dir: Path,
        log_path: Path,
        *,
        on_death: Callable[[WorkerHandle, str], None] | None = None,
        cores: CoreBalancer | None = None,
        spares: SparePool | None = None,
    ):
        self.spec = spec
        self._cores = cores
        self._outstanding = 0  # commands submitted and not yet settled
        self._count_lock = threading.Lock()
        self.sub_job_id = spec.sub_job_id
        self.info: dict[str, Any] | None = None
        self.error: str | None = None
        self.ready = threading.Event()
        self.log_path = log_path
        self._on_death = on_death
        self._queue: queue.Queue = queue.Queue()
        self._seq = itertools.count()
        self._inflight: dict[int, Future] = {}
        self._sent: dict[int, int] = {}  # id(future) -> seq, for cancel
        self._stopping = False
        self._dead = threading.Event()
        self._lock = threading.Lock()
        spec_path = run_dir / f"{self.sub_job_id.replace(':', '_')}.json"
        spec_path.write_text(spec.to_json())
        env = worker_env(
            worker_visible_devices(spec.device, os.environ.get("CUDA_VISIBLE_DEVICES"))
        )
        spare = spares.take(env) if spares is not None else None
        self._spawned = time.monotonic()
        if spare is not None:
            try:  # sent before the feeder starts; the spare answers "ready" once it has loaded
                assign = {"op": "assign", "spec": str(spec_path.resolve())}
                send_message(spare.sock, {**assign, "log": str(log_path.resolve())})
            except OSError:  # it died just now: start a process of its own
                SparePool.stop(spare)
                spare = None
        self.from_spare = spare is not None
        if spare is not None:
            self.process, self._sock = spare.process, spare.sock
        else:
            self.process, self._sock = spawn_worker(env, log_path, spec_path)
        if spares is not None:  # once nothing is starting or running (SparePool)
            spares.replenish(env, defer=True)
        self._feeder = threading.Thread(target=self._feed, name=self.sub_job_id, daemon=True)
        self._feeder.start()
        self._reaper = threading.Thread(
            target=self._reap, name=f"reap {self.sub_job_id}", daemon=True
        )
        self._reaper.start()

    @property
    def alive(self) -> bool:
        return self.ready.is_set() and self.error is None and not self._stopping

    @property
    def quiet(self) -> bool:
        """Neither starting (importing, loading its model) nor running a command."""
        return (
            self._stopping
            or self._dead.is_set()
            or (self.ready.is_set() and self._outstanding == 0)
        )

    # -- threads -------------------------------------------------------------------------------

    def _reap(self) -> None:
        returncode = self.process.wait()
        if not self._stopping:
            self._die(f"worker of sub-job {self.sub_job_id} {describe_exit(returncode)}")

    def _die(self, reason: str) -> None:
        with self._lock:
            if self._dead.is_set():
                return
            self._dead.set()
            if self.error is None:
                self.error = f"{reason}; see {self.log_path}"
        log.error("%s", self.error)
        self.ready.set()
        self._fail_inflight(WorkerDied(self.error))
        self._fail_pending(WorkerDied(self.error))
        if self._on_death is not None:
            self._on_death(self, self.error)

    def _wait_for_exit_reason(self) -> str:
        try:
            returncode = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            returncode = None
        return f"worker of sub-job {self.sub_job_id} {describe_exit(returncode)}"

    def _feed(self) -> None:
        """Wait for the worker to be ready, then receive replies (and start the sender)."""
        try:
            header, _ = recv_message(self._sock)
        except (ConnectionClosed, OSError):
            if not self._stopping:
                self._die(self._wait_for_exit_reason() + " while starting")
            return
        if not header.get("ready"):
            self.error = str(header.get("error") or "worker failed to start")
            self.ready.set()
            self._fail_pending(WorkerDied(self.error))
            return
        self.info = header.get("info") or {}
        log.info(
            "sub-job %s ready %.1f s after %s (model loaded in %.1f s)",
            self.sub_job_id,
            time.monotonic() - self._spawned,
            "a pre-started worker took it" if self.from_spare else "its process started",
            float(self.info.get("load_s") or 0.0),
        )
        self.ready.set()
        threading.Thread(target=self._send, name=f"send {self.sub_job_id}", daemon=True).start()
        while True:
            try:
                reply, reply_body = recv_message(self._sock)
            except (ConnectionClosed, OSError):
                if self._stopping:
                    stopped = WorkerStopped(f"sub-job {self.sub_job_id} was stopped")
                    self._fail_inflight(stopped)
                    self._fail_pending(stopped)
                else:
                    self._die(self._wait_for_exit_reason())
                return
            with self._lock:
                future = self._inflight.pop(reply.get("seq"), None)
            if future is None:
                continue
            self._sent.pop(id(future), None)
            if reply.get("cancelled"):
                future.set_exception(
                    WorkerCancelled(reply.get("error") or "cancelled", reply.get("started_at"))
                )
                continue
            future.set_result(
                WorkerReply(
                    ok=bool(reply.get("ok")),
                    body=reply_body,
                    error=reply.get("error"),
                    started_at=reply.get("started_at"),
                )
            )

    def _send(self) -> None:
        """Send queued commands in order; a reply is not awaited before the next is sent."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            header, body, future = item
            if future is not None:
                if not future.set_running_or_notify_cancel():
                    continue
                seq = next(self._seq)
                header = {**header, "seq": seq}
                with self._lock:
                    if self._dead.is_set():
                        future.set_exception(WorkerDied(self.error or "worker died"))
                        continue
                    self._inflight[seq] = future
                    self._sent[id(future)] = seq
            try:
                send_message(self._sock, header, body)
            except OSError:
                return  # the receiver notices the closed socket and settles everything

    def _fail_inflight(self, exc: Exception) -> None:
        with self._lock:
            futures = list(self._inflight.values())
            self._inflight.clear()
            self._sent.clear()
        for future in futures:
            if not future.done():
                future.set_exception(exc)

    def _fail_pending(self, exc: Exception) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None and item[2] is not None and item[2].set_running_or_notify_cancel():
                item[2].set_exception(exc)

    # -- API -------------------------------------------------------------------------------------

    def submit(self, header: dict[str, Any], body: bytes = b"") -> Future:
        """Queue a command; the future resolves to a :class:`WorkerReply` once it has run."""
        future: Future = Future()
        if self._stopping:
            future.set_exception(WorkerStopped(f"sub-job {self.sub_job_id} was stopped"))
            return future
        if self.error is not None:
            future.set_exception(WorkerDied(self.error))
            return future
        with self._count_lock:
            self._outstanding += 1
            if self._outstanding == 1 and self._cores is not None:
                self._cores.busy(self)  # queues this worker's new thread count first
        future.add_done_callback(self._settled)
        self._queue.put((header, body, future))
        return future

    def _settled(self, _: Future) -> None:
        with self._count_lock:
            self._outstanding -= 1
            if self._outstanding == 0 and self._cores is not None:
                self._cores.idle(self)

    def set_threads(self, n: int) -> None:
        """Tell the worker to use ``n`` torch threads from its next boundary on."""
        self._queue.put(({"op": "threads", "n": int(n)}, b"", None))

    def pause(self, max_s: float) -> None:
        """Hold the worker's decoding from its next step boundary until :meth:`resume` or for
        ``max_s`` seconds; rows keep their place and commands still run."""
        self._queue.put(({"op": "pause", "max_s": float(max_s)}, b"", None))

    def resume(self) -> None:
        """Lift a :meth:`pause` (nothing when there is none)."""
        self._queue.put(({"op": "resume"}, b"", None))

    def cancel(self, future: Future) -> bool:
        """Withdraw ``future``'s command, or ask the worker to drop it; False when it has
        already completed (or belongs to no command of this worker)."""
        if future.cancel():
            return True
        if future.done():
            return False
        with self._lock:
            seq = self._sent.get(id(future))
        if seq is None:
            return False
        self._queue.put(({"op": "cancel", "target": seq}, b"", None))
        return True

    def close(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the worker (a cancel, not a death); its memory, GPU memory included, is freed
        when the process exits, which this waits for."""
        if self._stopping:
            return
        self._stopping = True
        self._queue.put(None)
        stop_process(self.process, self._sock, timeout)
        self._fail_inflight(WorkerStopped(f"sub-job {self.sub_job_id} was stopped"))
        self._fail_pending(WorkerStopped(f"sub-job {self.sub_job_id} was stopped"))
