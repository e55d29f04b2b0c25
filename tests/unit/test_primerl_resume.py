"""Resuming the prime-rl journey: the agreed step, what is retracted after it, what fails closed,
and prime-rl processes that must not outlive (or survive) the journey that started them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cortex_recipes.primerl import broadcasts, resume
from cortex_recipes.primerl.launch import EXIT_WITH_PARENT
from cortex_recipes.run import CheckpointError

pytestmark = pytest.mark.unit
JOB = "job-old"


def publish(out: Path, version: int) -> dict:
    trainer = {"job_id": JOB, "checkpoint_id": f"ckpt-{version}"}
    broadcasts.publish(out, version, {**trainer, "stage_path": None})
    return trainer


def orchestrator_ckpt(out: Path, step: int) -> None:
    path = resume.orchestrator_checkpoint(out, step)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"opaque")  # prime-rl's torch.save file; never read here


def rollouts(out: Path, step: int) -> None:
    (out / "rollouts" / f"step_{step}").mkdir(parents=True)
    (out / "rollouts" / f"step_{step}" / "rank_0.bin").write_bytes(b"x")


def lines(path: Path) -> list[int]:
    return [json.loads(x)["step"] for x in path.read_text().splitlines()]


@pytest.fixture
def killed(tmp_path):
    """What a SIGKILL after the trainer published v3 leaves (interval 2): the orchestrator had
    shipped batch 4 and checkpointed 2 and 4; the trainer holds v3; the run's point is 2."""
    out = tmp_path / "outputs"
    trainers = {v: publish(out, v) for v in range(4)}
    broadcasts.mark_applied(out, 2, {"job_id": JOB})
    broadcasts.write_live(out, 3, "stable", JOB)
    for step in (1, 2, 3, 4):
        rollouts(out, step)
    for step in (2, 4):
        orchestrator_ckpt(out, step)
    (out / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in (1, 2, 3, 4)))
    (out / "cortex" / "trainer_metrics.jsonl").write_text(
        "".join(f'{{"step": {s}}}\n' for s in (1, 2, 3))
    )
    return out, trainers


def test_the_agreed_step_needs_both_the_version_and_the_orchestrator_checkpoint(killed):
    out, _ = killed
    assert [s for s in range(6) if resume.agreed(out, s)] == [0, 2]  # 4: v4 never published
    assert resume.orchestrator_checkpoint_steps(out) == [2, 4]


def test_restore_retracts_every_later_step_on_both_sides(killed):
    out, trainers = killed
    retracted = resume.restore(out, 2, trainers[2])
    assert retracted["rollouts"] == [3, 4]
    assert retracted["broadcasts"] == [3]
    assert retracted["checkpoints"] == [4]
    assert (retracted["primerl_records"], retracted["trainer_records"]) == (2, 1)
    assert broadcasts.published_versions(out) == [0, 1, 2]
    assert broadcasts.latest_published(out)["checkpoint_id"] == "ckpt-2"  # the trainer's start
    assert sorted(p.name for p in (out / "rollouts").iterdir()) == ["step_1", "step_2"]
    assert resume.orchestrator_checkpoint_steps(out) == [2]
    assert lines(out / "metrics.jsonl") == [1, 2]
    assert lines(out / "cortex" / "trainer_metrics.jsonl") == [1, 2]
    assert broadcasts.read_live(out) is None  # the new job writes its own
    # The old job's marker says nothing about a new job's sampler.
    assert broadcasts.is_applied(out, 2, JOB) and not broadcasts.is_applied(out, 2, "job-new")
    assert broadcasts.latest_applied(out, "job-new") is None


def test_restore_to_step_zero_restarts_the_orchestrator_and_keeps_version_zero(killed):
    out, trainers = killed
    resume.restore(out, 0, trainers[0])
    assert broadcasts.published_versions(out) == [0]
    assert resume.orchestrator_checkpoint_steps(out) == []
    assert not (out / "rollouts").exists() or not list((out / "rollouts").iterdir())
    assert (out / "metrics.jsonl").read_text() == ""


def test_no_resume_point_starts_the_prime_rl_side_from_nothing(killed):
    out, _ = killed
    assert resume.restore(out, None, None) == {"resume_step": None}
    assert out.is_dir() and not list(out.iterdir())


def test_a_missing_orchestrator_checkpoint_fails_closed_naming_it(killed):
    out, trainers = killed
    resume.orchestrator_checkpoint(out, 2).unlink()
    with pytest.raises(CheckpointError, match=r"step_2/orchestrator/progress.pt does not exist"):
        resume.restore(out, 2, trainers[2])
    assert broadcasts.published_versions(out) == [0, 1, 2, 3]  # nothing was touched


def test_a_version_that_is_not_published_fails_closed(killed):
    out, trainers = killed
    (broadcasts.version_dir(out, 2) / broadcasts.STABLE).unlink()
    with pytest.raises(CheckpointError, match=r"version 2 cannot be used: .*not published"):
        resume.restore(out, 2, trainers[2])


def test_a_manifest_that_names_another_checkpoint_fails_closed(killed):
    out, trainers = killed
    with pytest.raises(
        CheckpointError, match=r"cortex_version.json: checkpoint_id='ckpt-2', .*'ckpt-1'"
    ):
        resume.restore(out, 2, {**trainers[2], "checkpoint_id": "ckpt-1"})
    with pytest.raises(CheckpointError, match=r"job_id='job-old', .*job_id='job-other'"):
        resume.restore(out, 2, {**trainers[2], "job_id": "job-other"})


def test_an_earlier_journeys_live_process_is_refused(tmp_path):
    work = tmp_path / "primerl"
    work.mkdir()
    marker = str(work / "orch.toml")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        resume.record_processes(work, {"orchestrator": sleeper.pid}, marker=str(work))
        with pytest.raises(CheckpointError, match=rf"orchestrator pid {sleeper.pid}"):
            resume.wait_for_earlier_processes(work, timeout_s=0.5)
    finally:
        sleeper.kill()
        sleeper.wait()
    resume.wait_for_earlier_processes(work, timeout_s=5)  # gone: the record is dropped
    assert not (work / resume.PROCESSES).exists()


def test_a_child_started_through_exit_with_parent_dies_with_its_sigkilled_parent(tmp_path):
    pid_file = tmp_path / "child.pid"
    script = tmp_path / "child.py"
    script.write_text(
        "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    )
    parent_code = (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, {str(EXIT_WITH_PARENT)!r}, str(os.getpid()), "
        f"{str(script)!r}, {str(pid_file)!r}])\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert Path(f"/proc/{child}").exists()
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, f"child {child} outlived its SIGKILLed parent"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status  # a zombie waiting for init to reap it is gone


def test_exit_with_parent_refuses_a_bad_command_line():
    out = subprocess.run(
        [sys.executable, str(EXIT_WITH_PARENT), "not-a-pid"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "usage" in out.stderr
    assert os.path.basename(EXIT_WITH_PARENT) == "exit_with_parent.py"
