"""What a journey prints when its run ends (issue 46's first-run confusions): the result, where
the run lives and how to go on, for every journey; OPD says what its KL estimate is and, with a
``teacher_sft`` profile, trains its teacher inside its own run folder unless told otherwise."""

from __future__ import annotations

import json

import pytest

from tests import extras

pytestmark = [pytest.mark.unit, extras.requires("sft", "opd", "grpo", "tito")]

RUN_DIR = "/tmp/runs/x/run-0"


def reports():
    from recipes.agentic.tito import train as tito
    from recipes.distillation.on_policy import train as opd
    from recipes.rl.async_grpo import train as async_grpo
    from recipes.rl.math_grpo import train as math_grpo

    common = {"profile": "p", "run_dir": RUN_DIR, "wall_time_s": 1.0}
    return {
        "opd": (opd.summary_line, {**common, "eval_teacher_reverse_kl": [0.5, -0.01]}),
        "tito": (tito.summary_line, {**common, "rewards": [0.1]}),
        "math_grpo": (math_grpo.summary_line, {**common, "eval_accuracy": [], "rewards": []}),
        "async_grpo": (
            async_grpo.summary_line,
            {
                **common,
                "orchestrator": "prime-rl",
                "eval_accuracy": [],
                "losses": [],
                "published_versions": [0],
            },
        ),  # fmt: skip
    }


@pytest.mark.parametrize("journey", ["opd", "tito", "math_grpo", "async_grpo"])
def test_every_journey_ends_with_its_run_directory_and_how_to_resume(journey):
    report, result = reports()[journey]
    lines = report(result).splitlines()
    assert json.loads(lines[0])["profile"] == "p"  # the result first, as one JSON line
    assert f"run directory: {RUN_DIR} (metrics.jsonl, summary.json, debug.log)" in lines
    assert any(line.startswith("rerun the same command to resume it") for line in lines)


def test_opd_says_its_kl_is_a_per_token_estimate_and_how_to_export():
    report, result = reports()["opd"]
    text = report(result)
    assert "per-token estimate" in text and "can be below 0" in text
    assert f"cortex-recipes export {RUN_DIR} <out dir>" in text


def test_a_stopped_run_prints_what_the_driver_returned():
    for report, _ in reports().values():
        stopped = {"stopped_after_step": 2, "run_dir": RUN_DIR}
        assert json.loads(report(stopped)) == stopped


def test_the_opd_teacher_is_trained_inside_the_opd_run_folder_by_default(monkeypatch, tmp_path):
    """Not in the SFT journey's runs/sft/<profile> (another journey's folder); a
    ``teacher_run`` still names any folder, the SFT journey's run included."""
    from recipes.distillation.on_policy import teacher_sft, train

    asked = []

    def prepare(name, model, *, connection, run_dir):
        asked.append(run_dir)
        raise RuntimeError("stop here")  # only the folder is under test

    monkeypatch.setattr(teacher_sft, "prepare", prepare)

    class Run:
        path = tmp_path / "opd-run"

    profile = type("P", (), {"teacher_sft": "t", "teacher_model": "m"})()
    for teacher_run, expected in (("", tmp_path / "opd-run" / "teacher-sft"),
                                  ("runs/sft/t", "runs/sft/t")):  # fmt: skip
        config = type("C", (), {"connection": "local", "teacher_run": teacher_run})()
        with pytest.raises(RuntimeError, match="stop here"):
            train.OPD(config, profile, Run(), 2)
        assert asked[-1] == expected
