"""Qualification evidence: run a profile twice, check the outcome, record it, set last_validated.

A record is written only for a passing qualification; ``last_validated`` in ``recipe.yaml`` is
set from the record's date and points at it.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import yaml

PACKAGES = (
    "cortex-training",
    "torch",
    "transformers",
    "peft",
    "tokenizers",
    "renderers",
    "cortex-recipes",
)


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def git_revision() -> str | None:
    """HEAD, with ``+dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{head}+dirty" if dirty else head


def hardware() -> dict[str, Any]:
    return {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "accelerator": "none (CPU)",
    }


def sft_checks(runs: list[dict[str, Any]]) -> dict[str, bool]:
    """What a passing SFT qualification must show, from two runs of the same profile."""
    first = runs[0]
    before, after = first["eval_before"], first["eval_after"]
    return {
        "taught_behaviour_absent_before": before["held_out_hits"] == 0,
        "taught_behaviour_present_after": after["held_out_hits"] == after["held_out_total"],
        "controls_kept_after": all(c["ok"] for c in after["controls"]),
        "loss_fell": first["losses"][-1] < first["losses"][0],
        "deterministic_across_runs": all(
            r["losses"] == first["losses"] and r["eval_after"] == after for r in runs[1:]
        ),
    }


def record_evidence(
    recipe_dir: Path, profile_name: str, config_hash: str, runs: list[dict], checks: dict[str, bool]
) -> Path | None:
    """Write the evidence record and update recipe.yaml; return the record path if it passed."""
    passed = all(checks.values())
    today = dt.date.today().isoformat()
    record = {
        "profile": profile_name,
        "passed": passed,
        "date": today,
        "config_hash": config_hash,
        "git_revision": git_revision(),
        "checks": checks,
        "packages": package_versions(),
        "hardware": hardware(),
        "image_digest": os.environ.get("CORTEX_RECIPES_IMAGE_DIGEST"),
        "runs": runs,
    }
    evidence_dir = recipe_dir / "evidence"
    evidence_dir.mkdir(exist_ok=True)
    path = evidence_dir / f"{profile_name}.json"
    if not passed:
        failed = evidence_dir / f"{profile_name}.failed.json"
        failed.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        return None
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    set_last_validated(
        recipe_dir / "recipe.yaml", profile_name, today, path.relative_to(recipe_dir).as_posix()
    )
    return path


def set_last_validated(recipe_yaml: Path, profile_name: str, date: str, evidence: str) -> None:
    data = yaml.safe_load(recipe_yaml.read_text())
    profiles = {p["name"]: p for p in data["profiles"]}
    if profile_name not in profiles:
        raise KeyError(f"{recipe_yaml} has no profile named {profile_name!r}")
    profiles[profile_name].update(last_validated=date, evidence=evidence)
    dates = [p["last_validated"] for p in data["profiles"] if p.get("last_validated")]
    data["last_validated"] = max(dates) if dates else None
    recipe_yaml.write_text(yaml.safe_dump(data, sort_keys=False, width=100))


def opd_checks(distill: dict[str, Any], no_teacher: dict[str, Any]) -> dict[str, bool]:
    """A distillation run must bring the student closer to the teacher; teacher_tau=0 must not."""
    kl = distill["eval_teacher_reverse_kl"]
    flat = no_teacher["eval_teacher_reverse_kl"]
    return {
        "teacher_kl_fell": kl[-1] < kl[0] - 0.5,
        "teacher_contributed_every_step": all(t > 0 for t in distill["teacher_tokens"]),
        "tau0_no_teacher_contribution": all(t == 0 for t in no_teacher["teacher_tokens"]),
        "tau0_student_unchanged": max(flat) - min(flat) < 1e-6,
        "teacher_frozen": True,  # the run itself fails if the teacher's fingerprint changes
    }
