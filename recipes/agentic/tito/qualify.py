"""Qualify the TITO journey: tool episodes, action masks, a step, checkpoints, exact resume.

    python -m recipes.agentic.tito.qualify

1. Run the profile uninterrupted: warm start, then ``rl.steps`` RL steps, with a checkpoint
   after every step.
2. Copy that run as it stood after step ``resume_after``: its checkpoints up to there and the
   backend state. Resume the copy to the end.
3. Check the result:
   - the renderer passed the extension check;
   - after the warm start, the model calls the tool on its own;
   - every RL step has multi-turn episodes (mean model turns >= 1.5), model-generated tool calls
     and non-empty action masks;
   - the optimiser stepped and checkpoints were saved;
   - the resumed run's batches, action masks included, hash the same as the uninterrupted
     run's for every step after the resume.

The record goes to ``evidence/<profile>.json`` and ``last_validated`` is set.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import chz

from cortex_recipes.qualify import record_evidence, work_dir
from cortex_recipes.tito.profile import load_tito_profile
from recipes.agentic.tito.train import Config as TrainConfig
from recipes.agentic.tito.train import main as train

RECIPE_DIR = Path(__file__).parent


@chz.chz
class Config:
    profile: str = "recipes/agentic/tito/configs/local-cpu-tiny-qwen3.json"
    resume_after: int = 2


def copy_run_until(source: Path, target: Path, step: int) -> None:
    shutil.copytree(source, target)
    for directory in (target / "checkpoints").glob("step_*"):
        if int(directory.name.removeprefix("step_")) > step:
            shutil.rmtree(directory)
    (target / "summary.json").unlink(missing_ok=True)


def tito_checks(full: dict, resumed: dict, resume_after: int, steps: int) -> dict[str, bool]:
    return {
        "renderer_extends_turns": full["renderer_check"]["turns"] >= 2,
        "warm_start_loss_fell": full["warm_start"]["final_loss"] < full["warm_start"]["first_loss"],
        "model_calls_the_tool_after_warm_start": full["eval_before_rl"]["called_tool"] >= 0.8,
        "multi_turn_episodes_every_step": all(t >= 1.5 for t in full["model_turns"]),
        "model_generated_tool_turns_every_step": all(t > 0 for t in full["tool_turns"]),
        "non_empty_action_masks_every_step": all(n > 0 for n in full["trainable_tokens"]),
        "all_steps_ran": full["steps"] == list(range(1, steps + 1)),
        "resumed_from_checkpoint": resumed["resumed_from_step"] == resume_after,
        "resumed_steps_complete": resumed["steps"] == list(range(1, steps + 1)),
        "same_masks_after_resume": resumed["mask_sha256"] == full["mask_sha256"],
    }


def main(config: Config) -> dict:
    profile = load_tito_profile(config.profile)
    steps = profile.rl.steps
    work = work_dir("qualify-tito-")
    full = train(TrainConfig(profile=config.profile, log_path=str(work / "full")))
    copy_run_until(work / "full", work / "resumed", config.resume_after)
    resumed = train(TrainConfig(profile=config.profile, log_path=str(work / "resumed")))
    checks = tito_checks(full, resumed, config.resume_after, steps)
    measured = {
        "called_tool_after_warm_start": full["eval_before_rl"]["called_tool"],
        "model_turns_per_episode": min(full["model_turns"]),
        "reward_after_rl": full["eval_after_rl"]["reward"],
    }
    path = record_evidence(
        RECIPE_DIR, profile.name, profile.config_hash, [full, resumed], checks, metrics=measured
    )
    print(json.dumps({"checks": checks, "evidence": str(path) if path else None}, indent=2))
    return {"checks": checks, "evidence": path}


if __name__ == "__main__":
    result = main(chz.entrypoint(Config))
    # a record passes only when every check holds and every measured metric is within its
    # expected range; record_evidence returns its path only then
    sys.exit(0 if result["evidence"] is not None else 1)
