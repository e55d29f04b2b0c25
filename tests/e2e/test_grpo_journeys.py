"""The synchronous Math GRPO example end to end: real SDK -> HTTP -> local backend
(tiny-qwen3) -> summaries.

The tiny model cannot learn arithmetic (its rewards stay 0); these tests pin the machinery:
checkpoints, resume, and determinism. Learning itself is qualified on SmolLM2
(recipes/rl/math_grpo/evidence/). The async journey runs on prime-rl's orchestrator:
tests/e2e/test_primerl_journey.py (where prime-rl is installed) and
tests/e2e/test_primerl_adapters.py (its two adapters, everywhere).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import extras

pytestmark = [pytest.mark.e2e, extras.requires("grpo")]

ROOT = Path(__file__).resolve().parents[2]
ASYNC_SMOKE = "recipes/rl/async_grpo/configs/local-cpu-tiny-qwen3-smoke.json"
SYNC_SMOKE = "recipes/rl/math_grpo/configs/local-cpu-tiny-qwen3-smoke.json"


def command(module: str, **overrides) -> list[str]:
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


def rollouts(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]


def test_math_grpo_smoke_runs_twice_with_identical_numbers(tmp_path):
    out = subprocess.run(
        command(
            "recipes.rl.math_grpo.train", profile=SYNC_SMOKE, log_path=tmp_path / "a", steps=2
        ),
        cwd=ROOT, check=True, capture_output=True, text=True,
    )  # fmt: skip
    first = json.loads((tmp_path / "a" / "summary.json").read_text())
    # The SDK's operation bodies (weight_sync) go to the run's debug log, not the console.
    assert "***** POST operation" not in out.stdout + out.stderr
    assert "***** POST operation" in (tmp_path / "a" / "debug.log").read_text()
    second = run("recipes.rl.math_grpo.train", profile=SYNC_SMOKE, log_path=tmp_path / "b", steps=2)
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
        "recipes.rl.math_grpo.train", profile=SYNC_SMOKE, log_path=tmp_path / "a", steps=3
    )  # the same command with more steps resumes after the last checkpoint
    assert extended["resumed_from_step"] == 2 and extended["steps"] == [1, 2, 3]
    assert extended["losses"][:2] == first["losses"]
