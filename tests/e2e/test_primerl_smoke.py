"""``python -m recipes.rl.async_grpo.smoke`` without prime-rl (CI, the image built without it):
the two adapters replay prime-rl's recorded rollout files on the local backend, say that the
orchestrator did not run, and give the same numbers twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cortex_recipes.primerl.launch import ENV_VAR
from tests import extras

pytestmark = [pytest.mark.e2e, extras.requires("grpo")]
ROOT = Path(__file__).resolve().parents[2]


def smoke(run_dir: Path) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    out = subprocess.run(
        [sys.executable, "-m", "recipes.rl.async_grpo.smoke", f"log_path={run_dir}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_the_smoke_without_prime_rl_replays_its_files_and_says_the_orchestrator_did_not_run(
    tmp_path,
):
    first, stderr = smoke(tmp_path / "a")
    assert first["mode"] == "adapters-replay"
    assert first["orchestrator"].startswith("not run: no prime-rl environment")
    assert f"${ENV_VAR} is not set" in stderr  # said on stderr too, not only in the JSON
    assert first["published_versions"] == [0, 1, 2, 3]
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["synced_versions"] == [1, 2, 3] and summary["probe_changed"] is True
    assert all(t > 0 for t in summary["trainable_tokens"])
    second, _ = smoke(tmp_path / "b")
    assert second["losses"] == first["losses"]  # deterministic on CPU
