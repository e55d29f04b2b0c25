"""Qualify an OPD profile; record evidence.

    python -m recipes.distillation.on_policy.qualify                     # the Snowflake task
    python -m recipes.distillation.on_policy.qualify profile=recipes/distillation/on_policy/configs/local-cpu-smollm2-teacher.json

A profile with a task reward runs twice: as itself and as its ``teacher_tau=0`` comparison
(``<profile>-tau0.json`` next to it, or ``comparison=``), which must differ from it in
``teacher_tau`` and ``name``/``description`` only. Both share the teacher: a ``teacher_sft``
teacher is trained once, afresh, in the qualification's folder. A pure distillation profile
(no reward) runs once. The checks and metrics are in ``checks.py`` beside it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import chz

from cortex_recipes import qualify
from cortex_recipes.distill.opd_profile import load_opd_profile
from cortex_recipes.run import runs_root
from recipes.distillation.on_policy import checks as opd_checks
from recipes.distillation.on_policy.train import Config, main

RECIPE_DIR = Path(__file__).resolve().parent
CONFIGS = "recipes/distillation/on_policy/configs"
SAME_EXCEPT = ("name", "description", "teacher_tau")


@chz.chz
class QualifyConfig:
    profile: str = f"{CONFIGS}/local-cpu-smollm2-snowflake.json"
    comparison: str = chz.field(
        default="", doc="the teacher_tau=0 comparison (default: <profile>-tau0.json)"
    )
    connection: str = "local"


def comparison_path(config: QualifyConfig) -> Path:
    """The comparison profile, refused unless it is the profile with ``teacher_tau=0``."""
    path = Path(config.comparison or Path(config.profile).with_name(
        Path(config.profile).stem + "-tau0.json"))  # fmt: skip
    profile, other = load_opd_profile(config.profile), load_opd_profile(path)
    differs = sorted(
        k for k in set(profile.raw) | set(other.raw)
        if k not in SAME_EXCEPT and profile.raw.get(k) != other.raw.get(k)
    )  # fmt: skip
    if differs or other.teacher_tau != 0:
        raise SystemExit(
            f"comparison={str(path)!r} must be profile={config.profile!r} with teacher_tau=0; "
            f"it has teacher_tau={other.teacher_tau} and differs in {differs}"
        )
    return path


def run(config: QualifyConfig) -> int:
    profile = load_opd_profile(config.profile)
    root = runs_root() / "qualify" / profile.name
    compared = comparison_path(config) if profile.reward is not None else None

    def train(path: str | Path, folder: str) -> dict:
        return main(
            Config(
                profile=str(path),
                connection=config.connection,
                log_path=str(root / folder),
                teacher_run=str(root / "teacher-sft") if profile.teacher_sft else "",
                if_exists="overwrite",  # a qualification always trains afresh
            )
        )

    if profile.teacher_sft and (root / "teacher-sft").exists():
        import shutil

        shutil.rmtree(root / "teacher-sft")  # the teacher, too, is trained afresh
    runs = [train(config.profile, "distill")]
    if compared is not None:
        runs.append(train(compared, "tau0"))
    checks = opd_checks.checks(*runs)
    path = qualify.record_evidence(
        RECIPE_DIR,
        profile.name,
        profile.config_hash,
        runs,
        checks,
        metrics=opd_checks.metrics(*runs),
    )
    print(json.dumps({"profile": profile.name, "passed": path is not None, "checks": checks}))
    return 0 if path is not None else 1


if __name__ == "__main__":
    sys.exit(run(chz.entrypoint(QualifyConfig)))
