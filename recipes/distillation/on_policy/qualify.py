"""Qualify the CPU distillation profile against its teacher_tau=0 comparison; record evidence.

python -m recipes.distillation.on_policy.qualify
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import chz

from cortex_recipes import qualify
from cortex_recipes.distill.profile import load_opd_profile
from cortex_recipes.run import runs_root
from recipes.distillation.on_policy.train import Config, main

RECIPE_DIR = Path(__file__).resolve().parent
CONFIGS = "recipes/distillation/on_policy/configs"


@chz.chz
class QualifyConfig:
    profile: str = f"{CONFIGS}/local-cpu-smollm2-teacher.json"
    comparison: str = f"{CONFIGS}/local-cpu-smollm2-teacher-tau0.json"
    connection: str = "local"


def run(config: QualifyConfig) -> int:
    profile = load_opd_profile(config.profile)
    distill = main(
        Config(
            profile=config.profile,
            connection=config.connection,
            log_path=str(runs_root() / "qualify" / profile.name),
            if_exists="overwrite",  # a qualification always trains afresh
        )
    )
    no_teacher = main(
        Config(
            profile=config.comparison,
            connection=config.connection,
            log_path=str(runs_root() / "qualify" / f"{profile.name}-tau0"),
            if_exists="overwrite",
        )
    )
    checks = qualify.opd_checks(distill, no_teacher)
    path = qualify.record_evidence(
        RECIPE_DIR,
        profile.name,
        profile.config_hash,
        [distill, no_teacher],
        checks,
        metrics=qualify.opd_metrics(distill, no_teacher),
    )
    print(json.dumps({"profile": profile.name, "passed": path is not None, "checks": checks}))
    return 0 if path is not None else 1


if __name__ == "__main__":
    sys.exit(run(chz.entrypoint(QualifyConfig)))
