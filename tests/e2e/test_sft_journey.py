"""The SFT journey end to end on the local backend (smoke profile), twice: same numbers."""

import json
from pathlib import Path

import pytest

from recipes.sft.conversational.train import Config, main
from tests import extras

pytestmark = [pytest.mark.e2e, extras.requires("sft")]

SMOKE = "recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json"  # the default: SmolLM2


def test_sft_smoke_runs_writes_metrics_and_is_deterministic(tmp_path, capsys):
    runs = [main(Config(profile=SMOKE, log_path=str(tmp_path / f"run{i}"))) for i in range(2)]
    assert "***** POST" not in capsys.readouterr().out  # the SDK's prints: debug.log
    assert (tmp_path / "run0" / "debug.log").is_file()
    assert runs[0]["losses"] == runs[1]["losses"]
    assert runs[0]["losses"][-1] < runs[0]["losses"][0]
    metrics = [
        json.loads(line) for line in (tmp_path / "run0" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["supervised_tokens"] > 0 and m["dropped_examples"] == 0 for m in metrics)
    checkpoint = json.loads((tmp_path / "run0" / "checkpoints.jsonl").read_text())
    assert (
        checkpoint["checkpoint_type"] == "weights-only"
        and "/checkpoints/cp_" in checkpoint["stage_path"]
    )
    summary = json.loads((tmp_path / "run0" / "summary.json").read_text())
    assert summary["final_loss"] == runs[0]["final_loss"]
    assert (tmp_path / "run0" / "backend" / "server.log").is_file()  # kept after the run
    assert list((tmp_path / "run0" / "backend").glob("jobs/*/checkpoints/cp_*/global_step3"))


def test_rerunning_a_finished_sft_run_returns_it_without_training_again(tmp_path):
    first = main(Config(profile=SMOKE, log_path=str(tmp_path)))
    metrics_before = (tmp_path / "metrics.jsonl").read_text()
    again = main(Config(profile=SMOKE, log_path=str(tmp_path)))  # if_exists=resume, the default
    assert again == first and (tmp_path / "metrics.jsonl").read_text() == metrics_before


def test_weighted_messages_are_scored_before_and_after_through_the_trainer(tmp_path):
    """The renderers path with per-message weights, on the tiny model (plumbing, not learning):
    both answers are scored per held-out item before the first step and after the last."""
    weighted = (
        Path(__file__).resolve().parents[2]
        / "recipes/sft/conversational/configs/local-cpu-smollm2-weighted-lora.json"
    )
    spec = json.loads(weighted.read_text())["eval"]
    block = {**spec, "prompts": spec["prompts"][:1], "controls": [], "max_tokens": 2}
    result = main(
        Config(
            profile=SMOKE,
            log_path=str(tmp_path),
            overrides=("dataset=data/weighted.jsonl", "steps=2", f"eval={json.dumps(block)}"),
        )
    )
    compared = result["weight_comparison"]
    n = len(spec["weight_comparison"]["full"]["prompts"])
    for side in ("full", "down"):
        assert len(compared["before"][side]) == len(compared["after"][side]) == n
        assert all(b < 0 for b in compared["before"][side])  # log-probabilities
        assert compared["before"][side] != compared["after"][side]  # training moved them
    assert compared["gain_difference"]["n"] == n
    assert (compared["full_weight"], compared["down_weight"]) == (1.0, 0.2)


def test_sft_trains_from_a_parquet_file_through_datasets_with_tensorboard(tmp_path):
    """The checked-in conversations as Parquet give the same run as the JSONL default; the
    run's TensorBoard events hold the metrics.jsonl losses."""
    import datasets

    from cortex_recipes.trackers import read_tensorboard_scalars

    jsonl = Path(SMOKE).resolve().parents[1] / "data" / "identity.jsonl"
    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    parquet = tmp_path / "identity.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))

    default = main(Config(profile=SMOKE, log_path=str(tmp_path / "jsonl")))
    from_parquet = main(
        Config(
            profile=SMOKE,
            log_path=str(tmp_path / "parquet"),
            overrides=(f"dataset={parquet}",),
            tensorboard_dir=str(tmp_path / "tb"),
        )
    )
    assert from_parquet["losses"] == default["losses"]
    config = json.loads((tmp_path / "parquet" / "config.json").read_text())
    assert config["profile"]["dataset"] == str(parquet)
    events = read_tensorboard_scalars(tmp_path / "tb" / "parquet")
    assert [value for _, value in events["loss"]] == pytest.approx(from_parquet["losses"])
