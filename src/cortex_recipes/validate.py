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

import ast
import hashlib
import importlib.util
import json
import logging
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cortex_recipes import journeys as journeys_lib
from cortex_recipes import schema
from cortex_recipes.journeys import Journey, JourneyError
from cortex_recipes.qualify import config_hash, latest_validation, nested_values
from cortex_recipes.sub_jobs import SubJobError, build_sub_jobs

log = logging.getLogger(__name__)

RECIPE_SCHEMA = "recipes/recipe.schema.json"
REQUIRED_SECTIONS = (
    "Outcome",
    "Prerequisites",
    "Hardware",
    "Commands",
    "Expected metrics",
    "Configuration",
    "Troubleshooting",
)
RECORD_FIELDS = (
    "profile", "passed", "date", "config_hash", "checks", "metrics", "packages", "hardware",
    "image_digest",
)  # fmt: skip


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


def _revision_known(root: Path, revision: str) -> bool | None:
    """Whether ``revision`` (``+dirty`` stripped) is a commit of the repository at ``root``;
    None where ``root`` is not a git checkout (an image), so history cannot be asked."""
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


def stale_records(root: Path) -> list[StaleRecord]:
    """Evidence behind a ``last_validated`` that no longer describes the code.

    A record is stale when it carries no ``code_digest`` (recorded before digests existed),
    when its digest differs from :func:`cortex_recipes.provenance.code_digest` of the journey
    now, or when its ``git_revision`` is missing or not in this repository's history. One
    record may be stale for more than one reason (one entry each).
    """
    from cortex_recipes.provenance import code_digest

    root = root.resolve()
    stale: list[StaleRecord] = []
    for journey in journeys_lib.load_journeys(root):
        if not journey.landed:
            continue
        folder = journey.path(root)
        try:
            recipe = journeys_lib.load_recipe(folder / "recipe.yaml")
        except JourneyError:
            continue  # validate_repository reports it
        current = code_digest(root, folder)
        for profile in recipe.get("profiles") or []:
            evidence = profile.get("evidence")
            if not profile.get("last_validated") or not evidence:
                continue
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
    problems += _mutable_problems(where, recipe_path.read_text())
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
    problems += _repo_paths_problems(root, where, str(recipe.get("smoke_command", "")))
    problems += _dataset_problems(folder, where, recipe)
    loader, loader_problems = _loader(journey)
    problems += loader_problems
    problems += check_configs(root, folder, recipe, loader)
    if not schema_problems:
        problems += _validation_problems(folder, where, recipe, loader)
    return problems


# --- README ---------------------------------------------------------------------------------

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_REPO_PATH = re.compile(r"(?<![\w./-])((?:recipes|src|docs|model-catalog|tests)/[\w./-]*[\w/])")


def split_markdown(text: str) -> tuple[list[str], list[str]]:
    """(prose lines, code lines): fenced blocks are code; inline code spans count as code."""
    prose, code, fenced = [], [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            code.append(line)
        else:
            prose.append(line)
            code += _INLINE_CODE.findall(line)
    return prose, code


def section_headings(text: str) -> list[str]:
    prose, _ = split_markdown(text)
    return [line[3:].strip() for line in prose if line.startswith("## ")]


def has_section(headings: list[str], section: str) -> bool:
    name = section.casefold()
    for heading in headings:
        folded = heading.casefold()
        if folded == name:
            return True
        if folded.startswith(name) and not folded[len(name)].isalnum():
            return True
    return False


def check_readme(root: Path, readme: Path) -> list[str]:
    where = readme.relative_to(root).as_posix()
    if not readme.is_file():
        return [f"{where}: missing (every journey has a README.md)"]
    text = readme.read_text()
    headings = section_headings(text)
    problems = [
        f"{where}: missing required section {section!r} (a '## {section}' heading)"
        for section in REQUIRED_SECTIONS
        if not has_section(headings, section)
    ]
    prose, code = split_markdown(text)
    for line in prose:
        for target in _LINK.findall(_INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            if not (readme.parent / target.split("#")[0]).exists():
                problems.append(f"{where}: link target {target!r} does not exist")
    for line in code:
        problems += _repo_paths_problems(root, where, line)
        problems += _mutable_problems(where, line)
    return problems


def _repo_paths_problems(root: Path, where: str, text: str) -> list[str]:
    return [
        f"{where}: {path!r} does not exist"
        for path in _REPO_PATH.findall(text)
        if not (root / path).exists()
    ]


# --- mutable references -------------------------------------------------------------------

_MUTABLE_REF = re.compile(
    r"@(main|master|latest|head|dev|develop|trunk|nightly)\b(?![\w.-])", re.IGNORECASE
)
_LATEST_TAG = re.compile(r"[\w./-]+:latest\b")
_GIT_URL = re.compile(r"git\+[^\s\"'<>)]+")
_PIP_INSTALL = re.compile(r"\b(?:pip3?|pipx|uv pip|uv tool)\s+install\s+([^;&|\n]+)")
_UV_RESOLVING = re.compile(r"\buv\s+(sync|run)\b([^;&|\n]*)")
_PIP_VALUE_OPTIONS = {
    "-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-i", "--index-url",
    "--extra-index-url", "-t", "--target", "--prefix", "-f", "--find-links", "--python",
}  # fmt: skip


def mutable_references(text: str) -> list[str]:
    """Each dependency reference in ``text`` that can change under the same name."""
    found = [f"mutable reference {m.group(0)!r}" for m in _MUTABLE_REF.finditer(text)]
    found += [f"mutable image tag {m.group(0)!r}" for m in _LATEST_TAG.finditer(text)]
    for match in _GIT_URL.finditer(text):
        if not re.search(r"@[0-9a-f]{40}\b", match.group(0)):
            found.append(f"git URL {match.group(0)!r} is not pinned to a 40-hex commit")
    for match in _PIP_INSTALL.finditer(text):
        found += [f"unpinned install {arg!r} (pin it with ==)" for arg in _unpinned(match[1])]
    for match in _UV_RESOLVING.finditer(text):
        if not re.search(r"--(frozen|locked)\b", match.group(2)):
            found.append(f"'uv {match.group(1)}' without --frozen or --locked re-resolves")
    return found


def _unpinned(arguments: str) -> Iterator[str]:
    try:
        tokens = shlex.split(arguments)
    except ValueError:
        tokens = arguments.split()
    skip_next = False
    for token in tokens:
        if skip_next:
            skip_next = False
            continue
        if token in _PIP_VALUE_OPTIONS:
            skip_next = True
            continue
        if token.startswith("-") or token.startswith(("git+", ".", "/", "~", "$")):
            continue
        if "==" in token or token.endswith((".whl", ".tar.gz", ".zip")) or " @ " in token:
            continue
        yield token


def _mutable_problems(where: str, text: str) -> list[str]:
    return [f"{where}: {problem}" for problem in mutable_references(text)]


# --- entry points -------------------------------------------------------------------------


def _module_file(root: Path, module: str) -> Path | None:
    parts = module.split(".")
    for base in (root, root / "src"):
        candidate = base.joinpath(*parts)
        if candidate.with_suffix(".py").is_file():
            return candidate.with_suffix(".py")
        if (candidate / "__init__.py").is_file():
            return candidate / "__init__.py"
    return None


def _is_local_package(root: Path, top: str) -> bool:
    return any(
        (base / top).is_dir() or (base / f"{top}.py").is_file() for base in (root, root / "src")
    )


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    sides = [node.test.left, *node.test.comparators]
    names = {s.id for s in sides if isinstance(s, ast.Name)}
    values = {s.value for s in sides if isinstance(s, ast.Constant)}
    return names == {"__name__"} and values == {"__main__"}


_DEFINITIONS = (
    ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
    ast.AnnAssign, ast.Pass,
)  # fmt: skip


def check_module(root: Path, module: str, label: str) -> list[str]:
    """A ``python -m`` module that exists, parses, and does nothing when imported."""
    path = _module_file(root, module)
    if path is None:
        return [f"{label}={module!r} is not importable: no module file in the repository"]
    where = path.relative_to(root).as_posix()
    try:
        tree = ast.parse(path.read_text(), filename=where)
    except SyntaxError as exc:
        return [f"{where}: {label}={module!r} does not parse: {exc.msg} (line {exc.lineno})"]
    problems = []
    if not any(_is_main_guard(node) for node in tree.body):
        problems.append(f'{where}: has no `if __name__ == "__main__":` guard')
    for i, node in enumerate(tree.body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if docstring or _is_main_guard(node) or isinstance(node, _DEFINITIONS):
            continue
        if isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, import fallbacks
            continue
        problems.append(
            f"{where}: line {node.lineno} runs {type(node).__name__} at import; "
            "importing the entry point must not run anything"
        )
    for node in tree.body:
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            problems += _import_problems(root, where, name)
    return problems


def _import_problems(root: Path, where: str, module: str) -> list[str]:
    top = module.split(".")[0]
    if _is_local_package(root, top):
        if _module_file(root, module) is None:
            return [f"{where}: imports {module!r}, which is not a module in the repository"]
        return []
    if importlib.util.find_spec(top) is None:
        return [f"{where}: imports {module!r}, but package {top!r} is not installed"]
    return []


# --- configs ------------------------------------------------------------------------------


def _loader(journey: Journey):
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
            problems += _mutable_problems(where, text)
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


# --- recipe.yaml semantics ----------------------------------------------------------------


def _dataset_problems(folder: Path, where: str, recipe: dict[str, Any]) -> list[str]:
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


def _validation_problems(folder: Path, where: str, recipe: dict[str, Any], loader) -> list[str]:
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
        loader, errors = _loader(journey)
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
