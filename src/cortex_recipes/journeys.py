"""The journey registry (``journeys.toml``), each journey's ``recipe.yaml``, and the index.

``journeys.toml`` at the repository root is the one list of journeys; everything that walks
journeys (the validator, ``cortex-recipes qualify``, the model catalog, ``recipes/README.md``)
reads it through :func:`load_journeys`.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

JOURNEYS_FILE = "journeys.toml"
STATUSES = ("landed", "planned")
_FIELDS = (
    "name", "folder", "extra", "entry_point", "smoke", "qualify", "profile_loader", "status",
)  # fmt: skip
_OPTIONAL = {"qualify", "profile_loader"}

INDEX_FILE = "recipes/README.md"
INDEX_BEGIN = "<!-- BEGIN GENERATED: cortex-recipes catalog sync -->"
INDEX_END = "<!-- END GENERATED -->"


class JourneyError(ValueError):
    """journeys.toml or a recipe.yaml that cannot be read; the message names file and field."""


@dataclass(frozen=True)
class Journey:
    name: str
    folder: str
    extra: str
    entry_point: str
    smoke: str
    qualify: str
    profile_loader: str
    status: str

    @property
    def landed(self) -> bool:
        return self.status == "landed"

    def path(self, root: Path) -> Path:
        return root / self.folder


def find_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: cwd) holding journeys.toml."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / JOURNEYS_FILE).is_file():
            return candidate
    raise JourneyError(f"no {JOURNEYS_FILE} in {here} or any parent; pass --root")


def _parsed(path: Path, parse: Callable[[str], Any], error: type[Exception], language: str) -> Any:
    """``parse`` of the text of ``path``; :class:`JourneyError` when the file does not exist or
    ``parse`` raises ``error`` (it is not valid ``language``)."""
    try:
        return parse(path.read_text())
    except FileNotFoundError as exc:
        raise JourneyError(f"{path} does not exist") from exc
    except error as exc:
        raise JourneyError(f"{path} is not valid {language}: {exc}") from exc


def load_journeys(root: Path) -> list[Journey]:
    path = root / JOURNEYS_FILE
    data = _parsed(path, tomllib.loads, tomllib.TOMLDecodeError, "TOML")
    tables = data.get("journey")
    if not isinstance(tables, list) or not tables:
        raise JourneyError(f"{path}: needs one or more [[journey]] tables")
    journeys, seen = [], set()
    for i, table in enumerate(tables):
        where = f"{path}: journey[{i}]"
        unknown = sorted(set(table) - set(_FIELDS))
        if unknown:
            raise JourneyError(f"{where}: unknown fields {unknown}; accepted: {list(_FIELDS)}")
        values = {}
        for key in _FIELDS:
            value = table.get(key, "" if key in _OPTIONAL else None)
            if not isinstance(value, str) or (key not in _OPTIONAL and not value):
                raise JourneyError(f"{where}: {key}={value!r} must be a non-empty string")
            values[key] = value
        if values["status"] not in STATUSES:
            raise JourneyError(
                f"{where}: status={values['status']!r}; accepted: {', '.join(STATUSES)}"
            )
        if values["name"] in seen:
            raise JourneyError(f"{where}: name={values['name']!r} appears twice")
        seen.add(values["name"])
        journeys.append(Journey(**values))
    return journeys


def get_journey(root: Path, name: str) -> Journey:
    journeys = load_journeys(root)
    for journey in journeys:
        if journey.name == name:
            return journey
    names = ", ".join(j.name for j in journeys)
    raise JourneyError(f"journey={name!r} is not in {JOURNEYS_FILE}; known: {names}")


def _dates_to_strings(value: Any) -> Any:
    """YAML reads unquoted dates as ``date`` objects; the schema speaks ``YYYY-MM-DD``."""
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _dates_to_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_dates_to_strings(v) for v in value]
    return value


def load_recipe(recipe_yaml: Path) -> dict[str, Any]:
    data = _parsed(recipe_yaml, yaml.safe_load, yaml.YAMLError, "YAML")
    if not isinstance(data, dict):
        raise JourneyError(f"{recipe_yaml} must hold a mapping")
    return _dates_to_strings(data)


def recipe_profiles(recipe: dict[str, Any]) -> list[dict[str, Any]]:
    profiles = recipe.get("profiles")
    if not isinstance(profiles, list):
        return []
    return [p for p in profiles if isinstance(p, dict) and isinstance(p.get("name"), str)]


def get_profile(recipe: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    for profile in recipe_profiles(recipe):
        if profile["name"] == name:
            return profile
    names = ", ".join(p["name"] for p in recipe_profiles(recipe))
    raise JourneyError(f"{where}: profile={name!r} is not listed; known: {names}")


def profile_loader(journey: Journey) -> Callable[[Path], Any] | None:
    """The journey's ``module:function`` profile loader, or None when it declares none."""
    if not journey.profile_loader:
        return None
    module, _, function = journey.profile_loader.partition(":")
    try:
        return getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as exc:
        raise JourneyError(
            f"{JOURNEYS_FILE}: journey {journey.name!r} profile_loader="
            f"{journey.profile_loader!r} cannot be loaded: {exc}"
        ) from exc


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


# --- generated sections -------------------------------------------------------------------


def replace_generated(text: str, body: str, where: str) -> str:
    """``text`` with the part between the generated-section markers replaced by ``body``."""
    start, end = text.find(INDEX_BEGIN), text.find(INDEX_END)
    if start < 0 or end < start:
        raise JourneyError(f"{where}: needs the markers {INDEX_BEGIN!r} and {INDEX_END!r}")
    return text[: start + len(INDEX_BEGIN)] + "\n" + body + text[end:]


def render_index(root: Path) -> str:
    """The table in recipes/README.md: one row per journey profile, planned journeys too."""
    rows = [
        "| journey | status | profile | hardware | last validated |",
        "|---|---|---|---|---|",
    ]
    for journey in load_journeys(root):
        here = Path(journey.folder).relative_to("recipes").as_posix()
        recipe_yaml = journey.path(root) / "recipe.yaml"
        if not journey.landed or not recipe_yaml.is_file():
            rows.append(f"| {journey.name} (`{journey.folder}`) | {journey.status} | - | - | - |")
            continue
        recipe = load_recipe(recipe_yaml)
        name = f"[{journey.name}]({here}/README.md)"
        status = f"{journey.status}, {recipe.get('status', '?')}"
        for profile in recipe_profiles(recipe):
            date = profile.get("last_validated") or "not validated"
            if profile.get("evidence") and profile.get("last_validated"):
                date = f"[{date}]({here}/{profile['evidence']})"
            hardware = str(profile.get("hardware", "")).replace("|", "/")
            rows.append(f"| {name} | {status} | `{profile['name']}` | {hardware} | {date} |")
    return "\n".join(rows) + "\n"


def index_is_current(root: Path) -> bool:
    path = root / INDEX_FILE
    text = path.read_text()
    return replace_generated(text, render_index(root), INDEX_FILE) == text


def write_index(root: Path) -> bool:
    """Rewrite the generated table in recipes/README.md; True if it changed."""
    path = root / INDEX_FILE
    text = path.read_text()
    new = replace_generated(text, render_index(root), INDEX_FILE)
    if new != text:
        path.write_text(new)
    return new != text
