"""Server-side handles to worker processes: spawn, readiness, a FIFO of commands, and death.

Invariants:
- Commands run in submission order, one at a time, on the worker's socket.
- A worker's exit is always noticed and reaped (no zombie): a reaper thread waits on the
  process. An exit nobody asked for is a death: the handle records which worker died and how
  (exit code or signal), fails the command in flight and every queued one with
  :class:`WorkerDied`, refuses new ones, and tells its owner through ``on_death``.
- A stop that was asked for (cancel, shutdown) is not a death: commands still queued or in
  flight fail with :class:`WorkerStopped`, which the request store reports as ``cancelled``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cortex_recipes.local.devices import worker_visible_devices
from cortex_recipes.local.protocol import ConnectionClosed, recv_message, send_message
from cortex_recipes.local.specs import WorkerSpec

log = logging.getLogger(__name__)

# How long a stopping worker gets to exit on its own before it is killed.
STOP_TIMEOUT_S = 10.0


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


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "closed its connection"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


class WorkerHandle:
    """One sub-job's worker process and the threads that feed and reap it."""

    def __init__(
        self,
        spec: WorkerSpec,
        run_dir: Path,
        log_path: Path,
        *,
        on_death: Callable[[WorkerHandle, str], None] | None = None,
    ):
        self.spec = spec
        self.sub_job_id = spec.sub_job_id
        self.info: dict[str, Any] | None = None
        self.error: str | None = None
        self.ready = threading.Event()
        self.log_path = log_path
        self._on_death = on_death
        self._queue: queue.Queue = queue.Queue()
        self._stopping = False
        self._dead = threading.Event()
        self._lock = threading.Lock()
        spec_path = run_dir / f"{self.sub_job_id.replace(':', '_')}.json"
        spec_path.write_text(spec.to_json())
        parent_sock, child_sock = socket.socketpair()
        self._sock = parent_sock
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env["CUDA_VISIBLE_DEVICES"] = worker_visible_devices(
            spec.device, os.environ.get("CUDA_VISIBLE_DEVICES")
        )
        with open(log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cortex_recipes.local.worker",
                    "--fd",
                    str(child_sock.fileno()),
                    "--spec",
                    str(spec_path),
                ],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                env=env,
            )
        child_sock.close()
        self._feeder = threading.Thread(target=self._feed, name=self.sub_job_id, daemon=True)
        self._feeder.start()
        self._reaper = threading.Thread(
            target=self._reap, name=f"reap {self.sub_job_id}", daemon=True
        )
        self._reaper.start()

    @property
    def alive(self) -> bool:
        return self.ready.is_set() and self.error is None and not self._stopping

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
        self.ready.set()
        while True:
            item = self._queue.get()
            if item is None:
                return
            header, body, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                send_message(self._sock, header, body)
                reply, reply_body = recv_message(self._sock)
            except (ConnectionClosed, OSError):
                if self._stopping:
                    future.set_exception(WorkerStopped(f"sub-job {self.sub_job_id} was stopped"))
                    self._fail_pending(WorkerStopped(f"sub-job {self.sub_job_id} was stopped"))
                else:
                    self._die(self._wait_for_exit_reason())
                    future.set_exception(WorkerDied(self.error or "worker died"))
                return
            future.set_result(
                WorkerReply(
                    ok=bool(reply.get("ok")),
                    body=reply_body,
                    error=reply.get("error"),
                    started_at=reply.get("started_at"),
                )
            )

    def _fail_pending(self, exc: Exception) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None and item[2].set_running_or_notify_cancel():
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
        self._queue.put((header, body, future))
        return future

    def close(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the worker (a cancel, not a death); its memory, GPU memory included, is freed
        when the process exits, which this waits for."""
        if self._stopping:
            return
        self._stopping = True
        self._queue.put(None)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._fail_pending(WorkerStopped(f"sub-job {self.sub_job_id} was stopped"))
