"""TensorBoard and offline W&B sinks (cortex_recipes.trackers), fed by Run.record_metrics."""

from __future__ import annotations

import json
import logging

import chz
import pytest

from cortex_recipes.run import RunConfig, open_run
from cortex_recipes.trackers import (
    Trackers,
    open_trackers,
    read_tensorboard_scalars,
    read_wandb_history,
    read_wandb_records,
    scalars,
)
from tests.unit.test_run import Profile  # the same stand-in profile the run tests use

pytestmark = pytest.mark.unit


@chz.chz
class Config(RunConfig):
    profile: str = "p.json"


def sft_record(step: int, loss: float) -> dict:
    return {
        "step": step, "loss": loss, "supervised_tokens": 4, "loss_weight_sum": 4.0,
        "dropped_examples": 0, "truncated_examples": 0, "grad_norm": None, "lr": 1e-4,
        "time/step": 0.1,
    }  # fmt: skip


def test_scalars_keep_numbers_only():
    record = {"step": 3, "loss": 1.5, "n": 2, "g": None, "ok": True, "v": [1], "d": "ab"}
    assert scalars(record) == {"loss": 1.5, "n": 2.0}


def test_tensorboard_dir_writes_event_files_every_journey_gets(tmp_path):
    config = Config(log_path=str(tmp_path / "run"), tensorboard_dir=str(tmp_path / "tb"))
    run = config.open_run("sft", Profile())
    for step, loss in ((1, 2.0), (2, 1.25), (3, 0.5)):
        run.metrics(**sft_record(step, loss))
    run.summary({"done": True})
    assert list((tmp_path / "tb").iterdir()) == [tmp_path / "tb" / "run"]
    back = read_tensorboard_scalars(tmp_path / "tb" / "run")
    assert back["loss"] == [(1, 2.0), (2, 1.25), (3, 0.5)]
    assert back["supervised_tokens"] == [(1, 4.0), (2, 4.0), (3, 4.0)]
    assert "grad_norm" not in back  # null on every step
    # metrics.jsonl holds the same records, unchanged.
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["loss"] for line in lines] == [2.0, 1.25, 0.5]


def test_a_corrupt_event_file_is_refused(tmp_path):
    trackers = open_trackers(tensorboard_dir=str(tmp_path / "tb"), run_dir=tmp_path / "r")
    trackers.log({"step": 1, "loss": 1.0})
    trackers.close()
    (event_file,) = (tmp_path / "tb" / "r").iterdir()
    data = bytearray(event_file.read_bytes())
    data[-6] ^= 0xFF  # inside the last record's body
    event_file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt record"):
        read_tensorboard_scalars(tmp_path / "tb")


def test_wandb_offline_run_directory_holds_the_logged_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = open_run(
        "sft", Profile(), Config(wandb_project="cortex-test"), log_path=str(tmp_path / "run-a")
    )
    assert [s.name for s in run.trackers.sinks] == ["wandb"]
    for step, loss in ((1, 2.0), (2, 1.0)):
        run.metrics(**sft_record(step, loss))
    run.summary({"done": True})
    (offline,) = (tmp_path / "wandb-dir" / "wandb").glob("offline-run-*")
    (log_file,) = offline.glob("run-*.wandb")
    records = read_wandb_records(log_file)
    (run_record,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run_record.project, run_record.display_name) == ("cortex-test", "run-a")
    rows = read_wandb_history(log_file)
    assert [(row["_step"], row["loss"], row["lr"]) for row in rows] == [
        (1, 2.0, 1e-4),
        (2, 1.0, 1e-4),
    ]
    assert "grad_norm" not in rows[0]
    assert rows[0]["time/step"] == 0.1


def test_a_tracker_that_cannot_start_warns_and_the_run_goes_on(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="cortex_recipes.trackers"):
        run = open_run(
            "sft", Profile(), Config(tensorboard_dir=str(blocker)), log_path=str(tmp_path / "r")
        )
    assert not run.trackers
    assert "tensorboard_dir=" in caplog.text and "TensorBoard is off" in caplog.text
    run.metrics(**sft_record(1, 1.0))
    assert (tmp_path / "r" / "metrics.jsonl").read_text().count("\n") == 1


class Broken:
    name = "broken"

    def __init__(self):
        self.calls = 0

    def log(self, step, values):
        self.calls += 1
        raise OSError("disk full")

    def close(self):
        raise AssertionError("a sink that failed is not closed")


class Counting:
    name = "counting"

    def __init__(self):
        self.rows, self.closed = [], False

    def log(self, step, values):
        self.rows.append((step, values))

    def close(self):
        self.closed = True


def test_a_failing_write_turns_that_tracker_off_and_keeps_the_others(caplog):
    broken, counting = Broken(), Counting()
    trackers = Trackers([broken, counting])
    with caplog.at_level(logging.WARNING, logger="cortex_recipes.trackers"):
        trackers.log({"step": 1, "loss": 1.0})
        trackers.log({"step": 2, "loss": 0.5})
    assert broken.calls == 1
    assert counting.rows == [(1, {"loss": 1.0}), (2, {"loss": 0.5})]
    assert caplog.text.count("broken log failed (OSError: disk full)") == 1
    trackers.close()
    assert counting.closed and not trackers


def test_no_tracker_fields_no_trackers(tmp_path):
    run = Config(log_path=str(tmp_path / "r")).open_run("sft", Profile())
    assert not run.trackers
    assert not (tmp_path / "r" / "wandb").exists()


def test_a_missing_package_warns_and_names_the_extra(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(__import__("sys").modules, "tensorboardX", None)  # import fails
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)
    with caplog.at_level(logging.WARNING, logger="cortex_recipes.trackers"):
        trackers = open_trackers(
            tensorboard_dir=str(tmp_path / "tb"), wandb_project="p", run_dir=tmp_path / "r"
        )
    assert not trackers
    assert "install the trackers extra (tensorboardX)" in caplog.text
    assert "install the trackers extra (wandb)" in caplog.text
