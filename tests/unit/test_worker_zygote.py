"""The spare pool's use of a worker zygote (a stand-in zygote whose "forks" are sleeping
processes: the pool's bookkeeping without torch), and ForkedProcess's Popen-like waiting. The
real zygote, its forks' results and their deaths are covered end to end in
tests/e2e/test_spare_worker.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from cortex_recipes.local import worker_spawn
from cortex_recipes.local.worker_spawn import SparePool, worker_env
from cortex_recipes.local.zygote import ForkedProcess, ZygoteError

from .test_spare_workers import sleeper


class StandInZygote:
    """Zygote's interface: ``env``, ``fork(log_path)`` (after ``ready`` is set, as the real one
    answers once its imports are done), ``close``."""

    def __init__(self, env, *, fail: bool = False):
        self.env = env
        self.fail = fail
        self.ready = threading.Event()
        self.forks: list[str] = []
        self.closed = False

    def fork(self, log_path):
        assert self.ready.wait(10)
        if self.fail or self.closed:
            raise ZygoteError("the worker zygote exited; see zygote.log")
        self.forks.append(log_path.name)
        return sleeper(log_path)

    def close(self):
        self.closed = True


@pytest.fixture
def spawned(monkeypatch):
    """spawn_worker replaced by the sleeper (the fallback when the zygote fails)."""
    started: list[dict] = []

    def spawn(env, log_path, spec_path):
        started.append(env)
        return sleeper(log_path)

    monkeypatch.setattr(worker_spawn, "spawn_worker", spawn)
    return started


def stop_all(spares):
    for spare in spares:
        spare.process.kill()
        spare.process.wait()


def test_the_zygote_forks_the_early_spares_and_a_take_waits_for_a_fork_in_flight(tmp_path, spawned):
    env = worker_env("")
    zygote = StandInZygote(env)
    pool = SparePool(tmp_path, quiet=lambda: False)  # never quiet: forks need no quiet
    pool.use_zygote(zygote, count=2)
    threading.Timer(0.4, zygote.ready.set).start()  # its imports finish later
    started = time.monotonic()
    first = pool.take(env)  # waits for the fork rather than starting a process
    assert first is not None and time.monotonic() - started >= 0.3
    second = pool.take(env)
    assert second is not None
    assert spawned == []
    assert zygote.forks == ["spare-0.log", "spare-1.log"]
    # a replacement is forked at once, busy or not
    pool.replenish(env, defer=True)
    third = pool.take(env)
    assert third is not None and len(zygote.forks) == 3
    assert pool.take(worker_env("0")) is None  # another environment: not the zygote's
    stop_all([first, second, third])
    pool.close()
    assert zygote.closed


def test_a_zygote_that_fails_is_dropped_and_spares_start_as_processes(tmp_path, spawned, caplog):
    env = worker_env("")
    zygote = StandInZygote(env, fail=True)
    zygote.ready.set()
    pool = SparePool(tmp_path)
    with caplog.at_level("WARNING", logger="cortex_recipes.local.worker_spawn"):
        pool.use_zygote(zygote, count=1)
        spare = pool.take(env)
    assert spare is not None and spawned == [env]
    assert zygote.closed and "the worker zygote failed" in caplog.text
    pool.replenish(env)  # no zygote any more: an ordinary spare
    assert len(spawned) == 2
    stop_all([spare])
    pool.close()


def test_a_closed_pool_forks_nothing_more_and_stops_what_arrives(tmp_path, spawned):
    env = worker_env("")
    zygote = StandInZygote(env)
    pool = SparePool(tmp_path)
    pool.use_zygote(zygote, count=2)
    pool.close()
    zygote.ready.set()
    time.sleep(0.3)
    assert pool.take(env) is None and zygote.closed
    closed_pool = SparePool(tmp_path / "closed")
    closed_pool.close()
    late = StandInZygote(env)
    closed_pool.use_zygote(late)
    assert late.closed and late.forks == []


def test_early_workers_start_the_zygote_only_where_it_may(tmp_path, spawned, monkeypatch):
    started = []

    class Recording:
        def __init__(self, env, log_path):
            started.append(log_path.name)
            self.env = env

    monkeypatch.setattr(worker_spawn, "Zygote", Recording)
    monkeypatch.setattr(worker_spawn, "nvidia_device_nodes", lambda: [tmp_path / "nvidia0"])
    env = worker_env("")
    assert worker_spawn.early_workers(tmp_path, "auto", env) == (None, [])  # CUDA may be there
    zygote, early = worker_spawn.early_workers(tmp_path, "cpu", env)
    assert isinstance(zygote, Recording) and early == [] and started == ["zygote.log"]
    monkeypatch.setenv(worker_spawn.ZYGOTE_ENV, "0")
    zygote, early = worker_spawn.early_workers(tmp_path / "spawned", "cpu", env)
    assert zygote is None and len(early) == worker_spawn.EARLY_SPARES
    stop_all(early)

    def refuse(env, log_path):
        raise ZygoteError("no child subreaper on this platform: workers are spawned")

    monkeypatch.delenv(worker_spawn.ZYGOTE_ENV)
    monkeypatch.setattr(worker_spawn, "Zygote", refuse)
    zygote, early = worker_spawn.early_workers(tmp_path / "refused", "cpu", env)
    assert zygote is None and len(early) == worker_spawn.EARLY_SPARES
    stop_all(early)
    monkeypatch.setenv(worker_spawn.SPARE_ENV, "0")
    assert worker_spawn.early_workers(tmp_path / "off", "cpu", env) == (None, [])


def spawn_raw(code: str) -> int:
    """A child process by pid only (nothing else waits on it)."""
    return os.posix_spawn(sys.executable, [sys.executable, "-c", code], dict(os.environ))


def test_forked_process_waits_polls_and_kills_like_popen():
    done = ForkedProcess(spawn_raw("import sys; sys.exit(3)"))
    assert done.wait(timeout=30) == 3 and done.poll() == 3
    running = ForkedProcess(spawn_raw("import time; time.sleep(60)"))
    assert running.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        running.wait(timeout=0.2)
    waiters = [threading.Thread(target=running.wait) for _ in range(2)]
    for waiter in waiters:
        waiter.start()
    running.kill()
    for waiter in waiters:
        waiter.join(10)
        assert not waiter.is_alive()
    assert running.returncode == -signal.SIGKILL
    running.kill()  # already reaped: nothing to do
    assert worker_spawn.describe_exit(running.returncode) == "was killed by SIGKILL"
