"""Plots of runs' metrics.jsonl (cortex_recipes.plots, `cortex-recipes plot`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cortex_recipes import cli
from cortex_recipes.plots import PLOTS, PlotError, curve, plot_runs, run_labels
from tests.helpers import write_jsonl

pytestmark = pytest.mark.unit

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(path: Path, records: list[dict]) -> Path:
    path.mkdir(parents=True)
    write_jsonl(path / "metrics.jsonl", records)
    return path


def opd_records(kl_start: float) -> list[dict]:
    return [
        {"step": s, "loss": 0.1 * s, "teacher_reverse_kl": kl_start - s,
         "mismatch_kl/mean": None, "time/step": 1.0,
         **({"eval/teacher_reverse_kl": kl_start - 2 * s} if s % 2 == 0 else {})}
        for s in range(1, 5)
    ]  # fmt: skip


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_writes_the_plots_whose_keys_exist_and_skips_the_rest(tmp_path):
    a = write_run(tmp_path / "opd" / "teacher", opd_records(6.0))
    b = write_run(tmp_path / "opd" / "teacher-tau0", opd_records(5.0))
    written = plot_runs([a, b], tmp_path / "plots")
    # mismatch_kl is all null: no curve, so no file; reward and policy lag keys are absent.
    assert [p.name for p in written] == ["loss.png", "teacher_kl.png", "eval.png"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(p.name for p in written)
    for path in written:
        width, height = png_size(path)
        assert (width, height) == (750, 450)


def test_policy_lag_and_reward_plots_for_an_async_grpo_run(tmp_path):
    records = [
        {"step": s, "loss": 0.5, "reward/mean": s / 4, "off_policy/mean": 0.5, "off_policy/max": 1,
         "rollout_policy_versions": [s - 1, s], "rollouts/sha256": "ab" * 8}
        for s in range(1, 4)
    ]  # fmt: skip
    run = write_run(tmp_path / "grpo", records)
    names = [p.stem for p in plot_runs([run], tmp_path / "out")]
    assert names == ["loss", "reward", "policy_lag"]


def test_same_metrics_give_the_same_png(tmp_path):
    run = write_run(tmp_path / "run", opd_records(6.0))
    first = plot_runs([run], tmp_path / "one")[0].read_bytes()
    second = plot_runs([run], tmp_path / "two")[0].read_bytes()
    assert first == second


def test_curve_leaves_out_non_numbers():
    records = [{"step": 1, "loss": None}, {"step": 2, "loss": 2.0}, {"step": 3, "loss": True},
               {"loss": 1.0}, {"step": 4, "loss": 1}]  # fmt: skip
    assert curve(records, "loss") == ([2, 4], [2.0, 1.0])


def test_labels_name_each_run_and_tell_same_names_apart(tmp_path):
    assert run_labels([tmp_path / "a" / "x", tmp_path / "b" / "y"]) == ["x", "y"]
    assert run_labels([tmp_path / "a" / "x", tmp_path / "b" / "x"]) == ["a/x", "b/x"]


def test_a_folder_without_metrics_is_a_clear_error_and_nothing_is_written(tmp_path):
    good = write_run(tmp_path / "good", opd_records(6.0))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PlotError, match=r"'.*empty' has no metrics.jsonl"):
        plot_runs([good, empty], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(PlotError, match="is not a folder"):
        plot_runs([tmp_path / "missing"], tmp_path / "out")


def test_a_bad_line_names_the_file_and_line(tmp_path):
    run = write_run(tmp_path / "run", opd_records(6.0))
    with open(run / "metrics.jsonl", "a") as f:
        f.write("{not json\n")
    with pytest.raises(PlotError, match=r"metrics.jsonl:5 is not a JSON line"):
        plot_runs([run], tmp_path / "out")


def test_every_plotted_key_is_in_the_metrics_schema():
    from cortex_recipes.metrics import all_keys

    assert {k for p in PLOTS for k in p.keys} <= set(all_keys())


def test_cli_plot(tmp_path, capsys):
    run = write_run(tmp_path / "run", opd_records(6.0))
    assert cli.main(["plot", str(run)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(run / "plots" / f"{n}.png") for n in ("loss", "teacher_kl", "eval")]
    other = write_run(tmp_path / "other", opd_records(5.0))
    assert cli.main(["plot", str(run), str(other)]) == 2  # several runs need --out
    assert "--out is required" in capsys.readouterr().err
    assert cli.main(["plot", str(run), str(other), "--out", str(tmp_path / "cmp")]) == 0
    assert cli.main(["plot", str(tmp_path / "nothing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    bare = write_run(tmp_path / "bare", [{"step": 1, "time/step": 1.0}])
    assert cli.main(["plot", str(bare)]) == 1
