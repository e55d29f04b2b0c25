"""The run driver: the loop every step-by-step journey shares, so each ``train.py`` holds only
its algorithm.

A journey's ``main`` loads its profile, opens its run (:meth:`cortex_recipes.run.RunConfig.
open_run`: the run folder, ``if_exists``, the resume point) and hands an :class:`Algorithm`
and a :class:`Schedule` to :func:`drive`, which owns the rest:

- the connection (every job the run created is cancelled when it ends, on failure too);
- the resume: the trainer checkpoint of the resume point is loaded into the algorithm's trainer
  (:meth:`Algorithm.start` returns it) and the algorithm gets the rest of the resume state
  (:meth:`Algorithm.restore`); the loop starts after the resumed step, so every step is
  trained and recorded once;
- the cadences: :meth:`Algorithm.evaluate` on the schedule's eval steps (and the last), a
  resumable save on its checkpoint steps, written after the step's record (a run killed between
  the two resumes from the checkpoint before and trains that step again, so no step's record
  is ever lost or doubled);
- each step's record: what :meth:`Algorithm.step` and :meth:`Algorithm.evaluate` return, with
  ``step`` and ``time/step`` (the step's own time, evaluation and saves excluded), checked and
  written to ``metrics.jsonl`` and the trackers; the progress bar; one log line a step;
- the summary: the algorithm's fields (:meth:`Algorithm.finish`) with ``profile``,
  ``config_hash``, ``resumed_from_step``, ``loop_time_s`` and ``wall_time_s``.

The policy version has one owner too: the sampler of step ``n`` holds version
:func:`sampling_version` ``(n) = n - 1`` (the trainer's weights after ``n - 1`` steps, synced
before step ``n`` samples), and step ``n`` trains version :func:`trained_version` ``(n) = n``.
Journeys that record either read them from here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Protocol

from cortex_recipes.run import Run
from cortex_recipes.training_job import Trainer

log = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def start_logging() -> None:
    """INFO lines on stderr in the journeys' format (a no-op when logging is set up already)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)


def sampling_version(step: int) -> int:
    """The policy version the sampler holds while step ``step`` samples (its rollouts' version)."""
    return step - 1


def trained_version(step: int) -> int:
    """The policy version step ``step``'s optimiser step produces."""
    return step


@dataclass(frozen=True)
class Schedule:
    """Which steps run and when the driver evaluates and saves.

    ``steps``: the last step. ``eval_every``: :meth:`Algorithm.evaluate` every this many steps
    and after the last (0: never). ``ckpt_every``: a resumable save every this many steps
    (0: none); ``ckpt_last``: also after the last step (a journey whose last step ends with a
    weights-only save of its own leaves it off). ``stop_after``: stop once this step (before
    the last) is recorded and saved, as an interruption would (0: run to the end); the run
    then has no summary and resumes when the command runs again."""

    steps: int
    eval_every: int = 0
    ckpt_every: int = 0
    ckpt_last: bool = False
    stop_after: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "eval_every", "ckpt_every", "stop_after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Schedule.{name}={value!r}; an integer >= 0")

    def evaluates(self, step: int) -> bool:
        return bool(self.eval_every) and (step % self.eval_every == 0 or step == self.steps)

    def saves(self, step: int) -> bool:
        if step == self.steps:
            return self.ckpt_last
        return bool(self.ckpt_every) and step % self.ckpt_every == 0


def step_line(record: dict[str, Any], keys: Sequence[tuple[str, str]]) -> str:
    """A step's log line: ``key value`` for each ``(key, format spec)`` the record holds."""
    return " ".join(
        f"{key} {record[key]:{spec}}" for key, spec in keys if record.get(key) is not None
    )


def record_step(
    run: Run,
    record: dict[str, Any],
    total: int,
    log_keys: Sequence[tuple[str, str]],
    *,
    schema: str | None = None,
) -> None:
    """Record one step the way every journey does: ``record`` (with its ``step``) checked
    against the metrics schema (``schema``, default the journey's) and written to
    ``metrics.jsonl``, the trackers and the progress display (:meth:`Run.record_metrics`), then
    the step's log line (``log_keys``: :func:`step_line`)."""
    run.record_metrics(record, schema=schema)
    log.info("step %d/%d %s", record["step"], total, step_line(record, log_keys))


def next_steps(run_dir: str, *, export_extra: str | None = None) -> list[str]:
    """What a person reads after a run's result: where the run lives, how to export its
    weights (``export_extra``: the journey's uv extra, for journeys whose last save is an
    exportable model), and how to resume or retrain it."""
    lines = [f"run directory: {run_dir} (metrics.jsonl, summary.json, debug.log)"]
    if export_extra:
        lines.append(
            f"export it: python3 -m uv run --frozen --extra {export_extra} cortex-recipes "
            f"export {run_dir} <out dir>   (a from_pretrained / PEFT directory)"
        )
    lines.append(
        "rerun the same command to resume it (or return it when finished); "
        "if_exists=overwrite trains again"
    )
    return lines


class Algorithm(Protocol):
    """What a journey's ``train.py`` supplies to :func:`drive`."""

    #: the record keys, with their format specs, that each step's log line shows
    log_keys: Sequence[tuple[str, str]]

    def start(self, client: Any, run: Run, stack: ExitStack) -> Trainer:
        """Create the run's jobs and whatever the steps need; return the trainer whose
        checkpoint the resume point names and whose resumable saves the driver makes.
        ``stack`` closes, before the connection does, when the run ends however it ends: enter
        there what the steps run inside (a gateway, a batcher)."""

    def restore(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`state` saved (called on a resume, after the trainer loaded)."""

    def begin(self) -> None:
        """Before the first step this command trains (baseline evaluations, probes)."""

    def step(self, step: int) -> dict[str, Any]:
        """Train step ``step``; its record (``step`` and ``time/step`` are the driver's)."""

    def evaluate(self, step: int) -> dict[str, Any]:
        """The evaluation keys of step ``step``'s record (on the schedule's eval steps)."""

    def state(self) -> dict[str, Any]:
        """What a resume point carries besides the trainer checkpoint and the config hash."""

    def finish(self, client: Any) -> dict[str, Any]:
        """After the last step, still connected: final saves and evaluations; the summary's
        own fields."""


def drive(
    run: Run, connection: str, algorithm: Algorithm, schedule: Schedule, *, profile_name: str
) -> dict[str, Any]:
    """Run ``algorithm`` over ``schedule`` in ``run`` on ``connection``; the run's summary."""
    started = time.monotonic()
    with run.connect(connection) as client, ExitStack() as stack:
        trainer = algorithm.start(client, run, stack)
        if run.resume:
            trainer.load(run.resume)
            algorithm.restore(run.resume)
        algorithm.begin()
        run.track_steps(schedule.steps)
        loop_started = time.monotonic()
        for step in range((run.resumed_from_step or 0) + 1, schedule.steps + 1):
            t0 = time.monotonic()
            record = {**algorithm.step(step), "step": step}
            record["time/step"] = round(time.monotonic() - t0, 3)
            if schedule.evaluates(step):
                record.update(algorithm.evaluate(step))
            record_step(run, record, schedule.steps, algorithm.log_keys)
            if schedule.saves(step):
                trainer.save_resumable(step, algorithm.state())
            if schedule.stop_after and schedule.stop_after <= step < schedule.steps:
                log.info("stopping after step %d as asked; rerun the command to resume", step)
                return {"stopped_after_step": step, "run_dir": str(run.path)}
        loop_s = time.monotonic() - loop_started
        summary = algorithm.finish(client)
    return run.summary(
        {
            "profile": profile_name,
            "config_hash": run.config_hash,
            **summary,
            "resumed_from_step": run.resumed_from_step,
            "loop_time_s": round(loop_s, 2),
            "wall_time_s": round(time.monotonic() - started, 1),
        }
    )
