"""Policy-lag bookkeeping for asynchronous GRPO, following PrimeRL's orchestration semantics.

Names and conventions (prime-rl ``OrchestratorConfig``; see docs/async-grpo.md for the mapping):

- Training steps are 1-indexed; policy versions are 0-indexed. Step ``n`` produces policy
  ``v_n``; the fully on-policy batch for step ``n`` comes from ``v_{n-1}``.
- A group of ``group_size`` rollouts shares one prompt. Each group records the policy version
  confirmed on the sampler when it was dispatched (``policy_start``) and when its result
  arrived (``policy_end``); its weights lie somewhere in ``[start, end]``, so ``start`` is the
  conservative version to measure lag from.
- The off-policy lag of a group trained at step ``n`` is ``(n - 1) - policy_start``, which
  counts queue time as well as generation time.
- ``max_async_level`` bounds how far sampling may run ahead: the next group is dispatched for
  step ``target = step_taken + 1 + pending // groups_per_step`` and only while
  ``(target - 1) - policy_version <= max_async_level``. ``0`` is synchronous on-policy RL.
- ``max_off_policy_steps`` bounds staleness at training time: queued groups whose lag at the
  step about to train would exceed it are dropped and counted (``off_policy/dropped``), and
  in-flight groups that can no longer be fresh are marked and dropped when they land.

This module is pure bookkeeping (no I/O, no clocks of its own): the threaded orchestrator
drives it under a lock, and property tests drive it with random interleavings.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


class LagConfigError(ValueError):
    """An orchestrator setting outside its allowed range; the message names field and value."""


@dataclass(frozen=True)
class LagConfig:
    groups_per_step: int
    max_async_level: int = 1
    max_off_policy_steps: int = 2
    max_inflight_groups: int = 8

    def __post_init__(self) -> None:
        for name, minimum in (
            ("groups_per_step", 1),
            ("max_async_level", 0),
            ("max_off_policy_steps", 0),
            ("max_inflight_groups", 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise LagConfigError(f"{name}={value!r} must be an integer >= {minimum}")
        if self.max_off_policy_steps < self.max_async_level:
            raise LagConfigError(
                f"max_off_policy_steps={self.max_off_policy_steps} is below "
                f"max_async_level={self.max_async_level}: every group dispatched at the allowed "
                "lead would be dropped as stale; set max_off_policy_steps >= max_async_level"
            )


@dataclass
class Group:
    """One dispatched group: its identity, target step, policy span and (once done) payload."""

    index: int
    target_step: int
    policy_start: int
    dispatched_at: float
    policy_end: int | None = None
    completed_at: float | None = None
    payload: Any = None
    doomed: bool = False  # can no longer be fresh when trained; dropped on arrival

    def lag_at(self, step: int) -> int:
        return (step - 1) - self.policy_start


@dataclass
class TakenBatch:
    step: int
    groups: list[Group]
    dropped: int  # groups dropped as stale while assembling this batch
    lags: list[int]  # one per group

    @property
    def lag_mean(self) -> float:
        return sum(self.lags) / len(self.lags)

    @property
    def lag_max(self) -> int:
        return max(self.lags)


@dataclass
class RolloutBook:
    """What is in flight, what is queued, what was dropped; which group may go next."""

    config: LagConfig
    step_taken: int = 0  # the last step whose batch was taken
    policy_version: int = 0  # the last version confirmed on the sampler
    next_index: int = 0
    in_flight: dict[int, Group] = field(default_factory=dict)
    queue: deque[Group] = field(default_factory=deque)
    dispatched_total: int = 0
    consumed_total: int = 0
    dropped_total: int = 0
    failed_total: int = 0
    discarded_total: int = 0  # in flight or queued at a checkpoint that was resumed from
    last_step: int | None = None  # no dispatch for steps after this one

    # -- dispatch --------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        return len(self.in_flight) + len(self.queue)

    def next_target_step(self) -> int:
        return self.step_taken + 1 + self.pending // self.config.groups_per_step

    def can_dispatch(self) -> bool:
        if len(self.in_flight) >= self.config.max_inflight_groups:
            return False
        if self.last_step is not None and self.next_target_step() > self.last_step:
            return False
        return (self.next_target_step() - 1) - self.policy_version <= self.config.max_async_level

    def dispatch(self, now: float) -> Group | None:
        if not self.can_dispatch():
            return None
        group = Group(self.next_index, self.next_target_step(), self.policy_version, now)
        self.next_index += 1
        self.dispatched_total += 1
        self.in_flight[group.index] = group
        return group

    def complete(self, index: int, payload: Any, now: float) -> Group:
        group = self.in_flight.pop(index)
        group.policy_end = self.policy_version
        group.completed_at = now
        group.payload = payload
        if group.doomed or self._stale_for(group, self.step_taken + 1):
            self.dropped_total += 1
        else:
            self.queue.append(group)
        return group

    def fail(self, index: int) -> Group:
        """Work lost to an error: forgotten, never trained on."""
        self.failed_total += 1
        return self.in_flight.pop(index)

    # -- policy updates --------------------------------------------------------------------

    def publish(self, version: int) -> int:
        """The sampler now serves ``version``; mark in-flight groups that cannot be fresh."""
        if version < self.policy_version:
            raise ValueError(f"policy version went backwards: {self.policy_version} -> {version}")
        self.policy_version = version
        doomed = 0
        for group in self.in_flight.values():
            if not group.doomed and self._stale_for(group, self.step_taken + 1):
                group.doomed = True
                doomed += 1
        return doomed

    # -- training side ---------------------------------------------------------------------

    def _stale_for(self, group: Group, step: int) -> bool:
        return group.lag_at(step) > self.config.max_off_policy_steps

    def sweep(self, step: int) -> int:
        """Drop queued groups that would be too stale to train at ``step``."""
        kept = deque(g for g in self.queue if not self._stale_for(g, step))
        dropped = len(self.queue) - len(kept)
        self.queue = kept
        self.dropped_total += dropped
        return dropped

    def ready(self, step: int) -> bool:
        self.sweep(step)
        return len(self.queue) >= self.config.groups_per_step

    def take(self, step: int) -> TakenBatch:
        """The batch for ``step``: the first ``groups_per_step`` fresh groups to finish."""
        if step != self.step_taken + 1:
            raise ValueError(f"step {step} taken after step {self.step_taken}; steps go one by one")
        dropped = self.sweep(step)
        if len(self.queue) < self.config.groups_per_step:
            raise ValueError(
                f"step {step} needs {self.config.groups_per_step} groups, {len(self.queue)} queued"
            )
        groups = [self.queue.popleft() for _ in range(self.config.groups_per_step)]
        self.step_taken = step
        self.consumed_total += len(groups)
        return TakenBatch(step, groups, dropped, [g.lag_at(step) for g in groups])

    # -- observability and resume ----------------------------------------------------------

    def gauges(self) -> dict[str, float]:
        """PrimeRL-named gauges of the work that is in flight and queued right now."""
        nxt = self.step_taken + 1
        in_flight = [g.lag_at(nxt) for g in self.in_flight.values()]
        in_queue = [g.lag_at(nxt) for g in self.queue]
        return {
            "off_policy/in_flight/count": len(in_flight),
            "off_policy/in_flight/max": max(in_flight, default=0),
            "off_policy/in_queue/count": len(in_queue),
            "off_policy/in_queue/max": max(in_queue, default=0),
            "off_policy/dropped_total": self.dropped_total,
            "orchestrator/failed_total": self.failed_total,
            "watcher/policy_version": self.policy_version,
        }

    def state_dict(self) -> dict[str, int]:
        """What resume needs. In-flight and queued work is not saved (as in prime-rl): a run
        resumed from this state counts it as discarded."""
        return {
            "step_taken": self.step_taken,
            "policy_version": self.policy_version,
            "next_index": self.next_index,
            "dispatched_total": self.dispatched_total,
            "consumed_total": self.consumed_total,
            "dropped_total": self.dropped_total,
            "failed_total": self.failed_total,
            "discarded_total": self.discarded_total + self.pending,
        }

    @classmethod
    def from_state(cls, config: LagConfig, state: dict[str, int]) -> RolloutBook:
        book = cls(config)
        for key in (
            "step_taken",
            "policy_version",
            "next_index",
            "dispatched_total",
            "consumed_total",
            "dropped_total",
            "failed_total",
            "discarded_total",
        ):
            value = state.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"orchestrator state {key}={value!r} must be an integer >= 0")
            setattr(book, key, value)
        return book
