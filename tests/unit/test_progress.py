"""Live progress (cortex_recipes.progress): off unless an entry point asks, stderr is a
terminal and $CORTEX_RECIPES_PROGRESS allows it; a run's step bar follows its metrics."""

from __future__ import annotations

import io
import sys
import time

import pytest

from cortex_recipes import progress
from tests.unit.test_run import Profile, sft_record

pytestmark = pytest.mark.unit


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch):
    """stderr as a terminal. pytest's own capture re-sets sys.stderr between fixture set-up
    and the test, so each test calls this inside its body."""
    monkeypatch.delenv(progress.ENV, raising=False)
    monkeypatch.setattr(progress, "_requested", False)
    stream = Terminal()

    def attach() -> Terminal:
        monkeypatch.setattr(sys, "stderr", stream)
        return stream

    return attach


def test_off_in_library_code_until_an_entry_point_asks(terminal, monkeypatch):
    terminal()
    assert not progress.is_on()  # a test calling library code without asking
    assert progress.configure(True)
    monkeypatch.setenv(progress.ENV, "0")
    assert not progress.is_on()
    monkeypatch.setenv(progress.ENV, "1")
    assert progress.configure(False)  # the variable asks too (cortex-recipes qualify)


def test_off_when_stderr_is_not_a_terminal(terminal, monkeypatch):
    terminal()
    assert progress.configure(True)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not progress.is_on()
    assert not progress.is_on(io.StringIO())


def test_a_run_step_bar_advances_with_metrics_and_shows_the_loss(terminal, tmp_path):
    from cortex_recipes.run import open_run

    shown = terminal()
    progress.configure(True)
    run = open_run("sft", Profile(), {}, log_path=str(tmp_path))
    run.track_steps(3)
    for step in (1, 2, 3):
        run.metrics(**{**sft_record(step), "loss": 2.5 / step})
    run.close_progress()
    shown = shown.getvalue()
    assert "0/3" in shown and "3/3" in shown and "loss=0.833" in shown  # tqdm may skip 1/3
    assert "<" in shown  # tqdm's elapsed<remaining: the ETA


def test_no_bar_is_drawn_when_nobody_asked(terminal, tmp_path):
    from cortex_recipes.run import open_run

    stream = terminal()
    run = open_run("sft", Profile(), {}, log_path=str(tmp_path))
    run.track_steps(2)
    run.metrics(**sft_record(1))
    run.close_progress()
    with progress.task("eval"):
        pass
    assert stream.getvalue() == ""


@pytest.fixture
def pipe(monkeypatch, caplog):
    """stderr as a pipe (a container's log): progress asked for, lines every 0.05 s."""
    monkeypatch.delenv(progress.ENV, raising=False)
    monkeypatch.setenv(progress.EVERY_ENV, "0.05")
    monkeypatch.setattr(progress, "_requested", False)
    caplog.set_level("INFO", logger=progress.log.name)

    def attach() -> io.StringIO:
        stream = io.StringIO()
        monkeypatch.setattr(sys, "stderr", stream)
        return stream

    return attach


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == progress.log.name]


def test_without_a_terminal_a_run_logs_plain_progress_lines(pipe, caplog, tmp_path, monkeypatch):
    """A phase line when it starts and ends, and step lines with elapsed time and an ETA, at
    most one per interval: what a container's log shows instead of a bar."""
    from cortex_recipes.run import open_run

    now = [1000.0]  # the bar's clock, moved by hand: the lines do not depend on the machine
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    monkeypatch.setenv(progress.EVERY_ENV, "30")
    stream = pipe()
    assert not progress.configure(True)  # no bar on a pipe ...
    assert progress.is_plain()  # ... plain lines instead
    run = open_run("sft", Profile(), {}, log_path=str(tmp_path))
    run.track_steps(4)
    name = f"sft {run.path.name}"
    now[0] += 10
    run.metrics(**{**sft_record(1), "loss": 2.5})  # 10 s after the last line: none
    assert lines(caplog) == [f"{name}: started, step 0/4"]
    now[0] += 30
    run.metrics(**{**sft_record(2), "loss": 1.25})
    assert lines(caplog)[-1] == f"{name}: step 2/4, 40s elapsed, ETA 40s, loss=1.25"
    now[0] += 95
    run.close_progress()
    assert lines(caplog)[-1] == f"{name}: done, step 2/4 in 2m15s"
    assert "\r" not in stream.getvalue()  # no bar drawn into the log


def test_a_long_phase_without_steps_still_logs_at_every_interval(pipe, caplog):
    """A warm start, an evaluation request or one long step: the timer writes a line at
    every interval while nothing finishes."""
    pipe()
    progress.configure(True)
    with progress.task("eval: 8 greedy answers"):
        deadline = time.monotonic() + 30
        while len(lines(caplog)) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    shown = lines(caplog)
    assert shown[0] == "eval: 8 greedy answers: started, request 0/1"
    assert all("request 0/1, " in x and "elapsed" in x for x in shown[1:4]), shown
    assert shown[-1].startswith("eval: 8 greedy answers: done, request 1/1 in ")


def test_plain_lines_stay_off_when_nobody_asked_or_progress_is_off(pipe, caplog, monkeypatch):
    pipe()
    with progress.task("eval"):
        pass
    progress.configure(True)
    monkeypatch.setenv(progress.ENV, "off")
    with progress.task("eval"):
        pass
    assert lines(caplog) == []


@pytest.mark.parametrize("raw", ["0", "-3", "nan", "soon"])
def test_a_bad_interval_is_refused_naming_the_variable(pipe, monkeypatch, raw):
    pipe()
    progress.configure(True)
    monkeypatch.setenv(progress.EVERY_ENV, raw)
    with pytest.raises(ValueError, match=progress.EVERY_ENV):
        progress.bar(total=2)


def test_an_iterated_plain_bar_counts_each_item_after_its_body(pipe, caplog):
    pipe()
    progress.configure(True)
    seen = []
    for step in progress.bar(range(1, 4), desc="tito warm start"):
        seen.append(step)
    assert seen == [1, 2, 3]
    assert lines(caplog)[-1].startswith("tito warm start: done, step 3/3 in ")
