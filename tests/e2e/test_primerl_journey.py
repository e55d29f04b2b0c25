"""``python -m recipes.rl.async_grpo.train``: the journey on prime-rl's own orchestrator, end to end on the local backend. Runs only where a prime-rl environment exists
(``CORTEX_RECIPES_PRIMERL_PYTHON``; recipes/rl/async_grpo/primerl/install.sh builds one)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from cortex_recipes import profiles
from cortex_recipes.primerl import broadcasts, resume
from cortex_recipes.primerl.launch import ENV_VAR
from cortex_recipes.rl.grpo_profile import GRPOProfile
from recipes.rl.async_grpo import train
from tests import extras

pytestmark = [
    pytest.mark.e2e,
    extras.requires("grpo"),
    pytest.mark.skipif(
        not os.environ.get(ENV_VAR),
        reason=f"no prime-rl environment: set {ENV_VAR} to its python",
    ),
]
SMOKE = "recipes/rl/async_grpo/configs/local-cpu-tiny-qwen3-smoke.json"


def test_the_journey_trains_on_prime_rl_and_keeps_both_sides_metrics(tmp_path):
    config = profiles.entrypoint(
        train.Config,
        GRPOProfile,
        [f"profile={SMOKE}", "steps=2", f"log_path={tmp_path / 'run'}"],
    )
    out = train.main(config)
    assert out["orchestrator"] == "prime-rl"
    assert out["steps"] == [1, 2] and out["published_versions"] == [0, 1, 2]
    assert [e["step"] for e in out["eval_accuracy"]] == [0, 2]  # before and after training
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["samples"] == 8 for r in records)  # batch_size 8, nothing filtered
    assert any(k.startswith("primerl/") for k in records[-1]), records[-1]
    assert out["primerl_record_sources"] == {}  # every step's record is prime-rl's own line
    assert out["inference_counters"]["generate_requests"] >= 16
    orch = (tmp_path / "run" / "primerl" / "orch.toml").read_text()
    assert 'id = "cortex-arith"' in orch


def _steps(run_dir) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if x.strip()]


def test_a_sigkilled_journey_resumes_both_sides_and_logs_every_step_once(tmp_path):
    """SIGKILL the journey once step 2 is logged; the rerun resumes prime-rl's orchestrator
    from its checkpoint and the trainer adapter from the same published version, the new
    job's sampler gets exactly that version, and steps 1..4 are logged once each."""
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "recipes.rl.async_grpo.train",
        f"profile={SMOKE}", "steps=4", f"log_path={run_dir}",
    ]  # fmt: skip
    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 900
            while max(_steps(run_dir), default=0) < 2:
                assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "step 2 was never logged"
                time.sleep(0.5)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
    killed_after = max(_steps(run_dir))
    processes = json.loads((run_dir / "primerl" / "processes.json").read_text())["pids"]
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{p}/cmdline") and _running(p) for p in processes.values()):
        assert time.monotonic() < deadline, f"prime-rl processes outlived the journey: {processes}"
        time.sleep(0.2)
    points = sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").iterdir())
    assert points[0] == 0 and points[-1] >= 1, points

    # A copy whose orchestrator checkpoint of the resume point is gone is refused, naming it,
    # before prime-rl starts (the two sides could not resume together).
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    missing = resume.orchestrator_checkpoint(broken / "primerl" / "outputs", points[-1])
    missing.unlink()
    refused = subprocess.run(
        [*command[:-1], f"log_path={broken}"], capture_output=True, text=True, timeout=300
    )
    assert refused.returncode != 0 and f"{missing} does not exist" in refused.stderr
    assert (
        "Resuming orchestrator from checkpoint"
        not in (broken / "primerl" / "orchestrator.log").read_text()
    )  # ("Resuming dispatcher" is prime-rl's pause/resume, not a resume)

    second = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    resumed = summary["resumed_from_step"]
    assert resumed == points[-1] and 1 <= resumed <= killed_after
    assert _steps(run_dir) == [1, 2, 3, 4]  # once each, in order
    assert summary["steps"] == [1, 2, 3, 4] and summary["published_versions"] == [0, 1, 2, 3, 4]
    assert [e["step"] for e in summary["eval_accuracy"]] == [0, 4]
    outputs = run_dir / "primerl" / "outputs"
    orch_log = (run_dir / "primerl" / "orchestrator.log").read_text(errors="replace")
    assert f"Resuming orchestrator from checkpoint step {resumed}" in orch_log
    manifest = broadcasts.read_manifest(broadcasts.version_dir(outputs, resumed))
    assert f"resumed at version {resumed} from checkpoint {manifest['checkpoint_id']}" in (
        second.stderr
    )
    # The new job's sampler was synced to exactly that version, and the later versions are
    # the new job's own.
    new_job = broadcasts.read_manifest(broadcasts.version_dir(outputs, 4))["job_id"]
    assert new_job != manifest["job_id"]
    applied = json.loads((broadcasts.version_dir(outputs, resumed) / "APPLIED").read_text())
    assert applied["job_id"] == new_job and applied["checkpoint_id"] == manifest["checkpoint_id"]
    for version in range(resumed + 1, 5):
        later = broadcasts.read_manifest(broadcasts.version_dir(outputs, version))
        assert later["job_id"] == new_job
    trainer_steps = [
        json.loads(x)["step"]
        for x in (outputs / "cortex" / "trainer_metrics.jsonl").read_text().splitlines()
    ]
    assert trainer_steps == [1, 2, 3, 4]


def _backend_pids(state_dir) -> list[int]:
    out = subprocess.run(
        ["pgrep", "-f", f"cortex_recipes.local.server .*--state-dir {state_dir} "],
        capture_output=True, text=True,
    )  # fmt: skip
    return [int(p) for p in out.stdout.split()]


def test_a_killed_backend_is_reconnected_and_both_sides_resume_in_the_same_command(tmp_path):
    """SIGKILL the local backend once step 2 is logged: the journey reconnects (a new
    backend, a new job), resumes prime-rl's orchestrator and the trainer adapter from the newest
    resume point, and finishes with every step logged once."""
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "recipes.rl.async_grpo.train",
        f"profile={SMOKE}", "steps=4", f"log_path={run_dir}",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 900
        while max(_steps(run_dir), default=0) < 2:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "step 2 was never logged"
            time.sleep(0.5)
        servers = _backend_pids((run_dir / "backend").resolve())
        assert servers, "the local backend should be running"
        for pid in servers:
            os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    assert "reconnect 1/3" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reconnects"] == 1 and summary["resumed_from_step"] >= 2
    assert _steps(run_dir) == [1, 2, 3, 4]
    assert summary["published_versions"] == [0, 1, 2, 3, 4]


def test_resuming_with_a_changed_profile_is_refused_and_nothing_saved_is_lost(tmp_path):
    from cortex_recipes.run import CheckpointError, RunCheckpoints

    RunCheckpoints(tmp_path / "checkpoints").save(
        3, {"config_hash": "0000", "runner": "prime-rl",
            "trainer": {"job_id": "job-x", "checkpoint_id": "cp_x"}},
    )  # fmt: skip
    with pytest.raises(CheckpointError, match="profile hash 0000"):
        train.main(train.Config(profile=SMOKE, log_path=str(tmp_path)))
    with pytest.raises(CheckpointError, match="if_exists=resume"):
        train.main(train.Config(profile=SMOKE, log_path=str(tmp_path), if_exists="fail"))
    assert RunCheckpoints(tmp_path / "checkpoints").steps() == [3]


def _running(pid: int) -> bool:
    try:
        return "State:\tZ" not in open(f"/proc/{pid}/status").read()
    except OSError:
        return False
