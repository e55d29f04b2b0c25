"""Torch threads for CPU workers: the machine's cores shared among the workers that are busy.

A worker is busy from the moment a command is queued for it until its last reply. The cores
are split evenly among busy CPU workers (at least one thread each); an idle worker holds none.
So a synchronous loop, whose sampler and trainer take turns, gives every core to whichever
phase runs, and an asynchronous run, where both are busy, splits them.

Invariants:
- A new thread count reaches a worker as a ``threads`` message queued before the command that
  made it busy, and the worker applies it at its next command or decode-step boundary, or at
  the next decoder layer of a forward or backward already running (a CPU worker hooks its
  model's layers).
- ``cortex-recipes serve --threads N`` (or ``LocalBackend(threads=N)``) fixes every worker at
  N threads and turns this off.
"""

from __future__ import annotations

import os
import threading
from typing import Protocol


class _Threaded(Protocol):
    def set_threads(self, n: int) -> None: ...


class CoreBalancer:
    def __init__(self, cores: int | None = None):
        self.cores = max(1, cores or os.cpu_count() or 1)
        self._busy: dict[_Threaded, int] = {}
        self._lock = threading.Lock()

    def share(self) -> int:
        """Threads each busy worker gets now."""
        with self._lock:
            return max(1, self.cores // max(1, len(self._busy)))

    def busy(self, worker: _Threaded) -> None:
        with self._lock:
            if worker in self._busy:
                return
            self._busy[worker] = 0
            self._rebalance()

    def idle(self, worker: _Threaded) -> None:
        with self._lock:
            if self._busy.pop(worker, None) is None:
                return
            self._rebalance()

    def _rebalance(self) -> None:
        share = max(1, self.cores // max(1, len(self._busy)))
        for worker, current in self._busy.items():
            if current != share:
                self._busy[worker] = share
                worker.set_threads(share)
