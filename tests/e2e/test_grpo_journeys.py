"""The GRPO journeys end to end: real SDK -> HTTP -> local backend (tiny-qwen3) -> summaries.

The tiny model cannot learn arithmetic (its rewards stay 0); these tests pin the machinery:
overlap, the lag bound, checkpoints, resume after SIGKILL, reconnect after a backend kill,
and determinism of the synchronous example. Learning itself is qualified on SmolLM2
(recipes/rl/async_grpo/evidence/).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cortex_recipes.run import CheckpointError, RunCheckpoints
from tests import extras

pytestmark = [pytest.mark.e2e, extras.requires("grpo")]

ROOT = Path(__file__).resolve().parents[2]
ASYNC_SMOKE = "recipes/rl/async_grpo/configs/local-cpu-tiny-qwen3-smoke.json"
SYNC_SMOKE = "recipes/rl/math_grpo/configs/local-cpu-tiny-qwen3-smoke.json"


def command(module: str, **overrides) -> list[str]:
    if module == "recipes.rl.async_grpo.train":
        # these tests pin the builtin scheduler; runner=auto would pick prime-rl where
        # $CORTEX_RECIPES_PRIMERL_PYTHON is set (tests/e2e/test_primerl_journey.py covers that)
        overrides.setdefault("runner", "builtin")
    return [sys.executable, "-m", module, *(f"{k}={v}" for k, v in overrides.items())]


def run(module: str, **overrides) -> dict:
    subprocess.run(command(module, **overrides), cwd=ROOT, check=True, capture_output=True)
    return json.loads((Path(overrides["log_path"]) / "summary.json").read_text())


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for_step(proc, run_dir: Path, step: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not any(m["step"] >= step for m in metrics(run_dir)):
        assert proc.poll() is None, f"training exited early: {proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, f"step {step} not reached"
        time.sleep(0.2)


def backend_pids(state_dir: Path) -> list[int]:
    out = subprocess.run(
        ["pgrep", "-f", f"cortex_recipes.local.server .*--state-dir {state_dir} "],
        capture_output=True,
        text=True,
    )
    return [int(p) for p in out.stdout.split()]


def test_async_smoke_overlaps_rollouts_with_training_within_the_lag_bound(tmp_path):
    summary = run("recipes.rl.async_grpo.train", profile=ASYNC_SMOKE, log_path=tmp_path)
    assert summary["steps"] == [1, 2, 3, 4]
    assert summary["overlap_fraction"] > 0.0
    assert summary["off_policy_max"] <= summary["max_async_level"] == 1
    records = metrics(tmp_path)
    for record in records:
        versions = record["rollout_policy_versions"]
        assert len(versions) == 2  # batch_size 8 / group_size 4
        assert all(0 <= record["step"] - 1 - v <= 1 for v in versions)
        assert record["policy_version"] == record["step"]
        assert record["off_policy/max"] == max(record["step"] - 1 - v for v in versions)
    assert any(r["off_policy/max"] == 1 for r in records), "sampling never ran ahead"
    assert [e["step"] for e in summary["eval_accuracy"]] == [0, 2, 4]
    assert RunCheckpoints(tmp_path / "checkpoints").steps() == [1, 2, 3, 4]
    written = rollouts(tmp_path)
    by_step = {r["step"]: r["policy_version"] for r in written if r["group"] == 0}
    assert sorted(by_step) == [1, 2, 3, 4]
    assert all(by_step[s] == records[s - 1]["rollout_policy_versions"][0] for s in by_step)


def test_async_run_resumes_after_sigkill_without_repeating_or_skipping_steps(tmp_path):
    cmd = command(
        "recipes.rl.async_grpo.train", profile=ASYNC_SMOKE, log_path=tmp_path, max_steps=5
    )
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for_step(proc, tmp_path, 2)
        servers = backend_pids((tmp_path / "backend").resolve())
        assert servers, "the local backend should be running"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in servers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in servers), "orphaned backend"
    killed_at = RunCheckpoints(tmp_path / "checkpoints").steps()[-1]
    assert killed_at >= 2

    summary = run(
        "recipes.rl.async_grpo.train", profile=ASYNC_SMOKE, log_path=tmp_path, max_steps=5
    )
    assert summary["resumed_from_step"] == killed_at
    assert [m["step"] for m in metrics(tmp_path)] == [1, 2, 3, 4, 5]
    assert summary["steps"] == [1, 2, 3, 4, 5]
    assert RunCheckpoints(tmp_path / "checkpoints").steps()[-1] == 5
    resumed = [m for m in metrics(tmp_path) if m["step"] > killed_at]
    assert all(min(m["rollout_policy_versions"]) >= killed_at for m in resumed)


def test_async_run_reconnects_after_the_backend_is_killed(tmp_path):
    cmd = command(
        "recipes.rl.async_grpo.train", profile=ASYNC_SMOKE, log_path=tmp_path, max_steps=5
    )
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for_step(proc, tmp_path, 2)
        for pid in backend_pids((tmp_path / "backend").resolve()):
            os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "reconnect 1/3" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["reconnects"] == 1 and summary["resumed_from_step"] >= 2
    assert [m["step"] for m in metrics(tmp_path)] == [1, 2, 3, 4, 5]


def test_resuming_with_a_changed_profile_is_refused(tmp_path):
    RunCheckpoints(tmp_path / "checkpoints").save(
        3, {"config_hash": "0000", "trainer": {"job_id": "job-x", "checkpoint_id": "cp_x"}}
    )
    from recipes.rl.async_grpo.train import Config, main

    with pytest.raises(CheckpointError, match="profile hash 0000"):
        main(Config(profile=ASYNC_SMOKE, log_path=str(tmp_path), runner="builtin"))
    with pytest.raises(CheckpointError, match="if_exists=resume"):
        main(
            Config(profile=ASYNC_SMOKE, log_path=str(tmp_path), if_exists="fail", runner="builtin")
        )
    assert RunCheckpoints(tmp_path / "checkpoints").steps() == [3]  # nothing saved was lost


def rollouts(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]


def test_math_grpo_smoke_runs_twice_with_identical_numbers(tmp_path):
    out = subprocess.run(
        command(
            "recipes.rl.math_grpo.train", profile=SYNC_SMOKE, log_path=tmp_path / "a", max_steps=2
        ),
        cwd=ROOT, check=True, capture_output=True, text=True,
    )  # fmt: skip
    first = json.loads((tmp_path / "a" / "summary.json").read_text())
    # The SDK's operation bodies (weight_sync) go to the run's debug log, not the console.
    assert "***** POST operation" not in out.stdout + out.stderr
    assert "***** POST operation" in (tmp_path / "a" / "debug.log").read_text()
    second = run(
        "recipes.rl.math_grpo.train", profile=SYNC_SMOKE, log_path=tmp_path / "b", max_steps=2
    )
    assert first["steps"] == [1, 2]
    for key in ("rewards", "losses", "eval_accuracy"):
        assert first[key] == second[key]
    a, b = metrics(tmp_path / "a"), metrics(tmp_path / "b")
    assert [m["rollouts/sha256"] for m in a] == [m["rollouts/sha256"] for m in b]
    assert a[0]["rollouts/sha256"] != a[1]["rollouts/sha256"]
    assert [m["mismatch_kl/mean"] for m in a] == [m["mismatch_kl/mean"] for m in b]
    assert all(m["policy_version"] == m["step"] for m in a)
    written = rollouts(tmp_path / "a")  # each step's first group (rollouts_rate=0)
    assert [(r["step"], r["group"]) for r in written] == [(1, 0)] * 4 + [(2, 0)] * 4
    assert all(r["policy_version"] == r["step"] - 1 for r in written)
    assert all(r["completion_ids"] and isinstance(r["reward"], float) for r in written)
    assert written == rollouts(tmp_path / "b")

    extended = run(
        "recipes.rl.math_grpo.train", profile=SYNC_SMOKE, log_path=tmp_path / "a", max_steps=3
    )  # the same command with more steps resumes after the last checkpoint
    assert extended["resumed_from_step"] == 2 and extended["steps"] == [1, 2, 3]
    assert extended["losses"][:2] == first["losses"]
