"""Property tests of the async-GRPO lag and staleness rules (PrimeRL semantics)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortex_recipes.rl.policy_lag import LagConfig, LagConfigError, RolloutBook

pytestmark = pytest.mark.contract


@st.composite
def configs(draw):
    level = draw(st.integers(0, 3))
    return LagConfig(
        groups_per_step=draw(st.integers(1, 4)),
        max_async_level=level,
        max_off_policy_steps=draw(st.integers(level, level + 3)),
        max_inflight_groups=draw(st.integers(1, 10)),
    )


class Simulation:
    """A trainer and sampler driven by random choices: the trainer takes a batch, trains,
    then publishes the new version; groups finish in any order, sometimes fail."""

    def __init__(self, config: LagConfig):
        self.book = RolloutBook(config)
        self.config = config
        self.unpublished: int | None = None  # trained version not yet on the sampler
        self.taken = []
        self.dispatched = []
        self.clock = 0.0

    def enabled(self) -> list[str]:
        ops = []
        if self.book.can_dispatch():
            ops.append("dispatch")
        if self.book.in_flight:
            ops += ["complete", "fail"]
        if self.unpublished is not None:
            ops.append("publish")
        elif self.book.ready(self.book.step_taken + 1):
            ops.append("train")
        return ops

    def apply(self, op: str, pick: int) -> None:
        self.clock += 1.0
        book = self.book
        if op == "dispatch":
            group = book.dispatch(self.clock)
            assert group is not None
            self.dispatched.append(group)
        elif op in ("complete", "fail"):
            index = sorted(book.in_flight)[pick % len(book.in_flight)]
            if op == "complete":
                book.complete(index, payload=index, now=self.clock)
            else:
                book.fail(index)
        elif op == "publish":
            book.publish(self.unpublished)
            self.unpublished = None
        else:
            batch = book.take(book.step_taken + 1)
            self.taken.append(batch)
            self.unpublished = batch.step


def run(config: LagConfig, choices: list[tuple[int, int]], allow_fail: bool = True) -> Simulation:
    sim = Simulation(config)
    for op_pick, pick in choices:
        ops = [o for o in sim.enabled() if allow_fail or o != "fail"]
        assert ops, "the orchestrator deadlocked: no dispatch, completion, training or publish"
        sim.apply(ops[op_pick % len(ops)], pick)
        book = sim.book
        assert len(book.in_flight) <= config.max_inflight_groups
        assert book.dispatched_total == (
            book.consumed_total + book.dropped_total + book.failed_total + book.pending
        )
    return sim


choices = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 50)), max_size=120)


@settings(max_examples=300, deadline=None)
@given(config=configs(), choices=choices)
def test_dispatch_lead_never_exceeds_max_async_level(config, choices):
    sim = run(config, choices)
    for group in sim.dispatched:
        assert (group.target_step - 1) - group.policy_start <= config.max_async_level


@settings(max_examples=300, deadline=None)
@given(config=configs(), choices=choices)
def test_trained_groups_are_never_staler_than_max_off_policy_steps(config, choices):
    sim = run(config, choices)
    consumed = set()
    for batch in sim.taken:
        assert len(batch.groups) == config.groups_per_step
        for group, lag in zip(batch.groups, batch.lags, strict=True):
            assert lag == (batch.step - 1) - group.policy_start
            assert 0 <= lag <= config.max_off_policy_steps
            assert group.policy_start <= group.policy_end
            assert group.index not in consumed, "a group was trained on twice"
            consumed.add(group.index)
    assert [b.step for b in sim.taken] == list(range(1, len(sim.taken) + 1))


@settings(max_examples=200, deadline=None)
@given(config=configs(), choices=choices)
def test_max_async_level_zero_is_synchronous_on_policy(config, choices):
    sync = LagConfig(
        groups_per_step=config.groups_per_step,
        max_async_level=0,
        max_off_policy_steps=config.max_off_policy_steps,
        max_inflight_groups=config.max_inflight_groups,
    )
    sim = run(sync, choices)
    assert all(lag == 0 for batch in sim.taken for lag in batch.lags)
    assert sim.book.dropped_total == 0


@settings(max_examples=100, deadline=None)
@given(config=configs(), choices=choices)
def test_training_always_progresses_without_failures(config, choices):
    sim = run(config, choices, allow_fail=False)
    # Drive to the end: completing, publishing and training must reach the next steps.
    target = sim.book.step_taken + 3
    for _ in range(10_000):
        if sim.book.step_taken >= target:
            break
        sim.apply(sim.enabled()[0] if "train" not in sim.enabled() else "train", 0)
    assert sim.book.step_taken >= target


def test_stale_queued_group_is_dropped_and_counted():
    book = RolloutBook(LagConfig(groups_per_step=1, max_async_level=1, max_off_policy_steps=1))
    early = book.dispatch(0.0)  # for step 1 at v0
    second = book.dispatch(0.0)  # for step 2 at v0 (lead 1)
    assert book.dispatch(0.0) is None  # a third would lead by 2
    book.complete(second.index, "b", 1.0)
    assert book.take(1).groups[0] is second
    book.publish(1)
    third = book.dispatch(2.0)  # for step 2 at v1
    book.complete(third.index, "c", 3.0)
    book.take(2)
    book.publish(2)
    # ``early`` started at v0; trained at step 3 its lag would be 2 > 1: dropped on arrival.
    book.complete(early.index, "a", 4.0)
    assert book.dropped_total == 1 and not book.queue
    assert book.gauges()["off_policy/dropped_total"] == 1


def test_in_flight_group_is_doomed_when_a_publish_makes_it_stale():
    book = RolloutBook(
        LagConfig(
            groups_per_step=1, max_async_level=1, max_off_policy_steps=1, max_inflight_groups=4
        )
    )
    slow = book.dispatch(0.0)
    fast = book.dispatch(0.0)
    book.complete(fast.index, "f", 1.0)
    book.take(1)
    assert book.publish(1) == 0  # ``slow`` (v0) could still train at step 2 with lag 1
    book.complete(book.dispatch(1.0).index, "g", 2.0)
    book.take(2)
    assert book.publish(2) == 1  # at step 3 its lag would be 2: doomed
    book.complete(slow.index, "s", 3.0)
    assert book.dropped_total == 1


def test_resume_state_round_trip_counts_discarded_work():
    config = LagConfig(groups_per_step=2, max_async_level=1, max_off_policy_steps=2)
    book = RolloutBook(config)
    groups = [book.dispatch(0.0) for _ in range(4)]
    for g in groups[:2]:
        book.complete(g.index, g.index, 1.0)
    book.take(1)
    book.publish(1)
    state = book.state_dict()
    resumed = RolloutBook.from_state(config, state)
    assert (resumed.step_taken, resumed.policy_version, resumed.next_index) == (1, 1, 4)
    assert resumed.discarded_total == 2 and resumed.pending == 0
    assert (
        resumed.dispatched_total
        == (resumed.consumed_total + resumed.dropped_total + resumed.failed_total)
        + resumed.discarded_total
    )
    with pytest.raises(ValueError, match="step_taken"):
        RolloutBook.from_state(config, {**state, "step_taken": -1})


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"groups_per_step": 0}, "groups_per_step"),
        ({"groups_per_step": 1, "max_async_level": -1}, "max_async_level"),
        ({"groups_per_step": 1, "max_inflight_groups": 0}, "max_inflight_groups"),
        (
            {"groups_per_step": 1, "max_async_level": 2, "max_off_policy_steps": 1},
            "max_off_policy_steps=1",
        ),
        ({"groups_per_step": True}, "groups_per_step"),
    ],
)
def test_bad_lag_settings_are_rejected_naming_the_field(kwargs, field):
    with pytest.raises(LagConfigError, match=field):
        LagConfig(**kwargs)
