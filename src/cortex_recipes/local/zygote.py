"""A fork server for CPU workers (Linux): one process imports what a worker imports (torch,
transformers, peft: ``worker.WARM_MODULES``) once, then forks a spare worker on each request.
A CPU-only backend then pays those imports (about 3.6 CPU-seconds on 2 cores) once instead of
once per worker, and a replacement spare costs a fork instead of imports beside a running step.

Started by the server as ``python -m cortex_recipes.local.zygote --fd N`` (:class:`Zygote`),
before the server's own imports, so the two import at the same time.

Protocol: a ``SOCK_SEQPACKET`` socket pair, one JSON object a packet, nothing pickled. The
server sends ``{"op": "fork", "log": PATH}`` with the new worker's end of its socket pair
attached (``SCM_RIGHTS``); the zygote answers ``{"pid": N}`` or ``{"error": "..."}``, in
order, once its imports are done.

Invariants:
- The zygote runs no Python thread but its main one and no torch op, so what a fork copies is
  imported modules and nothing mid-flight (torch's OpenMP pool starts at a worker's first op,
  in the worker); it never touches a GPU. The one native thread the imports start (numpy's
  OpenBLAS pool, idle) is shut down around each fork by OpenBLAS's own ``pthread_atfork``
  handlers.
- A worker is forked twice (the zygote's child forks it and exits at once), so it is
  re-parented to the server, which made itself a child subreaper (``PR_SET_CHILD_SUBREAPER``):
  the server waits on it as on any child (:class:`ForkedProcess`), and its exit code or signal
  is reported as a spawned worker's is.
- A forked worker is a spare (``worker.run_spare``): it waits for its ``assign`` and never
  returns into the zygote's loop; it leaves with ``os._exit`` whatever happens.
- The zygote exits when the server's end of its socket closes (the server stopped or died).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

# prctl(2): make this process the reaper of its orphaned descendants.
PR_SET_CHILD_SUBREAPER = 36
# Longest fork request or reply (a path and a pid).
MAX_PACKET = 64 * 1024
# A fork's reply waits for the zygote's imports (seconds on 2 cores; minutes on a loaded one).
FORK_TIMEOUT_S = 300.0


class ZygoteError(OSError):
    """The zygote could not fork a worker (it died, or refused): start a process instead."""


def make_subreaper() -> bool:
    """Make this process the child subreaper of its descendants; False where that is not
    available (not Linux, or prctl refused)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class ForkedProcess:
    """A worker forked by the zygote and re-parented to this process: what the server uses
    of :class:`subprocess.Popen` (``pid``, ``returncode``, ``poll``, ``wait``, ``kill``)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # not our child: it cannot be waited on
                    pid, status = self.pid, 255 << 8
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
                    self._close_pidfd()
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            pidfd = self._pidfd
            if pidfd is not None:
                with contextlib.suppress(OSError, ValueError):  # closed by another waiter
                    select.select([pidfd], [], [], left if left is not None else 1.0)
            else:
                time.sleep(0.02 if left is None else min(0.02, left))
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, 9)

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None


class Zygote:
    """The server's side: start the zygote, ask it for forks, stop it. ``env`` is the
    environment it and every worker it forks run with (a CPU worker's: ``worker_env``)."""

    def __init__(self, env: dict[str, str], log_path: Path):
        if not make_subreaper():
            raise ZygoteError("no child subreaper on this platform: workers are spawned")
        self.env = env
        self.log_path = Path(log_path)
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with open(self.log_path, "ab") as log_file:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "cortex_recipes.local.zygote", "--fd",
                     str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=env,
                )  # fmt: skip
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours
        self._sock.settimeout(FORK_TIMEOUT_S)
        log.info("worker zygote started (pid %d)", self.process.pid)

    def fork(self, log_path: Path) -> tuple[ForkedProcess, socket.socket]:
        """A new spare worker (its output to ``log_path``) and the server's end of its socket;
        blocks until the zygote has imported what workers need. :class:`ZygoteError` when the
        zygote cannot fork."""
        ours, theirs = socket.socketpair()
        try:
            request = json.dumps({"op": "fork", "log": str(Path(log_path).resolve())}).encode()
            with self._lock:
                try:
                    socket.send_fds(self._sock, [request], [theirs.fileno()])
                    raw = self._sock.recv(MAX_PACKET)
                except OSError as exc:
                    raise ZygoteError(f"the worker zygote did not answer ({exc})") from exc
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        if not raw:
            ours.close()
            raise ZygoteError(f"the worker zygote exited; see {self.log_path}")
        reply = json.loads(raw)
        if not isinstance(reply.get("pid"), int):
            ours.close()
            raise ZygoteError(f"the worker zygote could not fork: {reply.get('error')}")
        return ForkedProcess(reply["pid"]), ours

    def close(self) -> None:
        """Stop the zygote (the workers it forked are the server's and go on)."""
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()


# -- the zygote process ---------------------------------------------------------------------------


def _fork_worker(sock: socket.socket, log_path: str, worker_fd: int) -> int:
    """Fork, fork again and return the grandchild's pid once the child has exited (so the
    grandchild is the server's). The grandchild runs ``worker.run_forked_spare``."""
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.close(read_end)
            sock.close()
            grandchild = os.fork()
            if grandchild == 0:
                os.close(write_end)
                from cortex_recipes.local import worker

                worker.run_forked_spare(worker_fd, log_path)  # leaves with os._exit
                os._exit(1)
            os.write(write_end, str(grandchild).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        written = pipe.read()
    os.waitpid(child, 0)
    if not written:
        raise OSError("the intermediate fork failed")
    return int(written)


def serve_forks(sock: socket.socket) -> int:
    """Answer fork requests until the server closes its end."""
    while True:
        try:
            raw, fds, _, _ = socket.recv_fds(sock, MAX_PACKET, 1)
        except OSError:
            return 0
        if not raw:
            for fd in fds:
                os.close(fd)
            return 0
        try:
            request = json.loads(raw)
            if request.get("op") != "fork" or len(fds) != 1:
                raise ValueError(f"not a fork request with one socket: {request!r}")
            reply = {"pid": _fork_worker(sock, str(request["log"]), fds[0])}
        except (OSError, ValueError, KeyError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        try:
            sock.send(json.dumps(reply).encode())
        except OSError:
            return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cortex_recipes.local.zygote")
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    from cortex_recipes.local import worker  # torch, transformers: what every fork shares

    worker.warm_imports()
    if threading.active_count() != 1:  # a fork would copy one thread of several, mid-flight
        print(f"zygote: {threading.active_count()} threads after the imports", file=sys.stderr)
        return 1
    gc.freeze()  # the imported objects stay shared: no collection in a fork touches their pages
    return serve_forks(sock)


if __name__ == "__main__":
    from cortex_recipes.local.exits import exit_now

    exit_now(main())
