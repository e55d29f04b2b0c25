"""``recipe.yaml`` semantics and the evidence behind it: datasets' ``sha256:`` revisions, a
non-null ``last_validated`` backed by a passing record of the current config, image records,
and records that no longer describe the code (:func:`stale_records`)."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cortex_recipes import journeys as journeys_lib
from cortex_recipes.journeys import JourneyError
from cortex_recipes.qualify import latest_validation
from cortex_recipes.repo_checks.configs import journey_loader, profile_config_hash

log = logging.getLogger(__name__)

RECORD_FIELDS = (
    "profile", "passed", "date", "config_hash", "checks", "metrics", "packages", "hardware",
    "image_digest",
)  # fmt: skip


def _revision_known(root: Path, revision: str) -> bool | None:
    """Whether ``revision`` (``+dirty`` stripped) is a commit of the repository at ``root``;
    None where history cannot answer: ``root`` is not a git checkout (an image), or it is a
    shallow clone that does not hold the commit."""
    import subprocess

    try:
        inside = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if inside.returncode != 0:
            return None
        found = subprocess.run(
            ["git", "-C", str(root), "cat-file", "-e", f"{revision.split('+')[0]}^{{commit}}"],
            capture_output=True, check=False,
        )  # fmt: skip
        if found.returncode != 0:
            shallow = subprocess.run(
                ["git", "-C", str(root), "rev-parse", "--is-shallow-repository"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if shallow.stdout.strip() == "true":
                # a shallow clone holds only the newest commits: an older one is unknown, not
                # absent (`git fetch --unshallow` makes the check decide)
                log.warning(
                    "git_revision=%r is not in this shallow clone's history; not checked "
                    "(`git fetch --unshallow` checks it)", revision,
                )  # fmt: skip
                return None
    except OSError:
        return None
    return found.returncode == 0


@dataclass(frozen=True)
class StaleRecord:
    """A record behind a ``last_validated`` that no longer describes the code."""

    journey: str
    profile: str
    evidence: str  # the record's path, relative to the repository root
    reason: str

    def __str__(self) -> str:
        return f"{self.evidence}: {self.reason}"


def _validated_profiles(root: Path, *, skip_unreadable: bool):
    """``(journey, folder, profile, evidence)`` for every profile of a landed journey whose
    ``last_validated`` is backed by an ``evidence`` path; a recipe that does not load is
    skipped when ``skip_unreadable`` (validate_repository reports it), raised otherwise."""
    for journey in journeys_lib.load_journeys(root):
        if not journey.landed:
            continue
        folder = journey.path(root)
        try:
            recipe = journeys_lib.load_recipe(folder / "recipe.yaml")
        except JourneyError:
            if skip_unreadable:
                continue
            raise
        for profile in recipe.get("profiles") or []:
            evidence = profile.get("evidence")
            if profile.get("last_validated") and evidence:
                yield journey, folder, profile, evidence


def restamp(root: Path) -> list[str]:
    """Give every record behind a ``last_validated`` that carries a byte digest
    (no ``code_digest_form``) the form-blind digest, when its byte digest equals the journey's
    code now (so the record describes exactly this code); the byte digest is kept as
    ``code_digest_bytes``. Returns the records re-stamped."""
    from cortex_recipes.provenance import DIGEST_FORM, byte_digest, code_digest

    root = root.resolve()
    done: list[str] = []
    digests: dict[Path, tuple[str, str]] = {}  # folder -> (byte digest, form-blind digest)
    for journey, folder, _, evidence in _validated_profiles(root, skip_unreadable=False):
        path = folder / evidence
        record = json.loads(path.read_text())
        if folder not in digests:
            digests[folder] = (byte_digest(root, folder), code_digest(root, folder))
        old, new = digests[folder]
        if record.get("code_digest_form") or record.get("code_digest") != old:
            continue
        record["code_digest_bytes"] = record["code_digest"]
        record["code_digest"] = new
        record["code_digest_form"] = DIGEST_FORM
        path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        done.append(f"{journey.folder}/{evidence}")
    return done


def stale_records(root: Path) -> list[StaleRecord]:
    """Evidence behind a ``last_validated`` that no longer describes the code.

    A record is stale when it carries no ``code_digest`` (recorded before digests existed),
    when its digest differs from :func:`cortex_recipes.provenance.code_digest` of the journey
    now, or when its ``git_revision`` is missing or not in this repository's history. One
    record may be stale for more than one reason (one entry each).
    """
    from cortex_recipes.provenance import DIGEST_FORM, code_digest

    root = root.resolve()
    stale: list[StaleRecord] = []
    digests: dict[Path, str] = {}
    for journey, folder, profile, evidence in _validated_profiles(root, skip_unreadable=True):
        if folder not in digests:
            digests[folder] = code_digest(root, folder)
        current = digests[folder]
        where = f"{journey.folder}/{evidence}"

        def found(reason: str, profile=profile, where=where, journey=journey) -> None:
            stale.append(StaleRecord(journey.name, profile.get("name", ""), where, reason))

        try:
            record = json.loads((folder / evidence).read_text())
        except (OSError, ValueError):
            continue  # validate_repository reports an unreadable record
        recorded = record.get("code_digest")
        if not recorded:
            found("no code_digest (recorded before code digests)")
        elif record.get("code_digest_form") != DIGEST_FORM:
            found(
                "code_digest is over the files' bytes (recorded before form-blind digests): "
                "`cortex-recipes validate --restamp` re-stamps it if the code is unchanged"
            )
        elif recorded != current:
            found(f"code_digest={recorded[:12]} but the journey's code is now {current[:12]}")
        revision = record.get("git_revision")
        if not revision:
            found("no git_revision")
        elif _revision_known(root, revision) is False:
            found(f"git_revision={revision!r} is not in this history")
    return stale


def stale_evidence(root: Path) -> list[str]:
    """:func:`stale_records` as one line each (what ``validate`` prints)."""
    return [str(record) for record in stale_records(root)]


def dataset_problems(folder: Path, where: str, recipe: dict[str, Any]) -> list[str]:
    problems = []
    datasets = recipe.get("datasets") if isinstance(recipe.get("datasets"), list) else []
    for i, dataset in enumerate(d for d in datasets if isinstance(d, dict)):
        label = f"{where}: datasets[{i}]"
        path, revision = dataset.get("path"), dataset.get("revision")
        if isinstance(path, str) and not (folder / path).is_file():
            problems.append(f"{label}.path={path!r} does not exist")
            continue
        if not isinstance(revision, str):
            continue
        if revision.startswith("sha256:"):
            if not isinstance(path, str):
                problems.append(f"{label}.revision={revision!r} is a file hash but has no path")
            else:
                actual = "sha256:" + hashlib.sha256((folder / path).read_bytes()).hexdigest()
                if actual != revision:
                    problems.append(
                        f"{label}.revision={revision!r} does not match {path} ({actual}); "
                        "a changed data file needs a new revision"
                    )
        elif not dataset.get("source"):
            problems.append(f"{label}.revision={revision!r} is a commit but has no source")
    return problems


def validation_problems(folder: Path, where: str, recipe: dict[str, Any], loader) -> list[str]:
    problems = []
    profiles = journeys_lib.recipe_profiles(recipe)
    names = [p["name"] for p in profiles]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{where}: profile name {name!r} appears more than once")
    for metric, spec in (recipe.get("expected_metrics") or {}).items():
        scoped = spec.get("profiles") if isinstance(spec, dict) else None
        for name in scoped or []:
            if name not in names:
                problems.append(
                    f"{where}: expected_metrics.{metric}.profiles names {name!r}, which is not "
                    f"a profile of this recipe; accepted: {', '.join(names)}"
                )
    for profile in profiles:
        label = f"{where}: profiles[{profile['name']}]"
        config = folder / profile["config"]
        if not config.is_file():
            problems.append(f"{label}.config={profile['config']!r} does not exist")
            continue
        try:
            declared = json.loads(config.read_text()).get("name", profile["name"])
        except (ValueError, AttributeError):
            continue  # check_configs reports it
        if declared != profile["name"]:
            problems.append(f"{label}: config {profile['config']} names itself {declared!r}")
        problems += check_record(
            folder,
            label,
            profile["name"],
            profile["last_validated"],
            profile["evidence"],
            config,
            loader,
        )
    newest, _ = latest_validation(profiles)
    tied = {
        p["evidence"] for p in profiles if p["last_validated"] and p["last_validated"] == newest
    }
    if recipe["last_validated"] != newest:
        problems.append(
            f"{where}: last_validated={recipe['last_validated']!r} must be the newest profile "
            f"date ({newest!r})"
        )
    elif newest is not None and recipe["evidence"] not in tied:
        problems.append(
            f"{where}: evidence={recipe['evidence']!r} must be the record of a profile validated "
            f"on {newest}: one of {sorted(tied)}"
        )
    elif newest is None and recipe["evidence"] is not None:
        problems.append(f"{where}: evidence={recipe['evidence']!r} without last_validated")
    return problems


def check_record(
    folder: Path,
    label: str,
    profile: str,
    date: str | None,
    evidence: str | None,
    config: Path,
    loader,
) -> list[str]:
    """A ``last_validated`` date must be backed by a passing record of the config as it is."""
    if date is None:
        return [f"{label}: evidence={evidence!r} without last_validated"] if evidence else []
    if evidence is None:
        return [f"{label}: last_validated={date!r} without an evidence record"]
    path = folder / evidence
    if not path.is_file():
        return [f"{label}: last_validated={date!r} but evidence {evidence!r} does not exist"]
    try:
        record = json.loads(path.read_text())
    except ValueError as exc:
        return [f"{label}: evidence {evidence!r} is not valid JSON: {exc}"]
    if not isinstance(record, dict):
        return [f"{label}: evidence {evidence!r} must hold a JSON object"]
    problems = []
    missing = [key for key in RECORD_FIELDS if key not in record]
    if missing:
        problems.append(f"{label}: evidence {evidence!r} lacks fields {missing}")
    if record.get("passed") is not True:
        problems.append(
            f"{label}: last_validated={date!r} but evidence {evidence!r} has "
            f"passed={record.get('passed')!r}"
        )
    if record.get("date") != date:
        problems.append(
            f"{label}: last_validated={date!r} but evidence {evidence!r} is dated "
            f"{record.get('date')!r}"
        )
    if record.get("profile") != profile:
        problems.append(f"{label}: evidence {evidence!r} is for profile={record.get('profile')!r}")
    try:
        current = profile_config_hash(config, loader)
    except (OSError, AttributeError, ValueError, TypeError, KeyError):
        return problems  # check_configs reports the broken config
    if record.get("config_hash") != current:
        problems.append(
            f"{label}: evidence {evidence!r} has config_hash={record.get('config_hash')!r}, the "
            f"config now hashes to {current!r}; qualify it again"
        )
    return problems


def check_image_record(
    root: Path, journey_name: str, record: dict[str, Any], image_id: str | None = None
) -> list[str]:
    """What a record written by an image's ``qualify`` must show to count: it passed, it has
    every record field, it is for a profile of the journey whose config (in this checkout)
    hashes to its ``config_hash``, and it names a source revision and an image digest (the
    image ID ``ci/images.py`` passed in, when given)."""
    where = f"record of {journey_name} {record.get('profile')!r}"
    problems = []
    missing = [key for key in (*RECORD_FIELDS, "git_revision") if key not in record]
    if missing:
        problems.append(f"{where}: lacks fields {missing}")
    if record.get("passed") is not True:
        problems.append(f"{where}: passed={record.get('passed')!r}")
    for key in ("git_revision", "image_digest"):
        if not record.get(key):
            problems.append(f"{where}: {key}={record.get(key)!r}, a record from an image needs one")
    if image_id and record.get("image_digest") not in (None, image_id):
        problems.append(
            f"{where}: image_digest={record.get('image_digest')!r}, the image is {image_id!r}"
        )
    try:
        journey = journeys_lib.get_journey(root, journey_name)
        recipe = journeys_lib.load_recipe(journey.path(root) / "recipe.yaml")
        profile = journeys_lib.get_profile(
            recipe, str(record.get("profile")), f"{journey.folder}/recipe.yaml"
        )
        loader, errors = journey_loader(journey)
        if errors:
            raise ValueError("; ".join(errors))
        current = profile_config_hash(journey.path(root) / profile["config"], loader)
    except (JourneyError, OSError, AttributeError, ValueError, TypeError, KeyError) as exc:
        return [*problems, f"{where}: cannot check its profile: {exc}"]
    if record.get("config_hash") != current:
        problems.append(
            f"{where}: config_hash={record.get('config_hash')!r}, the config here hashes to "
            f"{current!r}"
        )
    return problems
