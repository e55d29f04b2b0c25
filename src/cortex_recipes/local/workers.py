"""Server-side handles to worker processes: spawn, readiness, a FIFO of commands per worker."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cortex_recipes.local.protocol import ConnectionClosed, recv_message, send_message

log = logging.getLogger(__name__)


@dataclass
class WorkerReply:
    ok: bool
    body: bytes
    error: str | None
    started_at: float | None


class WorkerError(RuntimeError):
    """The worker process died or could not start."""


class WorkerHandle:
    """One sub-job's worker process and the thread that feeds it commands in order."""

    def __init__(self, spec: dict[str, Any], run_dir: Path, log_path: Path):
        self.spec = spec
        self.sub_job_id = spec["sub_job_id"]
        self.info: dict[str, Any] | None = None
        self.error: str | None = None
        self.ready = threading.Event()
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        spec_path = run_dir / f"{self.sub_job_id.replace(':', '_')}.json"
        spec_path.write_text(json.dumps(spec))
        parent_sock, child_sock = socket.socketpair()
        self._sock = parent_sock
        self.log_path = log_path
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
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
        self._thread = threading.Thread(target=self._run, name=self.sub_job_id, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            header, _ = recv_message(self._sock)
        except (ConnectionClosed, OSError) as exc:
            self.error = f"worker exited while starting: {exc}; see {self.log_path}"
            self.ready.set()
            self._fail_pending()
            return
        if not header.get("ready"):
            self.error = header.get("error") or "worker failed to start"
            self.ready.set()
            self._fail_pending()
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
            except (ConnectionClosed, OSError) as exc:
                self.error = f"worker process died: {exc}; see {self.log_path}"
                future.set_exception(WorkerError(self.error))
                self._fail_pending()
                return
            future.set_result(
                WorkerReply(
                    ok=bool(reply.get("ok")),
                    body=reply_body,
                    error=reply.get("error"),
                    started_at=reply.get("started_at"),
                )
            )

    def _fail_pending(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[2].set_exception(WorkerError(self.error or "worker unavailable"))

    def submit(self, header: dict[str, Any], body: bytes = b"") -> Future:
        """Queue a command; the future resolves to a :class:`WorkerReply` once it has run."""
        future: Future = Future()
        if self._closed or (self.ready.is_set() and self.error):
            future.set_exception(WorkerError(self.error or "worker is closed"))
            return future
        self._queue.put((header, body, future))
        return future

    def close(self, timeout: float = 10.0) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._fail_pending()
