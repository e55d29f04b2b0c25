"""Lockstep batching: the turns of episodes played together become one generate request.

Episodes run concurrently through verifiers' ``TrainClient``, one HTTP request per model turn.
Sampling them one by one wastes most of a CPU (or GPU) on matrix-vector work, so the gateway's
``generate`` is a :class:`LockstepBatcher`: a request waits until every episode still playing
has sent its next turn, and then all of them go to the sampling sub-job as one SDK ``generate``
with a row (and a seed) each, which the backend samples as one batch.

The batches are deterministic, which is what makes a seeded run repeatable: round ``r`` holds
the ``r``-th turn of every episode that has one, in a fixed order (by each row's derived seed,
then its token ids), whatever order the HTTP requests arrived in. Members are counted
explicitly (:meth:`LockstepBatcher.playing`); a member that finishes or fails leaves, so the
rest never wait for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

GenerateRows = Callable[[list[list[int]], list[dict]], list[dict]]


class BatchingError(RuntimeError):
    """A lockstep batch that could not be sampled (the cause is chained)."""


class LockstepBatcher:
    """``generate(prompt_ids, params)`` for the gateway, batched across playing episodes."""

    def __init__(self, generate_rows: GenerateRows, *, timeout_s: float = 1800.0):
        self._generate_rows = generate_rows
        self._timeout_s = timeout_s
        self._cond = threading.Condition()
        self._members = 0
        self._pending: list[tuple[int, list[int], dict]] = []
        self._results: dict[int, Any] = {}
        self._tickets = iter(range(1, 1 << 62))
        self._closed = False
        #: the size of every batch sent, in order (for logs and tests)
        self.batch_sizes: list[int] = []
        self._thread = threading.Thread(target=self._flusher, daemon=True, name="lockstep")
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def __enter__(self) -> LockstepBatcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def playing(self, n: int) -> Iterator[Callable[[], None]]:
        """``n`` members for as long as the block runs; yields ``leave``, which each episode calls
        once when it ends or fails, so batches stop waiting for it. Members that have not left
        when the block ends leave then."""
        remaining = [n]

        def leave() -> None:
            with self._cond:
                if remaining[0] <= 0:
                    raise BatchingError("leave() called more often than there are members")
                remaining[0] -= 1
                self._members -= 1
                self._cond.notify_all()

        with self._cond:
            self._members += n
            self._cond.notify_all()
        try:
            yield leave
        finally:
            with self._cond:
                self._members -= remaining[0]
                remaining[0] = 0
                self._cond.notify_all()

    def generate(self, prompt_ids: list[int], params: dict) -> dict:
        with self._cond:
            if self._members <= 0:
                raise BatchingError(
                    "a generate request arrived with no episode playing; play episodes inside "
                    "LockstepBatcher.playing()"
                )
            ticket = next(self._tickets)
            self._pending.append((ticket, list(prompt_ids), dict(params)))
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: ticket in self._results, self._timeout_s):
                raise BatchingError(f"no lockstep batch was sampled in {self._timeout_s:.0f} s")
            result = self._results.pop(ticket)
        if isinstance(result, BaseException):
            raise BatchingError(f"the lockstep batch failed: {result}") from result
        return result

    def _ready(self) -> bool:
        return self._closed or (bool(self._pending) and len(self._pending) >= self._members)

    def _flusher(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(self._ready)
                if self._closed:
                    return
                batch = sorted(self._pending, key=lambda p: (p[2].get("seed", 0), p[1]))
                self._pending = []
            try:
                results: list[Any] = list(
                    self._generate_rows([p[1] for p in batch], [p[2] for p in batch])
                )
                if len(results) != len(batch):
                    raise BatchingError(f"{len(results)} results for {len(batch)} rows")
            except Exception as exc:  # every waiting turn sees the failure
                results = [exc] * len(batch)
            with self._cond:
                self.batch_sizes.append(len(batch))
                for (ticket, _, _), result in zip(batch, results, strict=True):
                    self._results[ticket] = result
                self._cond.notify_all()


def sdk_generate_rows(client, job_id: str) -> GenerateRows:
    """Rows for the SDK's token-id ``generate``: one request, per-row sampling params."""

    def generate_rows(prompts: list[list[int]], params: list[dict]) -> list[dict]:
        request_id = client.generate(job_id, [list(p) for p in prompts], list(params))
        return client.poll_request(job_id, request_id)["results"]

    return generate_rows
