"""The asynchronous orchestrator: bounded rollout work in flight while the trainer consumes.

Rollout workers (threads) take the next dispatchable group from the :class:`RolloutBook`,
sample it on the sampling sub-job through the SDK, score it, and queue it. The trainer (the
caller's thread) takes finished batches with :meth:`AsyncOrchestrator.next_batch` and
announces each synced policy with :meth:`AsyncOrchestrator.publish`. All bookkeeping happens
under one lock; the SDK calls happen outside it, so sampling and training really overlap.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cortex_recipes.rl.policy_lag import Group, RolloutBook, TakenBatch

log = logging.getLogger(__name__)


class OrchestratorError(RuntimeError):
    """A rollout worker failed; the original exception is chained."""


@dataclass
class Intervals:
    """Wall-clock intervals of one kind of work, for measuring overlap."""

    spans: list[tuple[float, float]] = field(default_factory=list)

    def add(self, start: float, end: float) -> None:
        self.spans.append((start, end))

    def merged(self) -> list[tuple[float, float]]:
        out: list[list[float]] = []
        for start, end in sorted(self.spans):
            if out and start <= out[-1][1]:
                out[-1][1] = max(out[-1][1], end)
            else:
                out.append([start, end])
        return [(a, b) for a, b in out]

    def total(self) -> float:
        return sum(b - a for a, b in self.merged())


def overlap_seconds(a: Intervals, b: Intervals) -> float:
    """Seconds during which some interval of ``a`` and some interval of ``b`` both ran."""
    total, j = 0.0, 0
    left, right = a.merged(), b.merged()
    for start, end in left:
        while j < len(right) and right[j][1] <= start:
            j += 1
        k = j
        while k < len(right) and right[k][0] < end:
            total += max(0.0, min(end, right[k][1]) - max(start, right[k][0]))
            k += 1
    return total


class AsyncOrchestrator:
    def __init__(
        self,
        book: RolloutBook,
        sample: Callable[[Group], Any],
        *,
        workers: int,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.book = book
        self._sample = sample
        self._clock = clock
        self._cond = threading.Condition()
        self._stopping = False
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._work, name=f"rollout-worker-{i}", daemon=True)
            for i in range(workers)
        ]
        self.generation = Intervals()
        self.wait_for_policy_s = 0.0  # rollout workers idle because of max_async_level

    # -- rollout workers -------------------------------------------------------------------

    def start(self) -> AsyncOrchestrator:
        for thread in self._threads:
            thread.start()
        return self

    def _next_group(self) -> Group | None:
        with self._cond:
            waited_from = None
            while not self._stopping:
                group = self.book.dispatch(self._clock())
                if group is not None:
                    if waited_from is not None:
                        self.wait_for_policy_s += self._clock() - waited_from
                    return group
                gated = len(self.book.in_flight) < self.book.config.max_inflight_groups
                if gated and waited_from is None:
                    waited_from = self._clock()
                self._cond.wait(timeout=0.5)
            return None

    def _work(self) -> None:
        while True:
            group = self._next_group()
            if group is None:
                return
            try:
                payload = self._sample(group)
            except BaseException as exc:  # noqa: BLE001 -- surfaced to the trainer thread
                with self._cond:
                    self.book.fail(group.index)
                    if self._error is None and not self._stopping:
                        self._error = exc
                    self._cond.notify_all()
                return
            with self._cond:
                done = self.book.complete(group.index, payload, self._clock())
                self.generation.add(done.dispatched_at, done.completed_at)
                self._cond.notify_all()

    # -- trainer side ----------------------------------------------------------------------

    def next_batch(self, step: int, timeout: float = 3600.0) -> tuple[TakenBatch, float]:
        """Block until the batch for ``step`` is ready; return it and the seconds waited."""
        started = self._clock()
        with self._cond:
            while not self.book.ready(step):
                if self._error is not None:
                    raise OrchestratorError(
                        f"a rollout worker failed: {self._error}"
                    ) from self._error
                if self._clock() - started > timeout:
                    raise TimeoutError(f"no batch for step {step} within {timeout}s")
                self._cond.wait(timeout=0.5)
            batch = self.book.take(step)
            self._cond.notify_all()
        return batch, self._clock() - started

    def publish(self, version: int) -> int:
        with self._cond:
            doomed = self.book.publish(version)
            self._cond.notify_all()
        return doomed

    def gauges(self) -> dict[str, float]:
        with self._cond:
            return {**self.book.gauges(), "time/wait_for_policy": round(self.wait_for_policy_s, 3)}

    def state_dict(self) -> dict[str, int]:
        """A consistent snapshot of the bookkeeping while rollout workers keep going."""
        with self._cond:
            return self.book.state_dict()

    def close(self, timeout: float = 60.0) -> None:
        """Stop dispatching; wait for in-flight work to land (it is not trained on)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            log.warning("rollout workers still running after %.0fs: %s", timeout, alive)

    def __enter__(self) -> AsyncOrchestrator:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
