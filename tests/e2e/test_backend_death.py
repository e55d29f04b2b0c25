"""A local backend killed mid-run is noticed at once (issue 35: about 138 s of SDK retries on
the poll and the cancel, then four chained tracebacks ending in `Connection refused`): the
journey stops with one line that says the backend died, how, where its log is and the command
that resumes the run, and the run's checkpoints are kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cortex_recipes.run import RunCheckpoints

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def server_pid(state_dir: Path) -> int:
    """The local backend serving ``state_dir`` (its command line names it)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"cortex_recipes.local.server" in argv and str(state_dir).encode() in argv:
            return int(entry.name)
    raise AssertionError(f"no local backend serving {state_dir}")


def test_a_killed_backend_stops_the_run_with_one_line_and_the_resume_command(tmp_path):
    command = [
        sys.executable, "-m", "recipes.sft.conversational.train",
        "profile=recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json",
        "steps=400", "ckpt_interval=1", f"log_path={tmp_path}",
    ]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while 1 not in RunCheckpoints(tmp_path / "checkpoints").steps():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint for step 1"
            time.sleep(0.2)
        pid = server_pid(tmp_path / "backend")
        os.kill(pid, signal.SIGKILL)
        # The SDK alone retried for minutes; a minute is far more than noticing takes.
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = err.decode()
    assert proc.returncode == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    [line] = [x for x in stderr.splitlines() if x.startswith("error: ")]
    assert f"the local backend (pid {pid}) was killed by signal 9" in line
    assert f"its log: {tmp_path / 'backend' / 'server.log'}" in line
    assert "resume it with the same command: " in line and f"log_path={tmp_path}" in line
    assert "recipes.sft.conversational.train" in line
    assert RunCheckpoints(tmp_path / "checkpoints").steps()  # nothing saved is lost
    assert "Traceback" in (tmp_path / "debug.log").read_text()  # the details are kept
