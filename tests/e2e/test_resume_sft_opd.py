"""SFT and OPD runs killed mid-run resume with the same command and end where an uninterrupted
run ends: same steps once each, same losses (both runs are seeded)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cortex_recipes.run import RunCheckpoints
from tests import extras
from tests.e2e.test_grpo_journeys import ROOT, command, metrics, run

pytestmark = [pytest.mark.e2e, extras.requires("opd")]

JOURNEYS = {  # module, steps, overrides (the default profiles run SmolLM2: kept short)
    "sft": (
        "recipes.sft.conversational.train",
        3,
        {"profile": "recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json"},
    ),
    "opd": (  # the task-reward path: a teacher the SFT journey taught, groups, a reward
        "recipes.distillation.on_policy.train",
        2,
        {"profile": "recipes/distillation/on_policy/configs/local-cpu-tiny-qwen3-task-smoke.json"},
    ),
}


def wait_for_checkpoint(proc, run_dir, step: int, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while step not in RunCheckpoints(run_dir / "checkpoints").steps():
        assert proc.poll() is None, "training exited early: " + (
            proc.stdout.read()[-3000:] if proc.stdout else "(its output is in a file)"
        )
        assert time.monotonic() < deadline, f"no checkpoint for step {step}"
        time.sleep(0.2)


@pytest.mark.parametrize("journey", sorted(JOURNEYS))
def test_a_killed_run_resumes_and_matches_an_uninterrupted_one(journey, tmp_path):
    module, steps, overrides = JOURNEYS[journey]
    args = {"steps": steps, "ckpt_interval": 1, **overrides}
    if journey == "opd":  # one SFT teacher run: trained by the first run, reused by the others
        args["teacher_run"] = tmp_path / "teacher"
    whole = run(module, log_path=tmp_path / "whole", **args)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        command(module, log_path=killed, **args),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for_checkpoint(proc, killed, 1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    resumed = run(module, log_path=killed, **args)  # the same command: if_exists=resume

    assert resumed["resumed_from_step"] >= 1
    assert [m["step"] for m in metrics(killed)] == list(range(1, steps + 1))
    assert resumed["losses"] == pytest.approx(whole["losses"], rel=1e-5, abs=1e-6)


def test_a_sigterm_stops_the_journey_command_and_the_same_command_resumes(tmp_path):
    """`cortex-recipes journey train` (the images' `train` verb) on SIGTERM: the journey and its
    local backend stop within `docker stop`'s 10 s, the command exits 143 naming what resumes
    it, the checkpoint saved before the signal is kept, and that command resumes from it."""
    _, _, overrides = JOURNEYS["sft"]
    steps = 6  # more than the stopped run can finish: the resume has steps left to train
    run_dir = tmp_path / "stopped"
    cli = [str(Path(sys.executable).with_name("cortex-recipes")), "journey", "train", "sft"]
    args = [f"{k}={v}" for k, v in {**overrides, "steps": steps, "ckpt_interval": 1,
                                    "log_path": run_dir}.items()]  # fmt: skip
    # the output goes to a file, not a pipe: a pipe's end comes only when every process holding
    # it (the backend too, which exits after the command) has closed it, and the time asked
    # about is the command's own exit
    log = tmp_path / "stopped.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*cli, *args, "--root", str(ROOT)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for_checkpoint(proc, run_dir, 1)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert took <= 10.0, f"stopping took {took:.1f} s"
    assert "stopped by SIGTERM" in output and "resumes from the newest" in output
    assert "cortex-recipes journey train sft" in output
    kept = RunCheckpoints(run_dir / "checkpoints").steps()
    assert 1 in kept
    assert max(m["step"] for m in metrics(run_dir)) < steps  # it stopped, it did not finish
    # no process of this run is left: the backend exits with the journey that started it
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = [
            pid for pid in os.listdir("/proc") if pid.isdigit() and _mentions(pid, str(run_dir))
        ]
        if not left:
            break
        time.sleep(0.5)
    assert not left, f"processes of the stopped run still running: {left}"

    resumed = subprocess.run(
        [*cli, *args, "--root", str(ROOT)], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from_step"] >= 1
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, steps + 1))


def _mentions(pid: str, text: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return text.encode() in f.read()
    except OSError:
        return False
