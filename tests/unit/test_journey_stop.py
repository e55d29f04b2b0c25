"""`cortex-recipes journey` stops its journey on SIGTERM or SIGINT within the grace period,
lets it clean up, and says what resumes it (issue 46: a container stops within `docker
stop`'s 10 s). Real processes: a supervisor process running ``run_stoppable`` around a
child that stands in for a journey (a narrow contract; tests/e2e runs a real journey)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cortex_recipes import journey_runner

pytestmark = pytest.mark.unit

CHILD_CLEANS_UP = """
import sys, time
open(sys.argv[1] + ".started", "w").close()
try:
    time.sleep(60)
except KeyboardInterrupt:
    open(sys.argv[1] + ".cleaned", "w").close()
    sys.exit(1)
"""

CHILD_IGNORES_SIGINT = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
open(sys.argv[1] + ".started", "w").write(str(os.getpid()))
time.sleep(60)
"""


def supervise(
    tmp_path: Path, child: str, grace_s: float, sigint_ignored: bool = False
) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(child)
    marker = tmp_path / "m"
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from cortex_recipes.journey_runner import run_stoppable
        sys.exit(run_stoppable([sys.executable, {str(script)!r}, {str(marker)!r}], Path('.'),
                               grace_s={grace_s}, resume='`cortex-recipes journey train x`'))
    """)
    # started as a shell's background job is (SIGINT ignored, inherited through exec) when
    # sigint_ignored: the journey must still get the SIGINT passed on
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
        preexec_fn=ignore,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (tmp_path / "m.started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the child did not start"
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["foreground", "background"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_signal_lets_the_journey_clean_up_and_says_what_resumes_it(
    tmp_path, signum, sigint_ignored
):
    proc = supervise(tmp_path, CHILD_CLEANS_UP, grace_s=8.0, sigint_ignored=sigint_ignored)
    sent = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == 128 + signum
    assert (tmp_path / "m.cleaned").exists()  # its KeyboardInterrupt path ran
    assert took < 8.0, took  # it did not wait for the grace period
    assert f"stopped by {signal.Signals(signum).name}" in err
    assert "`cortex-recipes journey train x` resumes from the newest" in err


def test_a_journey_that_does_not_stop_is_killed_after_the_grace_period(tmp_path):
    proc = supervise(tmp_path, CHILD_IGNORES_SIGINT, grace_s=1.5)
    child = int((tmp_path / "m.started").read_text())
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == 128 + signal.SIGTERM
    assert 1.5 <= took < 8.0, took
    assert "stopped by SIGTERM" in err
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
        os.kill(child, 0)


def test_without_a_signal_the_journeys_exit_status_is_returned(tmp_path):
    assert (
        journey_runner.run_stoppable([sys.executable, "-c", "raise SystemExit(3)"], tmp_path) == 3
    )
    assert journey_runner.run_stoppable([sys.executable, "-c", "pass"], tmp_path) == 0


def test_the_resume_hint_is_the_same_command_outside_an_image(monkeypatch):
    monkeypatch.delenv("CORTEX_JOURNEY", raising=False)
    hint = journey_runner.resume_command(["journey", "train", "sft", "steps=4"])
    assert hint == "`cortex-recipes journey train sft steps=4`"


def test_a_journey_that_finishes_during_the_grace_period_exits_0(tmp_path):
    proc = supervise(tmp_path, CHILD_IGNORES_SIGINT.replace("time.sleep(60)", "time.sleep(1)"),
                     grace_s=8.0)  # fmt: skip
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "received as the run finished" in err
