"""Qualify the synchronous Math GRPO example: it learns, and it is reproducible.

    python -m recipes.rl.math_grpo.qualify

Runs the CPU profile once (reward and greedy eval accuracy must rise) and the tiny smoke
profile twice (identical rewards, losses and rollout hashes). The record goes to
``evidence/<profile>.json`` and ``last_validated`` is set.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import chz

from cortex_recipes.intervals import bootstrap_mean
from cortex_recipes.qualify import record_evidence, work_dir
from cortex_recipes.rl.checks import eval_gain, learning_checks
from cortex_recipes.rl.grpo_profile import load_grpo_profile
from recipes.rl.math_grpo.train import Config as TrainConfig
from recipes.rl.math_grpo.train import main as train

RECIPE_DIR = Path(__file__).parent
SMOKE = "recipes/rl/math_grpo/configs/local-cpu-tiny-qwen3-smoke.json"


@chz.chz
class Config:
    profile: str = "recipes/rl/math_grpo/configs/local-cpu-smollm2-lora.json"


def rollout_hashes(run_dir: Path) -> list[str]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["rollouts/sha256"] for line in lines if line]


def main(config: Config) -> dict:
    profile = load_grpo_profile(config.profile)
    work = work_dir("qualify-math-grpo-")
    summary = train(TrainConfig(profile=config.profile, log_path=str(work / "run")))
    smokes = [
        train(TrainConfig(profile=SMOKE, log_path=str(work / f"smoke-{i}"), steps=2))
        for i in range(2)
    ]
    hashes = [rollout_hashes(work / f"smoke-{i}") for i in range(2)]
    checks = {
        **learning_checks(summary),
        "smoke_reproducible": smokes[0]["losses"] == smokes[1]["losses"]
        and smokes[0]["rewards"] == smokes[1]["rewards"]
        and hashes[0] == hashes[1],
    }
    evals = summary["eval_accuracy"]
    measured = {
        "eval_accuracy_before": bootstrap_mean("eval_accuracy_before", evals[0]["correct"]),
        "eval_accuracy_after": bootstrap_mean("eval_accuracy_after", evals[-1]["correct"]),
        "eval_accuracy_gain": eval_gain(summary),
        "reward_last_step": summary["rewards"][-1],
    }
    runs = [summary, {"smoke": smokes, "rollout_hashes": hashes}]
    path = record_evidence(
        RECIPE_DIR, profile.name, profile.config_hash, runs, checks, metrics=measured
    )
    print(json.dumps({"checks": checks, "evidence": str(path) if path else None}, indent=2))
    return {"checks": checks, "evidence": path}


if __name__ == "__main__":
    result = main(chz.entrypoint(Config))
    # a record passes only when every check holds and every measured metric is within its
    # expected range; record_evidence returns its path only then
    sys.exit(0 if result["evidence"] is not None else 1)
