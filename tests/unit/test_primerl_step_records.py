"""A step whose prime-rl metrics line was lost (its orchestrator killed between its checkpoint
and that line) is re-derived from the episodes prime-rl shipped, or marked lost with the reason.

The recorded run (recipes/rl/async_grpo/primerl/recorded/: prime-rl 559b447's own
``metrics.jsonl`` and ``traces.jsonl`` files, lags 0, 1 and 2) is the ground truth."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from tests import extras

pytest.importorskip("msgspec", reason=extras.reason("grpo"))

from cortex_recipes.primerl import (
    records,  # noqa: E402
    step_records,  # noqa: E402
)

pytestmark = pytest.mark.unit

RECORDED = (
    Path(__file__).resolve().parents[2] / "recipes" / "rl" / "async_grpo" / "primerl" / "recorded"
)
KEYS = ("off_policy/mean", "off_policy/max", "train/agg/effective/agent/reward/mean")


def prime_rl_lines(path: Path = RECORDED / "metrics.jsonl") -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_records_rederived_from_shipped_episodes_equal_prime_rls_own_lines():
    theirs = prime_rl_lines()
    assert sorted(theirs) == [1, 2, 3]
    assert [theirs[s]["off_policy/max"] for s in (1, 2, 3)] == [0.0, 1.0, 2.0]  # lag varies
    for step in (1, 2, 3):
        derived = step_records.rederive(RECORDED, step)
        assert derived[step_records.SOURCE_KEY] == step_records.REDERIVED.format(step=step)
        for key in KEYS:
            assert derived[key] == pytest.approx(theirs[step][key]), (step, key)


class FakeRun:  # the narrow contract RunRecorder uses: record_metrics
    def __init__(self):
        self.records = []

    def record_metrics(self, record, schema):
        self.records.append(record)


def killed_before_its_line(tmp_path: Path, step: int, *, keep_episodes: bool = True) -> Path:
    """The recorded run's files as an orchestrator killed after step ``step``'s checkpoint
    leaves them: no metrics line for ``step``; its episodes file kept or not."""
    out = tmp_path / "outputs"
    shutil.copytree(RECORDED, out)
    lines = [line for line in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["step"] != step]  # fmt: skip
    (out / "metrics.jsonl").write_text("".join(x + "\n" for x in lines))
    if not keep_episodes:
        step_records.traces_path(out, step).unlink()
    return out


def recorder(out: Path, run: FakeRun) -> records.RunRecorder:
    rec = records.RunRecorder(run, out, interval=10, max_steps=10, state={}, wait_s=0.0)
    rec.save_point = lambda step: True  # resume points are tested in test_primerl_resume
    return rec


def test_a_step_without_its_line_gets_the_rederived_record_marked_as_such(tmp_path, caplog):
    out = killed_before_its_line(tmp_path, 3)
    run = FakeRun()
    with caplog.at_level(logging.WARNING, logger=records.log.name):
        recorder(out, run)({"step": 3, "loss": 0.1})
    (record,) = run.records
    truth = prime_rl_lines()[3]
    assert record[records.SOURCE] == step_records.REDERIVED.format(step=3)
    assert record["reward/mean"] == pytest.approx(truth["train/agg/effective/agent/reward/mean"])
    assert record["off_policy/max"] == 2 and record["off_policy/mean"] == pytest.approx(1.5)
    assert "step 3: prime-rl wrote no record; rederived from rollouts/step_3" in caplog.text


def test_a_step_with_its_line_is_prime_rls_own_and_unmarked(tmp_path):
    out = killed_before_its_line(tmp_path, 3)
    run = FakeRun()
    recorder(out, run)({"step": 2, "loss": 0.1})
    (record,) = run.records
    assert records.SOURCE not in record
    assert (
        record["primerl/off_policy/in_flight/max"]
        == prime_rl_lines()[2]["off_policy/in_flight/max"]
    )


def test_a_step_with_neither_is_marked_lost_naming_the_missing_file(tmp_path):
    out = killed_before_its_line(tmp_path, 2, keep_episodes=False)
    run = FakeRun()
    recorder(out, run)({"step": 2, "loss": 0.1})
    (record,) = run.records
    assert record[records.SOURCE] == step_records.LOST
    reason = record["primerl/record_lost_because"]
    assert "no step 2 record" in reason and "step_2/train/effective/traces.jsonl: missing" in reason
    assert "off_policy/max" not in record and "reward/mean" not in record


def test_a_dead_orchestrator_is_not_waited_for(tmp_path, monkeypatch):
    """With prime-rl's orchestrator gone, its line cannot come: one look, no waiting."""
    out = killed_before_its_line(tmp_path, 3)
    run = FakeRun()
    rec = records.RunRecorder(run, out, interval=10, max_steps=10, state={}, wait_s=3600.0)
    rec.save_point = lambda step: True
    rec.alive = lambda: False

    def no_sleep(_s):
        raise AssertionError("the recorder waited on a dead orchestrator")

    monkeypatch.setattr(records.time, "sleep", no_sleep)
    rec({"step": 3, "loss": 0.1})
    assert run.records[0][records.SOURCE].startswith("rederived")


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("{not json", ":1: not JSON"),
        ('{"run": {"work": {"policy": {"start": "3"}}}, "traces": []}',
         "run.work.policy.start='3'; an integer version"),
        ('{"run": {"work": {}}, "traces": [{"agent": {"name": "a"}, '
         '"rewards": {"correct": {"score": NaN, "weight": 1.0}}}]}',
         "traces[0].rewards.correct.score=nan; a finite number"),
        ('{"run": {"work": {}}, "traces": [{"agent": {}}]}', "traces[0].agent.name=None"),
        ('{"run": {"work": {}}, "traces": null}', "traces=None; a list"),
    ],
)  # fmt: skip
def test_a_malformed_episode_fails_naming_file_line_and_field(tmp_path, line, named):
    path = step_records.traces_path(tmp_path, 1)
    path.parent.mkdir(parents=True)
    path.write_text(line + "\n")
    with pytest.raises(step_records.StepRecordError) as err:
        step_records.rederive(tmp_path, 1)
    assert str(path) in str(err.value) and named in str(err.value)
    assert step_records.recover(tmp_path, 1)[step_records.SOURCE_KEY] == step_records.LOST


def test_an_empty_episodes_file_gives_no_record(tmp_path):
    path = step_records.traces_path(tmp_path, 4)
    path.parent.mkdir(parents=True)
    path.write_text("\n")
    with pytest.raises(step_records.StepRecordError, match="no episodes"):
        step_records.rederive(tmp_path, 4)
