"""Live progress on stderr, one library (tqdm) for the whole project.

Training steps, evaluation, model fixture builds and qualification runs show a bar with the
rate and an ETA. It is drawn only when all of these hold:

- a command-line entry point asked for it (:func:`configure`: a journey's ``progress=``
  field, default true), or ``$CORTEX_RECIPES_PROGRESS`` is ``1`` (``cortex-recipes qualify``
  sets it for the qualification it starts). Library code that a test calls without asking
  never draws one;
- ``$CORTEX_RECIPES_PROGRESS`` is not ``0`` / ``false`` / ``no`` / ``off``;
- stderr is a terminal.

While a bar is open, log records go through ``tqdm.write`` so that they print above it
instead of tearing it.

Where progress was asked for but stderr is not a terminal (a container's log, a pipe, a CI
job), a bar is a :class:`PlainProgress` instead: plain log lines, one when a phase starts, one
when it ends, and one at least every :data:`EVERY_S` seconds while it runs (more often as
steps finish, never more than one per interval), each with the phase, the step count, the
time elapsed and an ETA. ``$CORTEX_RECIPES_PROGRESS_EVERY`` sets the interval in seconds.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

ENV = "CORTEX_RECIPES_PROGRESS"
_OFF = {"0", "false", "no", "off"}
_ON = {"1", "true", "yes", "on"}

EVERY_ENV = "CORTEX_RECIPES_PROGRESS_EVERY"
EVERY_S = 30.0  # a plain progress line at least this often while a phase runs

log = logging.getLogger(__name__)
_requested = False  # process-wide: off until an entry point asks


def configure(enabled: bool = True) -> bool:
    """Ask for progress bars in this process (entry points only); returns whether they show."""
    global _requested
    _requested = bool(enabled)
    return is_on()


def _asked() -> bool:
    env = os.environ.get(ENV, "").strip().lower()
    return env not in _OFF and (_requested or env in _ON)


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def is_on(stream: Any = None) -> bool:
    """Whether a bar would be drawn now on ``stream`` (default stderr)."""
    return _asked() and _is_tty(sys.stderr if stream is None else stream)


def is_plain() -> bool:
    """Whether progress was asked for but stderr is no terminal: plain progress lines."""
    return _asked() and not _is_tty(sys.stderr)


def every_s() -> float:
    """The plain progress interval: ``$CORTEX_RECIPES_PROGRESS_EVERY`` seconds, else 30."""
    raw = os.environ.get(EVERY_ENV, "").strip()
    if not raw:
        return EVERY_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"${EVERY_ENV}={raw!r}: a number of seconds > 0")
    return value


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class PlainProgress:
    """A bar's stand-in without a terminal: the phase as log lines (see the module), with the
    methods of a ``tqdm`` bar that this project uses. A timer thread writes a line every
    interval even while no step finishes (a long step, a warm start, an evaluation request)."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None,
                 desc: str = "", unit: str = "step", initial: int = 0,
                 interval_s: float | None = None):  # fmt: skip
        self.iterable, self.desc, self.unit = iterable, desc or "progress", unit
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.n, self.initial = total, initial, initial
        self.postfix = ""
        self.interval_s = every_s() if interval_s is None else interval_s
        self.started = self._last = time.monotonic()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        log.info("%s: started%s", self.desc, self._count())
        self._timer = threading.Thread(target=self._tick, name="progress", daemon=True)
        self._timer.start()

    def _count(self) -> str:
        if self.total is None:
            return f", {self.n} {self.unit}s" if self.n else ""
        return f", {self.unit} {self.n}/{self.total}"

    def line(self) -> str:
        """The progress line now: phase, count, elapsed, ETA (once a step has finished)."""
        elapsed = time.monotonic() - self.started
        parts = [f"{self.desc}:{self._count()[1:] or ' running'}",
                 f"{_duration(elapsed)} elapsed"]  # fmt: skip
        done = self.n - self.initial
        if self.total is not None and done > 0 and self.n < self.total:
            parts.append(f"ETA {_duration(elapsed / done * (self.total - self.n))}")
        if self.postfix:
            parts.append(self.postfix)
        return ", ".join(parts)

    def _emit(self) -> None:
        with self._lock:
            self._last = time.monotonic()
            log.info("%s", self.line())

    def _tick(self) -> None:
        while not self._closed.wait(self.interval_s / 4):
            if time.monotonic() - self._last >= self.interval_s:
                self._emit()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._last >= self.interval_s:
            self._emit()

    def set_postfix(self, values: dict[str, Any] | None = None, refresh: bool = True) -> None:
        self.postfix = " ".join(f"{k}={v}" for k, v in (values or {}).items())

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._timer.join(timeout=5)
        elapsed = _duration(time.monotonic() - self.started)
        log.info("%s: done%s in %s", self.desc, self._count(), elapsed)

    def __iter__(self) -> Iterator[Any]:
        try:
            for item in self.iterable or ():
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def bar(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "step",
    initial: int = 0,
) -> Any:
    """A ``tqdm`` bar on stderr, disabled (a no-op with the same methods) unless :func:`is_on`;
    where progress was asked for without a terminal, a :class:`PlainProgress`."""
    if is_plain():
        return PlainProgress(iterable, total=total, desc=desc, unit=unit, initial=initial)
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
