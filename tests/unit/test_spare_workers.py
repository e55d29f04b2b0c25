"""The spare worker pool's bookkeeping and the bytecode hint (the spare's real start-up, its
results and its log are covered end to end in tests/e2e/test_spare_worker.py)."""

from __future__ import annotations

import logging
import py_compile
import socket
import subprocess
import sys
import time
from importlib.util import cache_from_source

import pytest

from cortex_recipes.local import worker_spawn
from cortex_recipes.local.worker_spawn import SparePool, bytecode_hint, worker_env


def sleeper(log_path) -> tuple[subprocess.Popen, socket.socket]:
    """A process that only waits for its socket to close, as a spare does, and the server's
    end of that socket."""
    parent, child = socket.socketpair()
    wait = "import socket, sys; socket.socket(fileno=int(sys.argv[1])).recv(1)"
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-c", wait, str(child.fileno())],
            pass_fds=(child.fileno(),),
            stdout=log_file,
        )
    child.close()
    return process, parent


@pytest.fixture
def sleeping_spares(monkeypatch):
    """spawn_worker replaced by :func:`sleeper`: the pool's logic without torch."""
    started: list[dict] = []

    def spawn(env, log_path, spec_path):
        assert spec_path is None  # the pool only starts spares
        started.append(env)
        return sleeper(log_path)

    monkeypatch.setattr(worker_spawn, "spawn_worker", spawn)
    return started


def test_a_spare_is_taken_only_by_a_worker_with_its_exact_environment(tmp_path, sleeping_spares):
    pool = SparePool(tmp_path)
    cpu, gpu0 = worker_env(""), worker_env("0")
    pool.replenish(cpu)
    pool.replenish(cpu)  # one is enough
    assert len(sleeping_spares) == 1
    assert pool.take(gpu0) is None
    spare = pool.take(cpu)
    assert spare is not None and spare.process.poll() is None
    assert pool.take(cpu) is None  # taken: the caller owns it now
    spare.process.kill()
    spare.process.wait()
    pool.close()


def test_replenishing_for_other_devices_stops_the_old_spare(tmp_path, sleeping_spares):
    pool = SparePool(tmp_path)
    pool.replenish(worker_env(""))
    old = pool._spares[0]
    pool.replenish(worker_env("1"))
    assert old.process.poll() is not None  # stopped and reaped
    assert pool.take(worker_env("1")) is not None or pytest.fail("no spare for the new devices")
    pool.close()


def test_a_dead_spare_is_not_handed_out_and_its_death_is_logged(tmp_path, sleeping_spares, caplog):
    pool = SparePool(tmp_path)
    env = worker_env("")
    pool.replenish(env)
    pool._spares[0].process.kill()
    pool._spares[0].process.wait()
    with caplog.at_level(logging.WARNING, logger="cortex_recipes.local.worker_spawn"):
        assert pool.take(env) is None
    assert "the spare worker was killed by SIGKILL" in caplog.text
    pool.close()


def test_close_stops_the_spare_and_no_new_one_starts(tmp_path, sleeping_spares):
    pool = SparePool(tmp_path)
    pool.replenish(worker_env(""))
    process = pool._spares[0].process
    pool.close()
    deadline = time.monotonic() + 15
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is not None
    pool.replenish(worker_env(""))
    assert len(sleeping_spares) == 1


def test_a_disabled_pool_starts_nothing(tmp_path, sleeping_spares):
    pool = SparePool(tmp_path, enabled=False)
    pool.replenish(worker_env(""))
    assert sleeping_spares == [] and pool.take(worker_env("")) is None


def test_a_deferred_spare_waits_until_the_backend_has_been_quiet(tmp_path, sleeping_spares):
    busy = {"now": True}
    pool = SparePool(tmp_path, quiet=lambda: not busy["now"], quiet_s=0.3)
    env = worker_env("")
    pool.replenish(env, defer=True)
    time.sleep(0.8)
    assert sleeping_spares == []  # a step (or a loading worker) is running: no spare yet
    busy["now"] = False
    started = time.monotonic()
    deadline = started + 10
    while not sleeping_spares and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sleeping_spares == [env]
    assert time.monotonic() - started >= 0.3  # only after the quiet spell
    assert pool.take(env) is not None
    pool.close()


def test_a_deferred_spare_is_not_started_after_close(tmp_path, sleeping_spares):
    pool = SparePool(tmp_path, quiet=lambda: True, quiet_s=0.5)
    pool.replenish(worker_env(""), defer=True)
    pool.close()
    time.sleep(0.9)
    assert sleeping_spares == []


def test_a_spare_without_a_quiet_predicate_starts_at_once(tmp_path, sleeping_spares):
    pool = SparePool(tmp_path)
    pool.replenish(worker_env(""), defer=True)  # nothing to wait for: as before
    assert len(sleeping_spares) == 1
    pool.close()


def test_early_spares_start_only_where_every_sub_job_runs_on_the_cpu(
    tmp_path, sleeping_spares, monkeypatch
):
    env = worker_env("")
    monkeypatch.setattr(worker_spawn, "nvidia_device_nodes", lambda: [tmp_path / "nvidia0"])
    assert worker_spawn.early_spares(tmp_path, "auto", env) == []  # CUDA may be there
    assert sleeping_spares == []
    cpu_mode = worker_spawn.early_spares(tmp_path / "cpu", "cpu", env)
    assert len(cpu_mode) == worker_spawn.EARLY_SPARES == 2
    monkeypatch.setattr(worker_spawn, "nvidia_device_nodes", lambda: [])
    no_gpu = worker_spawn.early_spares(tmp_path / "auto", "auto", env)
    assert len(no_gpu) == 2
    monkeypatch.setenv(worker_spawn.SPARE_ENV, "0")
    assert worker_spawn.early_spares(tmp_path / "off", "cpu", env) == []
    pool = SparePool(tmp_path / "pool")
    pool.adopt(cpu_mode + no_gpu)
    taken = [pool.take(env) for _ in range(5)]
    assert [t is not None for t in taken] == [True] * 4 + [False]
    for spare in taken[:4]:
        spare.process.kill()
        spare.process.wait()
    pool.close()


def test_spares_adopted_by_a_closed_pool_are_stopped(tmp_path, sleeping_spares):
    spares = worker_spawn.early_spares(tmp_path, "cpu", worker_env(""))
    pool = SparePool(tmp_path)
    pool.close()
    pool.adopt(spares)
    assert all(s.process.poll() is not None for s in spares)
    assert pool.take(worker_env("")) is None


def test_worker_env_is_offline_and_sees_only_its_devices(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4")
    env = worker_env("4")
    assert env["HF_HUB_OFFLINE"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "4"


def test_bytecode_hint_names_the_cause_only_when_bytecode_is_missing_and_cannot_be_written(
    tmp_path,
):
    source = tmp_path / "pkg" / "__init__.py"
    source.parent.mkdir()
    source.write_text("x = 1\n")
    hint = bytecode_hint(str(source), dont_write=True)
    assert hint is not None
    assert "PYTHONDONTWRITEBYTECODE is set" in hint and "UV_COMPILE_BYTECODE=1" in hint
    assert bytecode_hint(str(source), dont_write=False) is None  # the first import writes it
    py_compile.compile(str(source), cfile=cache_from_source(str(source)))
    assert bytecode_hint(str(source), dont_write=True) is None
