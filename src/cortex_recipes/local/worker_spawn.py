"""Starting and stopping worker processes: their environment (only their own GPU visible,
bytecode kept), ``python -m cortex_recipes.local.worker`` over an inherited socket, a stop that
becomes a kill after :data:`STOP_TIMEOUT_S`, and the pre-started spare (:class:`SparePool`)
that the next sub-job's worker takes over instead of starting cold.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# How long a stopping worker gets to exit on its own before it is killed.
STOP_TIMEOUT_S = 10.0


def bytecode_hint(source: str | None = None, dont_write: bool | None = None) -> str | None:
    """Why each worker will compile Python sources at start-up, and the fix, or None.
    ``source`` is transformers' ``__init__.py`` (found, not imported, by default).

    Python reads ``.pyc`` files whatever ``PYTHONDONTWRITEBYTECODE`` says; it only cannot write
    them then (nor into a venv the user cannot write). Without them every worker process
    compiles torch's and transformers' sources again: about 5 s of each start-up on 2 cores.
    """
    import importlib.util

    if source is None:
        found = importlib.util.find_spec("transformers")  # located, not imported
        source = found.origin if found else None
    if dont_write is None:
        dont_write = bool(sys.flags.dont_write_bytecode)
    cached = importlib.util.cache_from_source(source) if source else None
    if cached is None or Path(cached).is_file():
        return None
    if dont_write:
        why = "PYTHONDONTWRITEBYTECODE is set"
    elif not os.access(Path(cached).parent.parent, os.W_OK):
        why = f"{Path(cached).parent.parent} is not writable"
    else:
        return None  # the first import writes them
    return (
        f"transformers has no compiled bytecode and {why}: every worker compiles torch's and "
        "transformers' sources at start-up (seconds per sub-job). Compile it once: "
        "`UV_COMPILE_BYTECODE=1 uv sync --frozen ...` (or `python -m compileall -q <venv>`)"
    )


def worker_env(visible: str) -> dict[str, str]:
    """A worker process's environment: the server's, offline, seeing only ``visible`` GPUs."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["CUDA_VISIBLE_DEVICES"] = visible
    return env


def spawn_worker(
    env: dict[str, str], log_path: Path, spec_path: Path | None
) -> tuple[subprocess.Popen, socket.socket]:
    """Start ``python -m cortex_recipes.local.worker`` (a spare when ``spec_path`` is None) and
    return the process and the server's end of its socket."""
    parent_sock, child_sock = socket.socketpair()
    command = [
        sys.executable,
        "-m",
        "cortex_recipes.local.worker",
        "--fd",
        str(child_sock.fileno()),
    ]
    if spec_path is not None:
        command += ["--spec", str(spec_path)]
    try:
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(
                command,
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                env=env,
            )
    except BaseException:
        parent_sock.close()
        raise
    finally:
        child_sock.close()
    return process, parent_sock


@dataclass
class Spare:
    process: subprocess.Popen
    sock: socket.socket
    env: dict[str, str]
    log_path: Path


def stop_process(
    process: subprocess.Popen, sock: socket.socket, timeout: float = STOP_TIMEOUT_S
) -> None:
    """Close a worker's socket (it exits when its server goes) and wait for it; kill it when it
    does not exit within ``timeout``."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class SparePool:
    """At most one pre-started worker process, waiting for a sub-job.

    A spare imports torch, transformers and the model classes (``worker.WARM_MODULES``) while
    nothing needs it, so the sub-job that takes it only loads its weights: about 3.5 s less of
    each sub-job's start on 2 CPU cores. It is started with a worker's environment (the GPUs it
    would see, ``CUDA_VISIBLE_DEVICES``, among it), and only a sub-job whose worker would get
    exactly that environment takes it, so a worker is the same either way. After each take, or
    a start that found no such spare, a new one is started with the environment just used. A spare that
    died is discarded (its sub-job starts a process of its own). ``close`` stops the spare; a
    spare whose server is gone sees its socket close and exits.
    """

    def __init__(self, log_dir: Path, *, enabled: bool = True):
        self.log_dir = Path(log_dir)
        self.enabled = enabled
        self._spare: Spare | None = None
        self._count = itertools.count()
        self._closed = False
        self._lock = threading.Lock()

    def replenish(self, env: dict[str, str]) -> None:
        """Have a spare with environment ``env`` ready (replacing one with another)."""
        with self._lock:
            if not self.enabled or self._closed:
                return
            current = self._spare
            if current is not None and current.env == env and current.process.poll() is None:
                return
            self._spare = None
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.log_dir / f"spare-{next(self._count)}.log"
            try:
                process, sock = spawn_worker(env, log_path, None)
            except OSError as exc:
                log.warning("no spare worker (%s); sub-jobs start their own processes", exc)
                self.enabled = False
                process = None
            if process is not None:
                self._spare = Spare(process, sock, env, log_path)
        if current is not None and current is not self._spare:
            self.stop(current)

    def take(self, env: dict[str, str]) -> Spare | None:
        """The spare, if one is alive with environment ``env`` (the caller now owns its process)."""
        with self._lock:
            spare = self._spare
            if spare is None or spare.env != env:
                return None
            self._spare = None
        if spare.process.poll() is not None:
            log.warning(
                "the spare worker %s; see %s",
                describe_exit(spare.process.returncode),
                spare.log_path,
            )
            spare.sock.close()
            return None
        with contextlib.suppress(OSError):
            if spare.log_path.stat().st_size == 0:
                spare.log_path.unlink()
        return spare

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spare, self._spare = self._spare, None
        if spare is not None:
            self.stop(spare)

    @staticmethod
    def stop(spare: Spare) -> None:
        stop_process(spare.process, spare.sock)


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
