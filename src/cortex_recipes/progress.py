"""Live progress on stderr, one library (tqdm) for the whole project.

Training steps, evaluation, model fixture builds and qualification runs show a bar with the
rate and an ETA. It is drawn only when all of these hold:

- a command-line entry point asked for it (:func:`configure`: a journey's ``progress=``
  field, default true), or ``$CORTEX_RECIPES_PROGRESS`` is ``1`` (``cortex-recipes qualify``
  sets it for the qualification it starts). Library code that a test calls without asking
  never draws one;
- ``$CORTEX_RECIPES_PROGRESS`` is not ``0`` / ``false`` / ``no`` / ``off``;
- stderr is a terminal (a log file or a pipe gets the usual log lines only).

While a bar is open, log records go through ``tqdm.write`` so that they print above it
instead of tearing it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

ENV = "CORTEX_RECIPES_PROGRESS"
_OFF = {"0", "false", "no", "off"}
_ON = {"1", "true", "yes", "on"}

_requested = False  # process-wide: off until an entry point asks


def configure(enabled: bool = True) -> bool:
    """Ask for progress bars in this process (entry points only); returns whether they show."""
    global _requested
    _requested = bool(enabled)
    return is_on()


def is_on(stream: Any = None) -> bool:
    """Whether a bar would be drawn now on ``stream`` (default stderr)."""
    env = os.environ.get(ENV, "").strip().lower()
    if env in _OFF or not (_requested or env in _ON):
        return False
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def bar(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "step",
    initial: int = 0,
) -> Any:
    """A ``tqdm`` bar on stderr, disabled (a no-op with the same methods) unless :func:`is_on`."""
    from tqdm.auto import tqdm

    return tqdm(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        initial=initial,
        file=sys.stderr,
        disable=not is_on(),
        dynamic_ncols=True,
        leave=True,
    )


@contextmanager
def task(desc: str, unit: str = "request") -> Iterator[None]:
    """One long call (an evaluation request, a fixture build) as a bar of one item: elapsed
    time while it runs, then done."""
    with bar(total=1, desc=desc, unit=unit) as one:
        yield
        one.update(1)


@contextmanager
def logging_above_bars() -> Iterator[None]:
    """While a bar may be drawn, route the console's log handlers through ``tqdm.write``."""
    if not is_on():
        yield
        return
    from tqdm.contrib.logging import logging_redirect_tqdm

    with logging_redirect_tqdm(loggers=[logging.getLogger()]):
        yield


class StepProgress:
    """The training-step bar of one run: :meth:`Run.metrics <cortex_recipes.run.Run.metrics>`
    advances it to each record's ``step`` and shows its loss or reward."""

    SHOWN = ("loss", "reward/mean", "teacher_reverse_kl", "off_policy/max")

    def __init__(self, total: int, *, desc: str, done: int = 0):
        self._bar = bar(total=total, desc=desc, unit="step", initial=done)
        self._step = done

    def update(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        if not isinstance(step, int) or step <= self._step:
            return
        shown = {}
        for key in self.SHOWN:
            value = record.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                shown[key] = f"{value:.4g}"
        if shown:
            self._bar.set_postfix(shown, refresh=False)
        self._bar.update(step - self._step)
        self._step = step

    def close(self) -> None:
        self._bar.close()
