"""``cortex-recipes qualify``: which command qualifies a journey profile, whether its hub
weights verify first, which profile this machine runs (``auto``), the stale records to run
again (``--stale``), and where the evidence goes (``--out``)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from cortex_recipes.journeys import JourneyError

log = logging.getLogger("cortex_recipes.cli")


def qualification_command(root: Path, journey_name: str, profile_name: str, extra: list[str]):
    """The ``python -m <qualify module> profile=<config> ...`` command for a journey profile."""
    from cortex_recipes import journeys

    journey = journeys.get_journey(root, journey_name)
    if not journey.qualify:
        raise JourneyError(f"journeys.toml: journey {journey.name!r} has qualify='' (none yet)")
    recipe_yaml = journey.path(root) / "recipe.yaml"
    recipe = journeys.load_recipe(recipe_yaml)
    profile = journeys.get_profile(recipe, profile_name, f"{journey.folder}/recipe.yaml")
    config = Path(journey.folder, profile["config"]).as_posix()
    return [sys.executable, "-m", journey.qualify, f"profile={config}", *extra]


def stale_targets(root: Path) -> list[tuple[str, str]]:
    """(journey, profile) pairs whose evidence is stale, once each, in journeys.toml order."""
    from cortex_recipes.repo_checks.records import stale_records

    targets: list[tuple[str, str]] = []
    for record in stale_records(root):
        if (record.journey, record.profile) not in targets:
            targets.append((record.journey, record.profile))
    return targets


def profile_hub_models(root: Path, journey_name: str, profile_name: str) -> list[str]:
    """The hub models (model-catalog/models.json ``source: hub``) a profile's config names."""
    import json

    from cortex_recipes import journeys
    from cortex_recipes.weights import CATALOG_MODELS, load_pins

    journey = journeys.get_journey(root, journey_name)
    recipe = journeys.load_recipe(journey.path(root) / "recipe.yaml")
    profile = journeys.get_profile(recipe, profile_name, f"{journey.folder}/recipe.yaml")
    raw = json.loads((journey.path(root) / profile["config"]).read_text())
    if not (root / CATALOG_MODELS).is_file():
        return []  # a repository without a model catalog names no hub models
    hub = load_pins(root)
    from cortex_recipes.qualify import nested_values

    found: list[str] = []
    for value in nested_values(raw):
        if isinstance(value, str) and value in hub and value not in found:
            found.append(value)
    return found


def weight_problems(root: Path, journey_name: str, profile_name: str) -> list[str]:
    """Every problem ``models verify`` finds in the hub weights a profile needs."""
    from cortex_recipes.weights import verify

    problems: list[str] = []
    for name in profile_hub_models(root, journey_name, profile_name):
        problems += verify(root, name)[1]
    return problems


def _cuda_visible() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception as exc:  # a broken CUDA setup means the CPU profile
        log.warning("cannot query CUDA: %s", exc)
        return False


def qualify(
    root: Path, journey: str, profile: str, overrides: list[str], out: str | None, stale: bool
) -> int:
    """``cortex-recipes qualify``: one journey profile (``auto``: the one this machine can run),
    or with ``stale`` every profile whose evidence no longer describes the code."""
    from cortex_recipes import journeys
    from cortex_recipes.qualify import select_profile

    if stale:
        if journey or (profile and profile != "auto"):
            raise JourneyError(
                "qualify --stale re-runs every stale record; give no journey or profile with it"
            )
        targets = stale_targets(root)
        if not targets:
            print("no stale evidence: every last_validated is backed by a current record")
            return 0
        for journey_name, profile_name in targets:
            print(f"re-qualifying {journey_name} {profile_name}")
            code = qualify_one(root, journey_name, profile_name, list(overrides), out)
            if code != 0:
                return code
        return 0
    if not journey:
        raise JourneyError("qualify needs a journey (and a profile, or auto), or --stale")
    profile = profile or "auto"
    if "=" in profile:  # `qualify sft key=value`: an override, not a profile name
        overrides = [profile, *overrides]
        profile = "auto"
    if profile == "auto":
        recipe = journeys.load_recipe(
            journeys.get_journey(root, journey).path(root) / "recipe.yaml"
        )
        try:
            profile, why = select_profile(
                recipe,
                cuda=_cuda_visible(),
                weights_ready=lambda name: weight_problems(root, journey, name),
            )
        except LookupError as exc:
            raise JourneyError(str(exc)) from exc
        log.info("qualify %s: profile %s (%s)", journey, profile, why)
    return qualify_one(root, journey, profile, overrides, out)


def qualify_one(
    root: Path, journey_name: str, profile: str, overrides: list[str], out_dir: str | None
) -> int:
    from cortex_recipes import progress
    from cortex_recipes.qualify import EVIDENCE_DIR_ENV
    from cortex_recipes.run import RUNS_ENV

    command = qualification_command(root, journey_name, profile, overrides)
    problems = weight_problems(root, journey_name, profile)
    if problems:
        for problem in problems:
            log.error("%s", problem)
        log.error(
            "qualify %s %s: its hub weights do not verify against their pins; nothing ran",
            journey_name, profile,
        )  # fmt: skip
        return 2
    env = dict(os.environ)
    env.setdefault(progress.ENV, "1")  # the runs' bars, when stderr is a terminal
    if out_dir:
        out = Path(out_dir).resolve()
        env[EVIDENCE_DIR_ENV] = str(out / "evidence")
        env[RUNS_ENV] = str(out / "runs")
    log.info("running %s in %s", " ".join(command), root)
    returncode = subprocess.run(command, cwd=root, env=env, check=False).returncode
    if returncode != 0:
        log.error("qualification of %s %s failed (exit %d)", journey_name, profile, returncode)
        return returncode
    if out_dir:
        print(f"evidence {Path(env[EVIDENCE_DIR_ENV]) / (profile + '.json')}")
        return 0  # the checkout's recipe.yaml and catalog are not this run's to change
    if (root / "model-catalog").is_dir():
        from cortex_recipes.catalog import sync

        changed = sync(root)
    else:
        from cortex_recipes.journeys import INDEX_FILE, write_index

        changed = [INDEX_FILE] if (root / INDEX_FILE).is_file() and write_index(root) else []
    for path in changed:
        print(f"updated {path}")
    return 0
