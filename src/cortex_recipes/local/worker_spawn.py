"""Starting and stopping worker processes: their environment (only their own GPU visible,
bytecode kept), ``python -m cortex_recipes.local.worker`` over an inherited socket, a stop that
becomes a kill after :data:`STOP_TIMEOUT_S`, and the pre-started spare (:class:`SparePool`)
that the next sub-job's worker takes over instead of starting cold, forked from the worker
zygote (:mod:`cortex_recipes.local.zygote`) where the server has one.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cortex_recipes.local.zygote import Zygote, ZygoteError

log = logging.getLogger(__name__)

# How long a stopping worker gets to exit on its own before it is killed.
STOP_TIMEOUT_S = 10.0
# A replacement spare starts once the backend has been quiet (no worker starting, no command
# in flight) this long, looking every SPARE_QUIET_POLL_S (SparePool).
SPARE_QUIET_S = 1.0
SPARE_QUIET_POLL_S = 0.2
# "0" turns the pre-started spare workers off (SparePool).
SPARE_ENV = "CORTEX_RECIPES_SPARE_WORKER"
# Spares a CPU-only server starts before importing torch: a trainer and a sampler (early_spares).
EARLY_SPARES = 2
# "0" starts CPU spares as processes of their own instead of forking them from a zygote.
ZYGOTE_ENV = "CORTEX_RECIPES_WORKER_ZYGOTE"
# How long a sub-job waits for the spare the zygote is forking before starting its own process.
FORK_WAIT_S = 120.0


def spares_enabled() -> bool:
    return os.environ.get(SPARE_ENV, "1") != "0"


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
    """Pre-started worker processes, waiting for sub-jobs.

    A spare imports torch, transformers and the model classes (``worker.WARM_MODULES``) while
    nothing needs it, so the sub-job that takes it only loads its weights: about 3.5 s less of
    each sub-job's start on 2 CPU cores. It is started with a worker's environment (the GPUs it
    would see, ``CUDA_VISIBLE_DEVICES``, among it), and only a sub-job whose worker would get
    exactly that environment takes it, so a worker is the same either way. After each take, or
    a start that found no such spare, one is started with the environment just used if none is
    left for it (spares for another environment are stopped). A spare that died is discarded
    (its sub-job starts a process of its own). ``close`` stops the spares; a spare whose server
    is gone sees its socket close and exits.

    With ``quiet`` (the registry's "no worker is starting and none has a command"), a
    replacement (:meth:`replenish` with ``defer=True``) waits until ``quiet()`` has held for
    :data:`SPARE_QUIET_S`: a spare importing torch beside a running step or a loading model
    takes the cores they are using (on 2 cores it made an SFT run's first step 2.5 times its
    median), and the job that took the spare has its workers already.

    With a zygote (:meth:`use_zygote`: a CPU-only server's, :func:`early_workers`), spares for
    its environment are forked from it instead, at once and in the background (a fork imports
    nothing, so it waits for no quiet spell), and a sub-job that finds none waits for a fork in
    flight rather than starting a process that would import everything again. A zygote that
    fails is dropped and spares start as processes from then on.
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        enabled: bool = True,
        quiet: Callable[[], bool] | None = None,
        quiet_s: float = SPARE_QUIET_S,
    ):
        self.log_dir = Path(log_dir)
        self.enabled = enabled
        self._spares: list[Spare] = []
        self._count = itertools.count()
        self._closed = False
        self._lock = threading.Lock()
        self._quiet, self._quiet_s = quiet, quiet_s
        self._deferred: dict[str, str] | None = None
        self._wake = threading.Event()
        self._watcher: threading.Thread | None = None
        self._zygote: Zygote | None = None
        self._forks_pending = 0  # forks asked of the zygote and not yet answered
        self._forked = threading.Condition(self._lock)
        self._fork_queue: queue.Queue = queue.Queue()

    def replenish(self, env: dict[str, str], *, defer: bool = False) -> None:
        """Have a spare with environment ``env`` ready (stopping those for another); with
        ``defer`` (and a ``quiet`` predicate), once the backend has been quiet for a while. Where
        the zygote serves ``env`` it is forked at once (a fork takes no core from anyone)."""
        if self._zygote is not None and env == self._zygote.env:
            self._request_forks(env, 1)
            return
        if defer and self._quiet is not None:
            with self._lock:
                if not self.enabled or self._closed:
                    return
                self._deferred = env
                if self._watcher is None:
                    self._watcher = threading.Thread(
                        target=self._watch, name="spare-when-quiet", daemon=True
                    )
                    self._watcher.start()
            self._wake.set()
            return
        with self._lock:
            if not self.enabled or self._closed:
                return
            self._deferred = None
            others = [s for s in self._spares if s.env != env]
            self._spares = [s for s in self._spares if s.env == env and s.process.poll() is None]
            if not self._spares:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                log_path = self.log_dir / f"spare-{next(self._count)}.log"
                try:
                    process, sock = spawn_worker(env, log_path, None)
                except OSError as exc:
                    log.warning("no spare worker (%s); sub-jobs start their own processes", exc)
                    self.enabled = False
                else:
                    self._spares.append(Spare(process, sock, env, log_path))
        for other in others:
            self.stop(other)

    def adopt(self, spares: list[Spare]) -> None:
        """Hold ``spares`` (started before the pool existed: :func:`early_spares`)."""
        with self._lock:
            closed = self._closed or not self.enabled
            if not closed:
                self._spares.extend(spares)
        for spare in spares if closed else ():
            self.stop(spare)

    def take(self, env: dict[str, str]) -> Spare | None:
        """A spare alive with environment ``env``, if there is one (the caller now owns its
        process)."""
        while True:
            with self._lock:
                spare = self._next_spare(env)
                if spare is None:
                    return None
                self._spares.remove(spare)
            if spare.process.poll() is None:
                break
            log.warning(
                "the spare worker %s; see %s",
                describe_exit(spare.process.returncode),
                spare.log_path,
            )
            spare.sock.close()
        with contextlib.suppress(OSError):
            if spare.log_path.stat().st_size == 0:
                spare.log_path.unlink()
        return spare

    def _next_spare(self, env: dict[str, str]) -> Spare | None:
        """The first spare for ``env``, waiting for one the zygote is forking (it answers once
        its imports are done: starting a process instead would import them all again). Called
        with the lock held."""
        deadline = time.monotonic() + FORK_WAIT_S
        while True:
            spare = next((s for s in self._spares if s.env == env), None)
            zygote = self._zygote
            if spare is not None or zygote is None or env != zygote.env:
                return spare
            if self._forks_pending == 0 or self._closed or time.monotonic() >= deadline:
                return None
            self._forked.wait(timeout=0.5)

    # -- the zygote ---------------------------------------------------------------------------

    def use_zygote(self, zygote: Zygote, count: int = EARLY_SPARES) -> None:
        """Fork this pool's spares for ``zygote.env`` from ``zygote`` from now on, ``count``
        of them at once (in the background: the first answer waits for its imports)."""
        with self._lock:
            closed = self._closed or not self.enabled
            if not closed:
                self._zygote = zygote
                threading.Thread(target=self._fork_loop, name="spare-forks", daemon=True).start()
        if closed:
            zygote.close()
            return
        self._request_forks(zygote.env, count)

    def _request_forks(self, env: dict[str, str], count: int) -> None:
        """Have ``count`` spares for ``env`` ready or being forked."""
        with self._lock:
            if not self.enabled or self._closed:
                return
            self._deferred = None
            have = sum(1 for s in self._spares if s.env == env) + self._forks_pending
            for _ in range(max(0, count - have)):
                self._forks_pending += 1
                self._fork_queue.put(env)

    def _fork_loop(self) -> None:
        """Answer fork requests one at a time: the zygote's fork, or where it failed a
        process started the ordinary way (and no zygote from then on)."""
        while True:
            env = self._fork_queue.get()
            if env is None:
                return
            spare = None
            try:
                with self._lock:
                    zygote = None if self._closed else self._zygote
                if zygote is not None:
                    self.log_dir.mkdir(parents=True, exist_ok=True)
                    log_path = self.log_dir / f"spare-{next(self._count)}.log"
                    try:
                        process, sock = zygote.fork(log_path)
                    except OSError as exc:
                        log.warning("the worker zygote failed (%s); spares start as processes", exc)
                        self._drop_zygote()
                        try:
                            process, sock = spawn_worker(env, log_path, None)
                        except OSError as spawn_exc:
                            log.warning("no spare worker (%s)", spawn_exc)
                            process = None
                    if process is not None:
                        spare = Spare(process, sock, env, log_path)
            finally:
                with self._lock:
                    self._forks_pending -= 1
                    keep = spare is not None and not self._closed
                    if keep:
                        self._spares.append(spare)
                    self._forked.notify_all()
                if spare is not None and not keep:
                    self.stop(spare)

    def _drop_zygote(self) -> None:
        with self._lock:
            zygote, self._zygote = self._zygote, None
        if zygote is not None:
            zygote.close()

    def _watch(self) -> None:
        """Start the deferred spare once ``quiet()`` has held for ``quiet_s`` seconds."""
        quiet_since: float | None = None
        while True:
            with self._lock:
                if self._closed:
                    return
                env = self._deferred
            if env is None:
                quiet_since = None
                self._wake.wait()
                self._wake.clear()
                continue
            now = time.monotonic()
            if not self._quiet():
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= self._quiet_s:
                with self._lock:
                    wanted = self._deferred is env and not self._closed
                if wanted:
                    self.replenish(env)
                continue
            time.sleep(SPARE_QUIET_POLL_S)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._deferred = None
            spares, self._spares = self._spares, []
            self._forked.notify_all()
        self._wake.set()
        self._fork_queue.put(None)
        self._drop_zygote()
        for spare in spares:
            self.stop(spare)

    @staticmethod
    def stop(spare: Spare) -> None:
        """Kill an untaken spare: it holds nothing, and one still importing torch would only
        see its socket close once its imports are done (a server's stop waited 5.7 s for one)."""
        with contextlib.suppress(OSError):
            spare.sock.close()
        with contextlib.suppress(ProcessLookupError):
            spare.process.kill()
        spare.process.wait()


def nvidia_device_nodes() -> list[Path]:
    """``/dev/nvidia*``: without any, this machine has no CUDA device (known without torch)."""
    return sorted(Path("/dev").glob("nvidia*"))


def early_spares(log_dir: Path, device_mode: str, cpu_env: dict[str, str]) -> list[Spare]:
    """:data:`EARLY_SPARES` spares started by the server before it imports torch (about 2 s),
    for :meth:`SparePool.adopt`, so that a journey's trainer and sampler both find one: only
    where every sub-job certainly runs on the CPU (device mode ``cpu``, or no NVIDIA device node
    on this machine), with the CPU workers' ``cpu_env``; else none (the pool starts one once
    the server knows what CUDA it sees)."""
    if not spares_enabled():
        return []
    if device_mode != "cpu" and nvidia_device_nodes():
        return []
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    spares = []
    for i in range(EARLY_SPARES):
        log_path = log_dir / f"spare-early-{i}.log"
        try:
            process, sock = spawn_worker(cpu_env, log_path, None)
        except OSError as exc:
            log.warning("no early spare worker (%s)", exc)
            break
        spares.append(Spare(process, sock, cpu_env, log_path))
    return spares


def zygote_enabled() -> bool:
    return os.environ.get(ZYGOTE_ENV, "1") != "0"


def early_workers(
    log_dir: Path, device_mode: str, cpu_env: dict[str, str]
) -> tuple[Zygote | None, list[Spare]]:
    """What a server starts before importing torch, where every sub-job certainly runs on the
    CPU (as :func:`early_spares`): the worker zygote (:mod:`cortex_recipes.local.zygote`), which
    imports once and forks the spares (:meth:`SparePool.use_zygote`), or where it cannot start
    (not Linux, ``$CORTEX_RECIPES_WORKER_ZYGOTE=0``) the :func:`early_spares` themselves."""
    if not spares_enabled() or (device_mode != "cpu" and nvidia_device_nodes()):
        return None, []
    if zygote_enabled():
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        try:
            return Zygote(cpu_env, log_dir / "zygote.log"), []
        except (OSError, ZygoteError) as exc:
            log.info("no worker zygote (%s): spares start as processes", exc)
    return None, early_spares(log_dir, device_mode, cpu_env)


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
