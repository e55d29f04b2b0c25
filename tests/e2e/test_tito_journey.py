"""The TITO journey end to end on the local backend (tiny-qwen3, a short warm start).

With so short a warm start the model rarely calls the tool. Multi-turn bridging is pinned by
tests/contract/test_tito_contract.py with the real client and renderer; here the point is the
whole loop: gateway -> TrainClient -> episodes -> action-masked grpo step -> checkpoint ->
resume with the same batches and masks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import extras

pytest.importorskip("verifiers", reason=extras.reason("tito"))

from cortex_recipes.run import RunCheckpoints
from recipes.agentic.tito.qualify import copy_run_until
from recipes.agentic.tito.train import Config, main

pytestmark = pytest.mark.e2e

PROFILE = "recipes/agentic/tito/configs/local-cpu-tiny-qwen3-smoke.json"


def test_tito_run_trains_on_action_masks_and_resumes_with_the_same_masks(tmp_path):
    full = main(
        Config(profile=PROFILE, log_path=str(tmp_path / "full"), warm_start_steps=4, steps=3)
    )
    assert full["steps"] == [1, 2, 3]
    assert all(n > 0 for n in full["trainable_tokens"])
    assert full["renderer_check"]["renderer"] == "Qwen3Renderer"
    assert RunCheckpoints(tmp_path / "full" / "checkpoints").steps() == [0, 1, 2, 3]
    records = [
        json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    ]
    assert all(r["episodes"] == 4 and r["loss"] is not None for r in records)
    written = [
        json.loads(x) for x in (tmp_path / "full" / "rollouts.jsonl").read_text().splitlines()
    ]
    assert sorted({r["step"] for r in written if r["group"] == 0}) == [1, 2, 3]
    assert all(r["turns"] and isinstance(r["tool_calls"], list) for r in written)
    assert all(r["turns"][0]["prompt_ids"] == r["prompt_ids"] for r in written)

    copy_run_until(tmp_path / "full", tmp_path / "resumed", 1)
    resumed = main(
        Config(profile=PROFILE, log_path=str(tmp_path / "resumed"), warm_start_steps=4, steps=3)
    )
    assert resumed["resumed_from_step"] == 1
    assert resumed["steps"] == [1, 2, 3]
    assert resumed["mask_sha256"] == full["mask_sha256"]
    assert resumed["rewards"] == full["rewards"]


def test_interrupted_run_stops_after_the_asked_step_and_can_be_resumed(tmp_path):
    run_dir = tmp_path / "run"
    stopped = main(
        Config(
            profile=PROFILE,
            log_path=str(run_dir),
            warm_start_steps=2,
            steps=2,
            stop_after_step=1,
        )
    )
    assert stopped["stopped_after_step"] == 1
    assert RunCheckpoints(run_dir / "checkpoints").steps() == [0, 1]
    finished = main(Config(profile=PROFILE, log_path=str(run_dir), warm_start_steps=2, steps=2))
    assert finished["resumed_from_step"] == 1 and finished["steps"] == [1, 2]
    assert len(Path(run_dir / "metrics.jsonl").read_text().splitlines()) == 2


def write_questions(path: Path, rows: list[tuple[str, str, str]]) -> str:
    ask = "Which of the two was founded first?"
    path.write_text(
        "".join(
            json.dumps({"first": a, "second": b, "ask": ask, "answer": c}) + "\n"
            for a, b, c in rows
        )
    )
    return str(path)


def test_a_comparison_run_resumes_on_the_episodes_and_sampler_its_checkpoint_saved(tmp_path):
    """Two-lookup questions on the towns glossary; the resume trains on the saved episodes (a
    changed mask in them is refused) and plays on from the saved sampler state."""
    from cortex_recipes.tito.schedule import ScheduleError

    towns = [
        json.loads(x)
        for x in Path("recipes/agentic/tito/data/towns.jsonl").read_text().splitlines()
    ]
    names = [t["name"] for t in towns[:6]]
    questions = write_questions(
        tmp_path / "q.jsonl", [(names[0], names[1], names[0]), (names[2], names[3], names[3]),
                               (names[4], names[5], names[5])],
    )  # fmt: skip
    held_out = write_questions(tmp_path / "h.jsonl", [(names[1], names[2], names[2])])
    overrides = (
        "tasks=data/towns.jsonl", f"questions={questions}", f"eval_questions={held_out}",
        "rl.max_turns=4", "rl.play_together=4",
    )  # fmt: skip

    def run(folder: str, **kw):
        return main(
            Config(profile=PROFILE, log_path=str(tmp_path / folder), warm_start_steps=4,
                   steps=3, overrides=overrides, **kw)
        )  # fmt: skip

    full = run("full")
    assert full["steps"] == [1, 2, 3] and full["eval_tasks"] == 1
    assert len(full["eval_before_rl"]["rewards"]) == 1
    saved = RunCheckpoints(tmp_path / "full" / "checkpoints").load(1)["state"]
    assert saved["pending"]["step"] == 2
    assert sum(len(g) for g in saved["pending"]["groups"]) == 4  # 2 tasks x group 2
    # steps 1 and 2 drew two of the three tasks each: the second draw crossed into epoch 1
    assert (saved["sampler"]["epoch"], saved["sampler"]["cursor"]) == (1, 1)

    copy_run_until(tmp_path / "full", tmp_path / "resumed", 1)
    resumed = run("resumed")
    assert resumed["resumed_from_step"] == 1 and resumed["resumed_on_saved_episodes"] is True
    assert resumed["mask_sha256"] == full["mask_sha256"]
    assert resumed["losses"][1:] == pytest.approx(full["losses"][1:], abs=1e-6)

    copy_run_until(tmp_path / "full", tmp_path / "tampered", 1)
    state_file = tmp_path / "tampered" / "checkpoints" / "step_1" / "state.json"
    state = json.loads(state_file.read_text())
    mask = state["state"]["pending"]["groups"][0][0]["sampled_mask"]
    mask[mask.index(0)] = 1  # a context token turned into a trained one
    state_file.write_text(json.dumps(state))
    with pytest.raises(ScheduleError, match="the saved rows or action masks were changed"):
        run("tampered")
