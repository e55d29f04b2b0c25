"""The run driver's contract with a journey's algorithm: which steps run, when it evaluates and
saves, what each record and the summary hold, and the order a resume relies on (the record of a
step is written before its resumable save). The journeys themselves run on it end to end in
tests/e2e (SFT, OPD, Math GRPO: smoke, determinism, kill and resume)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from cortex_recipes import driver

pytestmark = pytest.mark.unit


class FakeTrainer:
    def __init__(self, events):
        self.events = events

    def load(self, checkpoint):
        self.events.append(("load", checkpoint["step"]))

    def save_resumable(self, step, state):
        self.events.append(("save", step, dict(state)))
        return 0.0


class FakeRun:  # the narrow part of cortex_recipes.run.Run that drive() uses
    def __init__(self, events, resume=None):
        self.events, self.resume = events, resume
        self.resumed_from_step = resume["step"] if resume else None
        self.config_hash = "0123456789abcdef"

    @contextmanager
    def connect(self, connection):
        self.events.append(("connect", connection))
        try:
            yield "client"
        finally:
            self.events.append(("closed",))

    def track_steps(self, total):
        self.events.append(("track", total))

    def record_metrics(self, record, schema=None):
        assert schema is None  # the journey's own record in metrics_schema.json
        self.events.append(("metrics", record))

    def summary(self, data):
        self.events.append(("summary", data))
        return data


class Counter:
    """An algorithm that counts: its state is the sum of the steps it trained."""

    log_keys = (("loss", ".2f"), ("eval/accuracy", ".1f"))

    def __init__(self, events):
        self.events, self.total = events, 0

    def start(self, client, run, stack):
        stack.callback(self.events.append, ("stack closed",))
        self.events.append(("start", client))
        return FakeTrainer(self.events)

    def restore(self, state):
        self.total = state["total"]

    def begin(self):
        self.events.append(("begin", self.total))

    def step(self, step):
        self.total += step
        return {"loss": 1.0 / step, "step": -1}  # the driver's step wins

    def evaluate(self, step):
        return {"eval/accuracy": step / 10}

    def state(self):
        return {"total": self.total}

    def finish(self, client):
        self.events.append(("finish", client))
        return {"total": self.total}


def kinds(events):
    return [e[0] for e in events]


def test_steps_records_evals_and_saves_in_order():
    events = []
    schedule = driver.Schedule(5, eval_every=2, ckpt_every=2)
    out = driver.drive(FakeRun(events), "local", Counter(events), schedule, profile_name="p")
    records = [e[1] for e in events if e[0] == "metrics"]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert all(r["time/step"] >= 0 for r in records)
    assert [r.get("eval/accuracy") for r in records] == [None, 0.2, None, 0.4, 0.5]  # and the last
    saves = [e for e in events if e[0] == "save"]
    assert [(s[1], s[2]["total"]) for s in saves] == [(2, 3), (4, 10)]  # not after the last
    # each save comes right after its step's record
    for save in saves:
        i = events.index(save)
        assert events[i - 1][0] == "metrics" and events[i - 1][1]["step"] == save[1]
    assert kinds(events)[:4] == ["connect", "start", "begin", "track"]
    assert kinds(events)[-4:] == ["finish", "stack closed", "closed", "summary"]
    assert out["profile"] == "p" and out["config_hash"] == "0123456789abcdef"
    assert out["total"] == 15 and out["resumed_from_step"] is None
    assert out["wall_time_s"] >= 0 and out["loop_time_s"] >= 0


def test_a_resume_loads_the_trainer_restores_the_state_and_trains_only_later_steps():
    events = []
    run = FakeRun(events, resume={"step": 3, "total": 6})
    out = driver.drive(run, "local", Counter(events), driver.Schedule(5, ckpt_last=True),
                       profile_name="p")  # fmt: skip
    assert kinds(events)[:4] == ["connect", "start", "load", "begin"]
    assert ("begin", 6) in events  # restored before begin
    assert [e[1]["step"] for e in events if e[0] == "metrics"] == [4, 5]
    assert [e[1] for e in events if e[0] == "save"] == [5]  # ckpt_last
    assert out["total"] == 15 and out["resumed_from_step"] == 3


def test_a_failing_step_closes_the_connection_and_writes_no_summary():
    events = []

    class Failing(Counter):
        def step(self, step):
            if step == 2:
                raise RuntimeError("boom")
            return super().step(step)

    with pytest.raises(RuntimeError, match="boom"):
        driver.drive(FakeRun(events), "local", Failing(events), driver.Schedule(3),
                     profile_name="p")  # fmt: skip
    assert kinds(events)[-2:] == ["stack closed", "closed"] and "summary" not in kinds(events)
    assert [e[1]["step"] for e in events if e[0] == "metrics"] == [1]


def test_stop_after_ends_like_an_interruption_after_that_steps_save():
    events = []
    run = FakeRun(events)
    run.path = "runs/x"
    schedule = driver.Schedule(4, ckpt_every=1, stop_after=2)
    out = driver.drive(run, "local", Counter(events), schedule, profile_name="p")
    assert out == {"stopped_after_step": 2, "run_dir": "runs/x"}
    assert [e[1] for e in events if e[0] == "save"] == [1, 2]
    assert kinds(events)[-2:] == ["stack closed", "closed"]  # no finish, no summary


@pytest.mark.parametrize("field", ["steps", "eval_every", "ckpt_every", "stop_after"])
def test_a_schedule_refuses_a_negative_or_non_integer_count_naming_it(field):
    with pytest.raises(ValueError, match=rf"Schedule.{field}=-1; an integer >= 0"):
        driver.Schedule(**{"steps": 1, field: -1})
    with pytest.raises(ValueError, match=rf"Schedule.{field}=True"):
        driver.Schedule(**{"steps": 1, field: True})


def test_the_policy_version_a_step_samples_with_and_trains_to():
    assert [driver.sampling_version(s) for s in (1, 2)] == [0, 1]
    assert [driver.trained_version(s) for s in (1, 2)] == [1, 2]


def test_the_step_line_shows_the_keys_a_record_holds_in_their_formats():
    keys = (("reward/mean", ".3f"), ("loss", ".4f"), ("eval/accuracy", ".2f"), ("tokens", ""))
    record = {"reward/mean": 0.25, "loss": 1.5, "tokens": 12, "step": 3}
    assert driver.step_line(record, keys) == "reward/mean 0.250 loss 1.5000 tokens 12"
    assert driver.step_line({}, keys) == ""
