"""Qualify one SFT profile: run it twice, check the outcome, record evidence.

python -m recipes.sft.conversational.qualify profile=recipes/sft/conversational/configs/local-cpu-smollm2-lora.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import chz

from cortex_recipes import qualify, sft
from cortex_recipes.profiles import ProfileError
from cortex_recipes.run import runs_root
from recipes.sft.conversational import checks as sft_checks
from recipes.sft.conversational.train import Config, main

RECIPE_DIR = Path(__file__).resolve().parent


@chz.chz
class QualifyConfig:
    profile: str
    connection: str = "local"
    runs: int = 2


def run(config: QualifyConfig) -> int:
    profile = sft.load_profile(config.profile)
    if profile.eval is None:
        raise ProfileError(
            f"{config.profile}: qualification needs an eval block (held-out prompts to check)"
        )
    summaries = [
        main(
            Config(
                profile=config.profile,
                connection=config.connection,
                log_path=str(runs_root() / "qualify" / profile.name / f"run{i}"),
                if_exists="overwrite",  # a qualification always trains afresh
            )
        )
        for i in range(config.runs)
    ]
    checks = sft_checks.sft_checks(
        summaries, weight_comparison=profile.eval.weight_comparison is not None
    )
    path = qualify.record_evidence(
        RECIPE_DIR,
        profile.name,
        profile.config_hash,
        summaries,
        checks,
        metrics=sft_checks.sft_metrics(summaries),
    )
    print(
        json.dumps(
            {
                "profile": profile.name,
                "passed": path is not None,
                "checks": checks,
                "evidence": str(path),
            }
        )
    )
    return 0 if path is not None else 1


if __name__ == "__main__":
    sys.exit(run(chz.entrypoint(QualifyConfig)))
