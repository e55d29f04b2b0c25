"""Live progress (cortex_recipes.progress): off unless an entry point asks, stderr is a
terminal and $CORTEX_RECIPES_PROGRESS allows it; a run's step bar follows its metrics."""

from __future__ import annotations

import io
import sys

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
