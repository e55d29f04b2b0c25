"""The recipe contract, checked statically: ``cortex-recipes validate``.

Fast and offline: no model is loaded, no training module is imported (entry points are
resolved to files and parsed). Every journey in ``journeys.toml`` with ``status = "landed"``
is checked; a planned journey is skipped even when its folder already exists. Each problem is
one ``path: problem`` string, the path relative to the repository root.

What is checked, per landed journey:
- ``README.md`` has the required sections: a level-2 heading (``## ``, outside code fences)
  whose text, compared case-insensitively, is the section name or starts with it followed by
  a character that is not a letter or digit (``## Hardware (GPU profiles)`` counts as
  Hardware). Relative links and repository paths in its code resolve.
- The entry point and the qualify module resolve to files in the repository, parse, guard
  their work with ``if __name__ == "__main__":``, run no statement at import beyond
  definitions and assignments, and import only repository modules that exist and installed
  packages.
- Every ``configs/*.json`` parses, is listed as a profile, and builds sub-jobs that pass the
  SDK's own ``validate()`` (through the journey's ``profile_loader``; otherwise any
  ``sub_job_configs`` list goes through the SDK factories).
- ``recipe.yaml`` fits ``recipes/recipe.schema.json`` and agrees with ``journeys.toml``; every
  file it names exists; a dataset's ``sha256:`` revision matches the file.
- No mutable dependency reference (``@main``, ``:latest``, an unpinned ``git+`` URL or
  ``pip install``, ``uv sync``/``uv run`` without ``--frozen``/``--locked``) in recipe.yaml,
  README code or configs.
- A non-null ``last_validated`` is backed by an evidence record that exists, passed, has the
  same date and the current config's hash.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from cortex_recipes import journeys as journeys_lib
from cortex_recipes import schema
from cortex_recipes.journeys import Journey, JourneyError
from cortex_recipes.repo_checks.configs import check_configs, journey_loader
from cortex_recipes.repo_checks.entry_points import check_module
from cortex_recipes.repo_checks.readme import check_readme, repo_paths_problems
from cortex_recipes.repo_checks.records import dataset_problems, validation_problems
from cortex_recipes.repo_checks.references import mutable_problems

log = logging.getLogger(__name__)

RECIPE_SCHEMA = "recipes/recipe.schema.json"


def validate_repository(root: Path) -> list[str]:
    """Every problem in the repository's journeys, as ``path: problem`` lines."""
    root = root.resolve()
    try:
        journeys = journeys_lib.load_journeys(root)
    except JourneyError as exc:
        return [_relative(str(exc), root)]
    problems: list[str] = []
    try:
        recipe_schema = json.loads((root / RECIPE_SCHEMA).read_text())
    except (OSError, ValueError) as exc:
        return [f"{RECIPE_SCHEMA}: cannot be read: {exc}"]
    for journey in journeys:
        if not journey.landed:
            if journey.path(root).exists():
                log.info("%s: planned journey %r, not checked yet", journey.folder, journey.name)
            continue
        problems += validate_journey(root, journey, recipe_schema)
    problems += _unregistered_journeys(root, journeys)
    problems += _index_problems(root)
    return [_relative(p, root) for p in problems]


def _relative(message: str, root: Path) -> str:
    return message.replace(f"{root}/", "")


def validate_journey(root: Path, journey: Journey, recipe_schema: dict[str, Any]) -> list[str]:
    folder = journey.path(root)
    if not folder.is_dir():
        return [f"{journey.folder}: folder of landed journey {journey.name!r} does not exist"]
    problems = check_readme(root, folder / "README.md")
    problems += check_module(root, journey.entry_point, f"{journey.folder}: entry_point")
    if journey.qualify:
        problems += check_module(root, journey.qualify, f"{journey.folder}: qualify")
    recipe_path = folder / "recipe.yaml"
    where = f"{journey.folder}/recipe.yaml"
    try:
        recipe = journeys_lib.load_recipe(recipe_path)
    except JourneyError as exc:
        return [*problems, str(exc)]
    schema_problems = [f"{where}: {p}" for p in schema.validate(recipe, recipe_schema)]
    problems += schema_problems
    problems += mutable_problems(where, recipe_path.read_text())
    if recipe.get("entry_point") != journey.entry_point:
        problems.append(
            f"{where}: entry_point={recipe.get('entry_point')!r} differs from journeys.toml "
            f"entry_point={journey.entry_point!r}"
        )
    if recipe.get("smoke_command") != journey.smoke:
        problems.append(
            f"{where}: smoke_command={recipe.get('smoke_command')!r} differs from journeys.toml "
            f"smoke={journey.smoke!r}"
        )
    problems += repo_paths_problems(root, where, str(recipe.get("smoke_command", "")))
    problems += dataset_problems(folder, where, recipe)
    loader, loader_problems = journey_loader(journey)
    problems += loader_problems
    problems += check_configs(root, folder, recipe, loader)
    if not schema_problems:
        problems += validation_problems(folder, where, recipe, loader)
    return problems


# --- repository-wide ----------------------------------------------------------------------


def _unregistered_journeys(root: Path, journeys: list[Journey]) -> list[str]:
    known = {Path(j.folder) for j in journeys}
    return [
        f"{path.relative_to(root).as_posix()}: journey folder not listed in journeys.toml"
        for path in sorted((root / "recipes").glob("**/recipe.yaml"))
        if path.parent.relative_to(root) not in known
    ]


def _index_problems(root: Path) -> list[str]:
    index = root / journeys_lib.INDEX_FILE
    if not index.is_file():
        return [f"{journeys_lib.INDEX_FILE}: missing (run `cortex-recipes catalog sync`)"]
    try:
        current = journeys_lib.index_is_current(root)
    except JourneyError as exc:
        return [str(exc)]
    if not current:
        return [f"{journeys_lib.INDEX_FILE}: index is stale; run `cortex-recipes catalog sync`"]
    return []
