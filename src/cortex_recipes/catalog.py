"""The model catalog: which models run in which journey profile, checked against the repo.

``model-catalog/models.json`` lists the models; ``model-catalog/profiles/<journey>.<profile>.json``
links one journey profile to its models, recipe, example, config, sub-jobs and evidence;
``model-catalog/schema.json`` is their schema. The profile files are generated from
``journeys.toml``, each ``recipe.yaml`` and the journey's profile loader by
:func:`sync` (``cortex-recipes catalog sync``) and checked by :func:`validate_catalog`
(``cortex-recipes catalog validate``), which fails on a dangling path, a sub-job the SDK's
``SubJobConfig`` factories reject, or a file that no longer matches its config.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from cortex_recipes import journeys as journeys_lib
from cortex_recipes import schema
from cortex_recipes.journeys import Journey, JourneyError
from cortex_recipes.repo_checks import configs, records, references
from cortex_recipes.sub_jobs import SubJobError, build_sub_jobs

log = logging.getLogger(__name__)

CATALOG = "model-catalog"
COMPATIBILITY_DOC = "docs/model-compatibility.md"


class CatalogError(JourneyError):
    """The catalog cannot be generated; the message names the journey, profile and field."""


def _landed_recipes(root: Path) -> list[tuple[Journey, dict[str, Any]]]:
    result = []
    for journey in journeys_lib.load_journeys(root):
        recipe_yaml = journey.path(root) / "recipe.yaml"
        if journey.landed and recipe_yaml.is_file():
            result.append((journey, journeys_lib.load_recipe(recipe_yaml)))
    return result


def _wire_sub_jobs(journey: Journey, config: Path) -> list[dict[str, Any]]:
    loader = journeys_lib.profile_loader(journey)
    if loader is not None:
        return [sub_job.to_wire() for sub_job in loader(config).sub_jobs()]
    raw = json.loads(config.read_text())
    if isinstance(raw, dict) and isinstance(raw.get("sub_job_configs"), list):
        return raw["sub_job_configs"]
    raise CatalogError(
        f"{config}: journey {journey.name!r} has no profile_loader in journeys.toml and the config "
        "has no sub_job_configs list, so its sub-jobs are unknown"
    )


def render_profile(
    root: Path, journey: Journey, recipe: dict[str, Any], profile: dict[str, Any]
) -> dict[str, Any]:
    """The catalog entry of one journey profile, from the repository as it is."""
    config = Path(journey.folder, profile["config"]).as_posix()
    wires = _wire_sub_jobs(journey, root / config)
    roles = {m["name"]: m["role"] for m in recipe.get("models", [])}
    names = list(dict.fromkeys(w["model_name"] for w in wires))
    missing = [n for n in names if n not in roles]
    if missing:
        raise CatalogError(
            f"{journey.folder}/recipe.yaml: models {missing} used by profile "
            f"{profile['name']!r} are not listed under models (with a role)"
        )
    loader = journeys_lib.profile_loader(journey)
    return {
        "id": f"{journey.name}.{profile['name']}",
        "journey": journey.name,
        "profile": profile["name"],
        "recipe": journey.folder,
        "example": f"{journey.folder}/README.md",
        "command": f"python -m {journey.entry_point} profile={config}",
        "config": config,
        "config_hash": configs.profile_config_hash(root / config, loader),
        "hardware": profile["hardware"],
        "purpose": profile["purpose"],
        "models": [{"name": n, "role": roles[n]} for n in names],
        "sub_job_configs": wires,
        "last_validated": profile["last_validated"],
        "evidence": (
            Path(journey.folder, profile["evidence"]).as_posix() if profile["evidence"] else None
        ),
    }


def _dump(data: Any) -> str:
    return json.dumps(data, indent=2) + "\n"


def sync(root: Path) -> list[str]:
    """Regenerate profiles/*.json, the recipes index and the compatibility table.

    Returns the paths (relative to ``root``) that changed. Profile files of profiles that no
    longer exist are removed.
    """
    changed = []
    profiles_dir = root / CATALOG / "profiles"
    profiles_dir.mkdir(parents=True, exist_ok=True)
    wanted = {}
    for journey, recipe in _landed_recipes(root):
        for profile in journeys_lib.recipe_profiles(recipe):
            try:
                entry = render_profile(root, journey, recipe, profile)
            except CatalogError:
                raise
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                raise CatalogError(
                    f"{journey.folder}: profile {profile['name']!r} cannot be catalogued: {exc}"
                ) from exc
            wanted[f"{entry['id']}.json"] = _dump(entry)
    for name, text in sorted(wanted.items()):
        path = profiles_dir / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            changed.append(path.relative_to(root).as_posix())
    for path in sorted(profiles_dir.glob("*.json")):
        if path.name not in wanted:
            path.unlink()
            changed.append(path.relative_to(root).as_posix())
    if journeys_lib.write_index(root):
        changed.append(journeys_lib.INDEX_FILE)
    doc = root / COMPATIBILITY_DOC
    if doc.is_file():
        text = doc.read_text()
        new = journeys_lib.replace_generated(text, render_compatibility(root), COMPATIBILITY_DOC)
        if new != text:
            doc.write_text(new)
            changed.append(COMPATIBILITY_DOC)
    for path in changed:
        log.info("updated %s", path)
    return changed


def _load_entries(root: Path) -> list[tuple[Path, Any]]:
    entries = []
    for path in sorted((root / CATALOG / "profiles").glob("*.json")):
        try:
            entries.append((path, json.loads(path.read_text())))
        except ValueError as exc:
            entries.append((path, exc))
    return entries


def render_compatibility(root: Path) -> str:
    """The model x journey profile table of docs/model-compatibility.md."""
    models = json.loads((root / CATALOG / "models.json").read_text())["models"]
    rows = [
        "| model | source | journey | profile | role | hardware | last validated |",
        "|---|---|---|---|---|---|---|",
    ]
    entries = [e for _, e in _load_entries(root) if isinstance(e, dict)]
    for model in models:
        for entry in entries:
            for used in entry.get("models", []):
                if used.get("name") != model["name"]:
                    continue
                date = entry.get("last_validated") or "not validated"
                rows.append(
                    f"| `{model['name']}` | {model['source']} | {entry['journey']} "
                    f"| `{entry['profile']}` | {used['role']} | {entry['hardware']} | {date} |"
                )
    return "\n".join(rows) + "\n"


# --- validation ---------------------------------------------------------------------------


def validate_catalog(root: Path) -> list[str]:
    """Every problem in the model catalog, as ``path: problem`` lines."""
    root = root.resolve()
    catalog = root / CATALOG
    try:
        catalog_schema = json.loads((catalog / "schema.json").read_text())
        models_doc = json.loads((catalog / "models.json").read_text())
    except (OSError, ValueError) as exc:
        return [f"{CATALOG}: schema.json and models.json must be readable JSON: {exc}"]
    problems = [f"{CATALOG}/models.json: {p}" for p in schema.validate(models_doc, catalog_schema)]
    if problems:
        return problems
    models = {m["name"]: m for m in models_doc["models"]}
    problems += _model_problems(models_doc["models"])
    try:
        landed = {j.name: (j, r) for j, r in _landed_recipes(root)}
    except JourneyError as exc:
        return [*problems, str(exc).replace(f"{root}/", "")]
    profile_schema = {"$ref": "#/$defs/profile"}
    seen, used_models = set(), set()
    for path, entry in _load_entries(root):
        where = path.relative_to(root).as_posix()
        if isinstance(entry, Exception):
            problems.append(f"{where}: not valid JSON: {entry}")
            continue
        found = [f"{where}: {p}" for p in schema.validate(entry, profile_schema, catalog_schema)]
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            seen.add(entry["id"])
        if found:
            problems += found
            continue
        used_models |= {m["name"] for m in entry["models"]}
        problems += _entry_problems(root, where, path, entry, models, landed)
    for name in sorted(set(models) - used_models):
        problems.append(f"{CATALOG}/models.json: model {name!r} is used by no catalog profile")
    for name, (_, recipe) in landed.items():
        for profile in journeys_lib.recipe_profiles(recipe):
            if f"{name}.{profile['name']}" not in seen:
                problems.append(
                    f"{CATALOG}/profiles: no {name}.{profile['name']}.json for journey {name!r} "
                    f"profile {profile['name']!r} (run `cortex-recipes catalog sync`)"
                )
    problems += _compatibility_problems(root)
    return problems


def _model_problems(models: list[dict[str, Any]]) -> list[str]:
    from cortex_recipes.models import FIXTURE_MODELS
    from cortex_recipes.weights import pin_problems

    problems = []
    names = [m["name"] for m in models]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{CATALOG}/models.json: model {name!r} is listed more than once")
    for model in models:
        where = f"{CATALOG}/models.json: models[{model['name']}]"
        if model["source"] == "fixture" and model["name"] not in FIXTURE_MODELS:
            problems.append(
                f"{where}: source='fixture' but it is not a fixture; fixtures: "
                f"{', '.join(FIXTURE_MODELS)}"
            )
        if model["source"] == "hub" and model["name"].count("/") != 1:
            problems.append(f"{where}: source='hub' needs an '<org>/<name>' name")
        if model["source"] == "hub":
            # the pin's shape; an 'unverified' pin passes here and fails `models verify`
            problems += [f"{CATALOG}/models.json: {p}" for p in pin_problems(model)]
        problems += [f"{where}: {p}" for p in references.mutable_references(json.dumps(model))]
    return problems


def _entry_problems(
    root: Path,
    where: str,
    path: Path,
    entry: dict[str, Any],
    models: dict[str, Any],
    landed: dict[str, tuple[Journey, dict[str, Any]]],
) -> list[str]:
    problems = []
    if path.stem != entry["id"]:
        problems.append(f"{where}: id={entry['id']!r} must match the file name {path.stem!r}")
    if entry["id"] != f"{entry['journey']}.{entry['profile']}":
        problems.append(f"{where}: id={entry['id']!r} must be '<journey>.<profile>'")
    for field in ("recipe", "example", "config", "evidence"):
        value = entry[field]
        if value is not None and not (root / value).exists():
            problems.append(f"{where}: {field}={value!r} does not exist")
    problems += [f"{where}: {p}" for p in references.mutable_references(entry["command"])]
    for model in entry["models"]:
        if model["name"] not in models:
            problems.append(f"{where}: model {model['name']!r} is not in {CATALOG}/models.json")
    try:
        sub_jobs = build_sub_jobs(entry["sub_job_configs"], "sub_job_configs")
    except SubJobError as exc:
        problems.append(f"{where}: {exc}")
        sub_jobs = []
    listed = {m["name"] for m in entry["models"]}
    for i, sub_job in enumerate(sub_jobs):
        if sub_job.model_name not in listed:
            problems.append(
                f"{where}: sub_job_configs[{i}].model_name={sub_job.model_name!r} is not one of "
                f"its models {sorted(listed)}"
            )
    if entry["journey"] not in landed:
        return [*problems, f"{where}: journey={entry['journey']!r} is not a landed journey"]
    journey, recipe = landed[entry["journey"]]
    try:
        profile = journeys_lib.get_profile(
            recipe, entry["profile"], f"{journey.folder}/recipe.yaml"
        )
    except JourneyError as exc:
        return [*problems, f"{where}: {exc}"]
    if entry["recipe"] != journey.folder:
        problems.append(f"{where}: recipe={entry['recipe']!r}; the journey is {journey.folder!r}")
    if not entry["command"].startswith(f"python -m {journey.entry_point} "):
        problems.append(
            f"{where}: command={entry['command']!r} does not run {journey.entry_point!r}"
        )
    if problems:
        return problems
    try:
        expected = render_profile(root, journey, recipe, profile)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        return [f"{where}: cannot be compared with its journey: {exc}"]
    for field, value in expected.items():
        if entry.get(field) != value:
            problems.append(
                f"{where}: {field}={entry.get(field)!r} but the journey says {value!r} "
                "(run `cortex-recipes catalog sync`)"
            )
    if entry["last_validated"] is not None:
        record_problems = records.check_record(
            root,
            "evidence",
            entry["profile"],
            entry["last_validated"],
            entry["evidence"],
            root / entry["config"],
            journeys_lib.profile_loader(journey),
        )
        problems += [f"{where}: {p}" for p in record_problems]
    return problems


def _compatibility_problems(root: Path) -> list[str]:
    doc = root / COMPATIBILITY_DOC
    if not doc.is_file():
        return [f"{COMPATIBILITY_DOC}: missing"]
    text = doc.read_text()
    try:
        new = journeys_lib.replace_generated(text, render_compatibility(root), COMPATIBILITY_DOC)
    except JourneyError as exc:
        return [str(exc)]
    if new != text:
        return [f"{COMPATIBILITY_DOC}: table is stale; run `cortex-recipes catalog sync`"]
    return []
