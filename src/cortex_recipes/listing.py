"""``cortex-recipes list``: each journey, its profiles, their hardware and validation status.

Read from journeys.toml and each landed journey's recipe.yaml (the same sources as the index
in recipes/README.md); nothing is run or imported from the journeys.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cortex_recipes import journeys as journeys_lib


@dataclass(frozen=True)
class ProfileRow:
    journey: str
    status: str  # journeys.toml status, and recipe.yaml status for a landed journey
    profile: str
    hardware: str
    validated: str  # the last_validated date, or "not validated"
    purpose: str


def journey_rows(root: Path) -> list[ProfileRow]:
    """One row per journey profile; a planned journey (or one without recipe.yaml) is one row
    with profile ``-``."""
    rows: list[ProfileRow] = []
    for journey in journeys_lib.load_journeys(root):
        recipe_yaml = journey.path(root) / "recipe.yaml"
        if not journey.landed or not recipe_yaml.is_file():
            rows.append(ProfileRow(journey.name, journey.status, "-", "-", "-", journey.folder))
            continue
        recipe = journeys_lib.load_recipe(recipe_yaml)
        status = f"{journey.status}, {recipe.get('status', '?')}"
        for profile in journeys_lib.recipe_profiles(recipe):
            validated = profile.get("last_validated")
            rows.append(
                ProfileRow(
                    journey=journey.name,
                    status=status,
                    profile=str(profile["name"]),
                    hardware=str(profile.get("hardware") or "-"),
                    validated=str(validated) if validated else "not validated",
                    purpose=str(profile.get("purpose") or ""),
                )
            )
    return rows


def render(rows: list[ProfileRow], *, wide: bool = False) -> str:
    """A plain-text table, one line per profile (``wide``: with each profile's purpose)."""
    header = ["journey", "status", "profile", "hardware", "validated"]
    table = [[r.journey, r.status, r.profile, r.hardware, r.validated] for r in rows]
    if wide:
        header.append("purpose")
        for line, row in zip(table, rows, strict=True):
            line.append(row.purpose)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *table, strict=True)]
    lines = []
    for line in [header, *table]:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    return "\n".join(lines) + "\n"
