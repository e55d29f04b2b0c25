"""Qualification evidence: run a profile twice, check the outcome, record it, set last_validated.

A record is written only for a passing qualification; ``last_validated`` in ``recipe.yaml`` is
set from the record's date and points at it. A record holds: ``profile``, ``passed``,
``date``, ``config_hash`` (:func:`cortex_recipes.provenance.config_hash` of the profile JSON), ``git_revision``,
``checks`` (named booleans), ``metrics`` (measured values against the ranges in
``recipe.yaml`` ``expected_metrics``), ``packages``, ``hardware``, ``image_digest`` and
``runs``. ``cortex-recipes validate`` rejects a ``last_validated`` that such a record does not
back.

Where the identity fields come from, each recorded beside it:

- ``git_revision`` / ``revision_source``: ``git rev-parse HEAD`` in a checkout; in an image
  (no git) ``$CORTEX_RECIPES_REVISION``, which the Dockerfile sets from its ``REVISION`` build
  argument; else null.
- ``image_digest`` / ``image_digest_source``: ``$CORTEX_RECIPES_IMAGE_DIGEST`` (``ci/images.py
  qualify`` passes the image ID); else the ``imageid`` podman writes to ``/run/.containerenv``
  (for ``--privileged`` containers); else null (docker shows a container no image ID; the
  source says so).

``$CORTEX_RECIPES_EVIDENCE_DIR`` sends the record to another folder (the image's ``/out``) and
leaves ``recipe.yaml`` alone; ``$CORTEX_RECIPES_RUNS`` (:func:`cortex_recipes.run.runs_root`)
moves the qualification's run folders.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from cortex_recipes.provenance import (
    DIGEST_FORM,
    code_digest,
    hardware,
    image_identity,
    package_versions,
    source_revision,
)

log = logging.getLogger(__name__)

EVIDENCE_DIR_ENV = "CORTEX_RECIPES_EVIDENCE_DIR"


def evidence_dir(recipe_dir: Path) -> tuple[Path, bool]:
    """Where records go, and whether recipe.yaml is updated (not when redirected)."""
    override = os.environ.get(EVIDENCE_DIR_ENV)
    if override:
        return Path(override), False
    return recipe_dir / "evidence", True


def work_dir(prefix: str) -> Path:
    """A fresh folder for a qualification's runs: under ``$CORTEX_RECIPES_RUNS/qualify`` when
    that is set (the image's /out/runs), else a temporary folder."""
    from cortex_recipes.run import RUNS_ENV, runs_root

    if os.environ.get(RUNS_ENV):
        parent = runs_root() / "qualify"
        parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    return Path(tempfile.mkdtemp(prefix=prefix))


def cpu_qualification_profiles(recipe: dict[str, Any]) -> list[str]:
    return [
        p["name"]
        for p in recipe.get("profiles") or []
        if str(p.get("hardware", "")).startswith("CPU")
        and str(p.get("purpose", "")).startswith("qualification")
    ]


def gpu_profiles(recipe: dict[str, Any]) -> list[str]:
    return [p["name"] for p in recipe.get("profiles") or [] if p["name"].startswith("local-gpu-")]


def select_profile(
    recipe: dict[str, Any], *, cuda: bool, weights_ready: Callable[[str], list[str]]
) -> tuple[str, str]:
    """The profile a plain ``qualify`` runs on this hardware, and why.

    The first GPU profile whose weights are present and verify (``weights_ready(profile)``
    returns no problems) when CUDA is visible; else the first CPU qualification profile.
    """
    reasons = []
    if cuda:
        for name in gpu_profiles(recipe):
            problems = weights_ready(name)
            if not problems:
                return name, "CUDA is visible and the profile's pinned weights are present"
            reasons.append(f"{name}: {problems[0]}")
        if not reasons:
            reasons.append("the journey has no local GPU profile")
    else:
        reasons.append("no CUDA device is visible")
    cpu = cpu_qualification_profiles(recipe)
    if not cpu:
        raise LookupError(
            f"recipe {recipe.get('id')!r} has no CPU qualification profile (hardware 'CPU...', "
            f"purpose 'qualification...') and {'; '.join(reasons)}"
        )
    return cpu[0], "the CPU qualification profile: " + "; ".join(reasons)


def compare_metrics(
    measured: dict[str, Any], expected: dict[str, Any], *, profile: str | None = None
) -> dict[str, dict[str, Any]]:
    """Each measured metric against its ``expected_metrics`` entry in recipe.yaml.

    An entry may be a description string (nothing to compare) or a mapping with
    ``description`` and ``min`` and/or ``max`` (inclusive). A measured metric is a number or an
    interval (:mod:`cortex_recipes.intervals`: ``value``, ``low``, ``high``); for an interval
    ``min`` applies to its lower end and ``max`` to its upper end, so a bar is met only when the
    whole interval clears it. A measured metric without a range is recorded with ``within``
    null. A metric with a range that the run did not measure is recorded with ``value`` null and
    ``within`` false, so a qualification cannot pass by not reporting it. An entry with
    ``profiles`` (a list of profile names) applies only to the qualification of those
    profiles; without it, to every profile of the recipe.
    """
    ranges = {
        name: spec
        for name, spec in expected.items()
        if isinstance(spec, dict)
        and ("min" in spec or "max" in spec)
        and (spec.get("profiles") is None or profile in spec["profiles"])
    }
    result: dict[str, dict[str, Any]] = {}
    for name in sorted(set(measured) | set(ranges)):
        bounds = ranges.get(name, {})
        low, high = bounds.get("min"), bounds.get("max")
        value = measured.get(name)
        entry: dict[str, Any] = {"value": value, "min": low, "max": high}
        if isinstance(value, dict):
            missing = [k for k in ("value", "low", "high") if k not in value]
            if missing:
                raise ValueError(
                    f"metric {name!r}: an interval needs value, low and high; missing {missing}"
                )
            entry = {**entry, **value, "min": low, "max": high}
            lower_end, upper_end = value["low"], value["high"]
        else:
            lower_end = upper_end = value
        if low is None and high is None:
            within = None
        elif value is None:
            within = False
        else:
            within = (low is None or lower_end >= low) and (high is None or upper_end <= high)
        entry.pop("name", None)
        entry["within"] = within
        result[name] = entry
    return result


def repository_root(start: Path) -> Path:
    """The nearest directory at or above ``start`` holding journeys.toml."""
    for candidate in [Path(start).resolve(), *Path(start).resolve().parents]:
        if (candidate / "journeys.toml").is_file():
            return candidate
    raise FileNotFoundError(f"no journeys.toml at or above {start}")


def record_evidence(
    recipe_dir: Path,
    profile_name: str,
    config_hash: str,
    runs: list[dict],
    checks: dict[str, bool],
    *,
    metrics: dict[str, float] | None = None,
) -> Path | None:
    """Write the evidence record and update recipe.yaml; return the record path if it passed.

    It passes when every check is true and every measured metric with a range in recipe.yaml's
    ``expected_metrics`` lies inside it. A failing record goes to ``<profile>.failed.json``
    and leaves recipe.yaml alone.
    """
    recipe = yaml.safe_load((recipe_dir / "recipe.yaml").read_text()) or {}
    compared = compare_metrics(
        metrics or {}, recipe.get("expected_metrics") or {}, profile=profile_name
    )
    passed = all(checks.values()) and all(m["within"] is not False for m in compared.values())
    today = dt.date.today().isoformat()
    revision, revision_source = source_revision()
    image_digest, image_digest_source = image_identity()
    record = {
        "profile": profile_name,
        "passed": passed,
        "date": today,
        "config_hash": config_hash,
        "git_revision": revision,
        "revision_source": revision_source,
        "code_digest": code_digest(repository_root(recipe_dir), recipe_dir),
        "code_digest_form": DIGEST_FORM,
        "checks": checks,
        "metrics": compared,
        "packages": package_versions(),
        "hardware": hardware(),
        "image_digest": image_digest,
        "image_digest_source": image_digest_source,
        "runs": runs,
    }
    folder, update_recipe = evidence_dir(recipe_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{profile_name}.json"
    stem = profile_name if passed else f"{profile_name}.failed"
    # Paths relative to the record folder's parent: the recipe folder, or an image's /out.
    record["plots"] = evidence_plots(folder / "plots" / stem, runs, folder.parent)
    if not passed:
        failed = folder / f"{profile_name}.failed.json"
        failed.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        return None
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    if not update_recipe:
        return path
    set_last_validated(
        recipe_dir / "recipe.yaml", profile_name, today, path.relative_to(recipe_dir).as_posix()
    )
    show_latest_plots(
        recipe_dir / "README.md", profile_name, today, path.relative_to(recipe_dir).as_posix(),
        record["plots"],
    )  # fmt: skip
    return path


PLOTS_START = "<!-- latest-qualification: written by `cortex-recipes qualify`; do not edit -->"
PLOTS_END = "<!-- /latest-qualification -->"


def show_latest_plots(
    readme: Path, profile_name: str, date: str, evidence: str, plots: list[str]
) -> None:
    """Put the newest passing record's curves in the journey README, between the markers
    (appended at the end the first time); README-relative paths, like ``evidence``."""
    if not readme.is_file():
        return
    lines = [
        PLOTS_START,
        "## Latest qualification",
        "",
        f"`{profile_name}`, {date}: [{evidence}]({evidence}).",
        "",
        *(f"![{Path(p).stem}]({p})" for p in plots),
        *([] if plots else ["(this record has no plots)"]),
        PLOTS_END,
    ]
    block = "\n".join(lines)
    text = readme.read_text()
    start, end = text.find(PLOTS_START), text.find(PLOTS_END)
    if start >= 0 and end > start:
        text = text[:start] + block + text[end + len(PLOTS_END) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    readme.write_text(text)


def nested_values(value: Any):
    """``value`` and everything inside it (dict values and list items, depth first, in order)."""
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from nested_values(item)
    elif isinstance(value, list):
        for item in value:
            yield from nested_values(item)


def run_dirs_of(runs: Any) -> list[Path]:
    """Every ``run_dir`` named in ``runs`` (summaries, nested lists and dicts) that still holds
    a ``metrics.jsonl``, once each, in order."""
    found: list[Path] = []
    for value in nested_values(runs):
        run_dir = value.get("run_dir") if isinstance(value, dict) else None
        if (
            isinstance(run_dir, str)
            and (Path(run_dir) / "metrics.jsonl").is_file()
            and Path(run_dir) not in found
        ):
            found.append(Path(run_dir))
    return found


def evidence_plots(out_dir: Path, runs: Any, base: Path) -> list[str]:
    """PNG curves of the qualification's runs next to its record (``cortex-recipes plot``),
    paths relative to ``base``. A plotting failure is logged and never loses the record: the
    list is then empty."""
    run_dirs = run_dirs_of(runs)
    if not run_dirs:
        return []
    try:
        from cortex_recipes.plots import plot_runs

        if out_dir.is_dir():
            for old in out_dir.glob("*.png"):
                old.unlink()
        written = plot_runs(run_dirs, out_dir)
    except Exception as exc:  # plots back the record; they must never cost it
        log.warning("could not plot the qualification runs into %s: %s", out_dir, exc)
        return []
    return [Path(p).resolve().relative_to(base.resolve()).as_posix() for p in written]


def set_last_validated(recipe_yaml: Path, profile_name: str, date: str, evidence: str) -> None:
    """Point the profile at its new record; the top level follows the newest profile record."""
    data = yaml.safe_load(recipe_yaml.read_text())
    profiles = {p["name"]: p for p in data["profiles"]}
    if profile_name not in profiles:
        raise KeyError(f"{recipe_yaml} has no profile named {profile_name!r}")
    profiles[profile_name].update(last_validated=date, evidence=evidence)
    data["last_validated"], data["evidence"] = latest_validation(data["profiles"], profile_name)
    recipe_yaml.write_text(yaml.safe_dump(data, sort_keys=False, width=100))


def latest_validation(
    profiles: list[dict[str, Any]], prefer: str | None = None
) -> tuple[str | None, str | None]:
    """(date, evidence) for a recipe's top level: its newest profile record, ``prefer`` on ties."""
    dated = [p for p in profiles if p.get("last_validated")]
    if not dated:
        return None, None
    newest = max(str(p["last_validated"]) for p in dated)
    tied = [p for p in dated if str(p["last_validated"]) == newest]
    chosen = next((p for p in tied if p["name"] == prefer), tied[0])
    return newest, chosen.get("evidence")
