"""Qualification records and `cortex-recipes qualify <journey> <profile>` dispatch (no training)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import yaml

from cortex_recipes import cli, provenance, qualify, qualify_command, validate
from cortex_recipes.repo_checks import records
from tests.helpers import python_m
from tests.unit.recipe_fixtures import DEMO, write_demo_repository

pytestmark = pytest.mark.unit


@pytest.fixture
def demo(tmp_path):
    return write_demo_repository(tmp_path / "repo")


def _recipe(root) -> dict:
    return yaml.safe_load((root / DEMO / "recipe.yaml").read_text())


def test_demo_repository_passes_the_validator(demo):
    assert validate.validate_repository(demo) == []


def test_metrics_are_compared_with_their_ranges():
    expected = {
        "loss": {"description": "low", "max": 0.2},
        "hits": {"description": "all", "min": 3, "max": 3},
        "note": "a description only",
        "unreported": {"description": "must be measured", "min": 0},
    }
    result = qualify.compare_metrics({"loss": 0.25, "hits": 3, "speed": 1.5}, expected)
    assert result == {
        "hits": {"value": 3, "min": 3, "max": 3, "within": True},
        "loss": {"value": 0.25, "min": None, "max": 0.2, "within": False},
        "speed": {"value": 1.5, "min": None, "max": None, "within": None},
        "unreported": {"value": None, "min": 0, "max": None, "within": False},
    }


def test_passing_record_has_the_contract_fields_and_sets_last_validated(demo, monkeypatch):
    monkeypatch.setenv(provenance.IMAGE_DIGEST_ENV, "sha256:" + "a" * 64)
    path = qualify.record_evidence(
        demo / DEMO,
        "cpu",
        "0123456789abcdef",
        [{"x": 1}],
        {"ok": True},
        metrics={"final_loss": 0.5},
    )
    record = json.loads(path.read_text())
    today = dt.date.today().isoformat()
    assert set(records.RECORD_FIELDS) <= set(record)
    assert record["passed"] is True and record["date"] == today
    assert record["config_hash"] == "0123456789abcdef"
    assert record["metrics"] == {
        "final_loss": {"value": 0.5, "min": None, "max": 0.8, "within": True}
    }
    assert record["image_digest"] == "sha256:" + "a" * 64
    assert record["packages"]["cortex-training"] == "0.0.3"
    assert record["hardware"]["cpus"] >= 1
    recipe = _recipe(demo)
    assert recipe["profiles"][0]["last_validated"] == today
    assert recipe["profiles"][0]["evidence"] == "evidence/cpu.json"
    assert (recipe["last_validated"], recipe["evidence"]) == (today, "evidence/cpu.json")


def test_metric_outside_its_range_fails_the_record_and_leaves_recipe_yaml(demo, monkeypatch):
    monkeypatch.delenv(provenance.IMAGE_DIGEST_ENV, raising=False)
    before = (demo / DEMO / "recipe.yaml").read_text()
    path = qualify.record_evidence(
        demo / DEMO, "cpu", "0123456789abcdef", [], {"ok": True}, metrics={"final_loss": 0.9}
    )
    assert path is None
    failed = json.loads((demo / DEMO / "evidence" / "cpu.failed.json").read_text())
    assert failed["passed"] is False and failed["image_digest"] is None
    assert failed["metrics"]["final_loss"]["within"] is False
    assert (demo / DEMO / "recipe.yaml").read_text() == before


def test_qualify_command_is_the_journeys_qualify_module_with_the_profile_config(demo):
    command = qualify_command.qualification_command(demo, "demo", "cpu", ["connection=local"])
    assert command == python_m(
        "recipes.demo.qualify", "profile=recipes/demo/configs/cpu.json", "connection=local"
    )


def test_cli_qualify_records_evidence_that_the_validator_accepts(demo, capfd):
    assert cli.main(["qualify", "demo", "cpu", "--root", str(demo)]) == 0
    out = capfd.readouterr().out  # the qualify module's own output comes from a child process
    assert '"passed": true' in out and "updated recipes/README.md" in out
    record = json.loads((demo / DEMO / "evidence" / "cpu.json").read_text())
    assert record["passed"] is True
    assert record["config_hash"] == provenance.config_hash(
        json.loads((demo / DEMO / "configs" / "cpu.json").read_text())
    )
    assert _recipe(demo)["profiles"][0]["last_validated"] == record["date"]
    assert validate.validate_repository(demo) == []


def test_cli_qualify_failure_exits_non_zero_and_sets_nothing(demo):
    assert cli.main(["qualify", "demo", "cpu", "final_loss=0.9", "--root", str(demo)]) == 1
    assert not (demo / DEMO / "evidence" / "cpu.json").exists()
    assert _recipe(demo)["last_validated"] is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["qualify", "nope", "cpu"], "journey='nope' is not in journeys.toml; known: demo"),
        (["qualify", "demo", "gpu"], "profile='gpu' is not listed; known: cpu"),
    ],
)
def test_cli_qualify_names_what_is_unknown(demo, capsys, argv, message):
    assert cli.main([*argv, "--root", str(demo)]) == 2
    assert message in capsys.readouterr().err


def test_cli_qualify_refuses_a_journey_without_a_qualify_module(demo, capsys):
    toml = demo / "journeys.toml"
    toml.write_text(toml.read_text().replace('qualify = "recipes.demo.qualify"', 'qualify = ""'))
    assert cli.main(["qualify", "demo", "cpu", "--root", str(demo)]) == 2
    assert "has qualify='' (none yet)" in capsys.readouterr().err


def test_validator_rejects_last_validated_backed_by_a_failed_qualification(demo):
    qualify.record_evidence(demo / DEMO, "cpu", "x" * 16, [], {"ok": False})
    recipe = _recipe(demo)
    recipe["profiles"][0].update(last_validated="2026-01-01", evidence="evidence/cpu.failed.json")
    recipe.update(last_validated="2026-01-01", evidence="evidence/cpu.failed.json")
    (demo / DEMO / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    found = validate.validate_repository(demo)
    label = f"{DEMO}/recipe.yaml: profiles[cpu]"
    assert (
        f"{label}: last_validated='2026-01-01' but evidence 'evidence/cpu.failed.json' has passed=False"
        in found
    )


def test_a_record_carries_plots_of_its_runs_next_to_it(demo, tmp_path):
    run_dir = tmp_path / "run0"
    run_dir.mkdir()
    lines = [{"step": s, "loss": 1.0 / s, "eval/accuracy": 0.1 * s} for s in (1, 2, 3)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    gone = {"run_dir": str(tmp_path / "deleted")}  # a run folder that no longer exists
    runs = [{"run_dir": str(run_dir)}, {"smoke": [gone, {"run_dir": str(run_dir)}]}]
    path = qualify.record_evidence(
        demo / DEMO, "cpu", "0123456789abcdef", runs, {"ok": True}, metrics={"final_loss": 0.5}
    )
    record = json.loads(path.read_text())
    assert record["plots"] == ["evidence/plots/cpu/loss.png", "evidence/plots/cpu/eval.png"]
    for plot in record["plots"]:
        assert (demo / DEMO / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the journey README shows them; a second record replaces the block, never adds one
    readme = (demo / DEMO / "README.md").read_text()
    assert "![loss](evidence/plots/cpu/loss.png)" in readme
    qualify.record_evidence(demo / DEMO, "cpu", "0123456789abcdef", runs, {"ok": True},
                            metrics={"final_loss": 0.5})  # fmt: skip
    again = (demo / DEMO / "README.md").read_text()
    assert again.count(qualify.PLOTS_START) == 1 and again.count("## Latest qualification") == 1
    assert again.startswith(readme.split(qualify.PLOTS_START)[0])  # the text above is kept


def test_a_record_without_plottable_runs_has_no_plots_and_still_passes(demo):
    path = qualify.record_evidence(
        demo / DEMO,
        "cpu",
        "0123456789abcdef",
        [{"run_dir": "/nonexistent"}],
        {"ok": True},
        metrics={"final_loss": 0.5},
    )
    assert json.loads(path.read_text())["plots"] == []
