"""A journey's ``configs/*.json``: each parses, is listed as a profile, and builds sub-jobs
that pass the SDK's own ``validate()``."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cortex_recipes import journeys as journeys_lib
from cortex_recipes.journeys import Journey, JourneyError
from cortex_recipes.provenance import config_hash
from cortex_recipes.qualify import nested_values
from cortex_recipes.repo_checks.references import mutable_problems
from cortex_recipes.sub_jobs import SubJobError, build_sub_jobs

log = logging.getLogger(__name__)


def journey_loader(journey: Journey):
    try:
        return journeys_lib.profile_loader(journey), []
    except JourneyError as exc:
        return None, [str(exc)]


def _strings(value: Any) -> Iterator[str]:
    return (v for v in nested_values(value) if isinstance(v, str))


def profile_config_hash(config: Path, loader) -> str:
    """The hash an evidence record must carry for ``config`` as it is now."""
    if loader is not None:
        return loader(config).config_hash
    return config_hash(json.loads(config.read_text()))


def check_configs(root: Path, folder: Path, recipe: dict[str, Any], loader) -> list[str]:
    configs = sorted((folder / "configs").glob("*.json"))
    rel = folder.relative_to(root).as_posix()
    if not configs:
        return [f"{rel}/configs: holds no JSON config"]
    listed = {p.get("config") for p in journeys_lib.recipe_profiles(recipe)}
    problems = []
    for config in configs:
        where = config.relative_to(root).as_posix()
        if f"configs/{config.name}" not in listed:
            problems.append(f"{where}: not listed as a profile in {rel}/recipe.yaml")
        try:
            raw = json.loads(config.read_text())
        except ValueError as exc:
            problems.append(f"{where}: not valid JSON: {exc}")
            continue
        if not isinstance(raw, dict):
            problems.append(f"{where}: must hold a JSON object")
            continue
        for text in _strings(raw):
            problems += mutable_problems(where, text)
            relative = re.fullmatch(r"(data|configs|evidence)/[\w./-]+", text)
            if relative and not (folder / text).exists():
                problems.append(f"{where}: {text!r} does not exist in {rel}")
        problems += _sub_job_problems(where, raw, config, loader)
    return problems


def _sub_job_problems(where: str, raw: dict[str, Any], config: Path, loader) -> list[str]:
    problems = []
    for key in ("sub_job_configs", "sub_jobs"):
        if key in raw:
            try:
                build_sub_jobs(raw[key], key)
            except SubJobError as exc:
                problems.append(f"{where}: {exc}")
    if loader is None:
        return problems
    try:
        sub_jobs = loader(config).sub_jobs()
        for i, sub_job in enumerate(sub_jobs):
            try:
                sub_job.validate()
            except (TypeError, ValueError) as exc:
                problems.append(f"{where}: sub-job {i} ({sub_job.job_type.value}): {exc}")
        if sum(s.job_type.value == "training" for s in sub_jobs) > 1:
            problems.append(f"{where}: more than one training sub-job")
    except (AttributeError, TypeError, ValueError, KeyError) as exc:  # ProfileError: ValueError
        problems.append(f"{where}: the profile loader rejects it: {exc}")
    return problems
