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
        Config(profile=PROFILE, log_path=str(tmp_path / "full"), warm_start_steps=4, rl_steps=3)
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
        Config(profile=PROFILE, log_path=str(tmp_path / "resumed"), warm_start_steps=4, rl_steps=3)
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
            rl_steps=2,
            stop_after_step=1,
        )
    )
    assert stopped["stopped_after_step"] == 1
    assert RunCheckpoints(run_dir / "checkpoints").steps() == [0, 1]
    finished = main(Config(profile=PROFILE, log_path=str(run_dir), warm_start_steps=2, rl_steps=2))
    assert finished["resumed_from_step"] == 1 and finished["steps"] == [1, 2]
    assert len(Path(run_dir / "metrics.jsonl").read_text().splitlines()) == 2
