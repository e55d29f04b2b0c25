"""Training data through Hugging Face ``datasets``: local JSON, JSONL, Parquet, pinned Hub ids.

A profile's data field (SFT ``dataset``, OPD ``prompts``) names one *source*:

- a local file, ``.json``, ``.jsonl`` or ``.parquet``: relative to the recipe folder (the
  checked-in defaults, e.g. ``data/identity.jsonl``) or absolute;
- a Hub dataset, ``hub:<owner>/<name>@<commit>[:<split>]``, where ``<commit>`` is the full
  40-hex commit of the dataset repository (a branch or tag can move, so it is refused) and
  ``<split>`` defaults to ``train``. Nothing is downloaded at run time here: with
  ``HF_HUB_OFFLINE=1`` or ``HF_DATASETS_OFFLINE=1`` only a revision already in the cache loads.

:func:`load_records` loads a source with ``datasets.load_dataset`` (the ``json`` or
``parquet`` builder for files), checks the columns the journey needs and returns the rows as
dicts, in file order. Its Arrow cache lives under the project's cache directory
(``$HF_DATASETS_CACHE``, else ``$CORTEX_RECIPES_CACHE/datasets`` or the platform user cache),
never in the repository.

Invariants this module keeps:

- A missing file, an unknown file type, an unpinned Hub id, a missing column or an empty
  dataset raises :class:`DataError` naming the profile field, its value and what is accepted.
- Row order is the source's order, so a seeded batch order over the rows is deterministic.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cortex_recipes.profiles import ProfileError

log = logging.getLogger(__name__)

HUB_PREFIX = "hub:"
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}
_HUB = re.compile(r"^hub:(?P<repo>[\w.-]+/[\w.-]+)(?:@(?P<rev>[^:]*))?(?::(?P<split>[\w.-]+))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
ACCEPTED = (
    "a .json, .jsonl or .parquet file (relative to the recipe folder, or absolute), or "
    "hub:<owner>/<name>@<40-hex commit>[:<split>]"
)


class DataError(ProfileError):
    """A data source that cannot be loaded; the message names the field, the value and what is
    accepted."""


@dataclass(frozen=True)
class Source:
    """A parsed data source: a local file (``path``) or a pinned Hub dataset."""

    field: str
    value: str
    path: Path | None = None
    repo: str = ""
    revision: str = ""
    split: str = "train"

    def describe(self) -> str:
        return f"{self.field}={self.value!r}"


def parse_source(field: str, value: str, base_dir: Path) -> Source:
    """The source ``value`` of profile field ``field``; relative files resolve in ``base_dir``."""
    if not isinstance(value, str) or not value:
        raise DataError(f"{field}={value!r} names no data; accepted: {ACCEPTED}")
    if value.startswith(HUB_PREFIX):
        match = _HUB.match(value)
        if not match:
            raise DataError(f"{field}={value!r} is not a Hub id; accepted: {ACCEPTED}")
        revision = match["rev"] or ""
        if not _COMMIT.match(revision):
            got = f"revision {revision!r}" if revision else "no revision"
            raise DataError(
                f"{field}={value!r} has {got}: a Hub dataset must be pinned to the full 40-hex "
                f"commit of its repository (hub:{match['repo']}@<commit>); branches and tags "
                "move, so they are refused"
            )
        return Source(field, value, repo=match["repo"], revision=revision,
                      split=match["split"] or "train")  # fmt: skip
    path = Path(value)
    if not path.is_absolute():
        path = (base_dir / path).resolve()
    if path.suffix not in FILE_BUILDERS:
        raise DataError(
            f"{field}={value!r}: file type {path.suffix or '(none)'!r} is not read; "
            f"accepted: {ACCEPTED}"
        )
    if not path.is_file():
        raise DataError(f"{field}={value!r}: {path} does not exist; accepted: {ACCEPTED}")
    return Source(field, value, path=path)


def _cache_dir() -> str:
    """``$HF_DATASETS_CACHE`` (datasets' own setting) when set, else the project's cache: an
    image sets it, since its project cache holds the baked fixtures and is read-only there."""
    from cortex_recipes.models.cache import cache_root

    return os.environ.get("HF_DATASETS_CACHE") or str(cache_root() / "datasets")


def load_dataset(source: Source):
    """The source as a ``datasets.Dataset`` (one split)."""
    import datasets

    datasets.disable_progress_bars()  # library code: no bars on stderr unless a caller asks
    try:
        if source.path is not None:
            return datasets.load_dataset(
                FILE_BUILDERS[source.path.suffix],
                data_files=str(source.path),
                split="train",
                cache_dir=_cache_dir(),
            )
        return datasets.load_dataset(
            source.repo, revision=source.revision, split=source.split, cache_dir=_cache_dir()
        )
    except Exception as exc:
        where = source.path or f"{source.repo}@{source.revision} split {source.split!r}"
        raise DataError(
            f"{source.describe()}: {where} could not be loaded through datasets "
            f"({type(exc).__name__}: {exc}); accepted: {ACCEPTED}"
        ) from exc


def load_records(
    field: str,
    value: str,
    base_dir: Path,
    columns: Mapping[str, Callable[[Any], bool]],
) -> list[dict[str, Any]]:
    """The rows of source ``value`` (profile field ``field``), each with the ``columns`` the
    journey needs; ``columns`` maps a column name to a check of one value."""
    source = parse_source(field, value, Path(base_dir))
    dataset = load_dataset(source)
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise DataError(
            f"{source.describe()}: no column {', '.join(map(repr, missing))} (columns: "
            f"{', '.join(dataset.column_names) or 'none'}); accepted: rows with "
            + ", ".join(repr(c) for c in columns)
        )
    if len(dataset) == 0:
        raise DataError(f"{source.describe()}: the dataset has no rows")
    rows = dataset.select_columns(list(columns)).to_list()
    for n, row in enumerate(rows, start=1):
        for column, check in columns.items():
            if not check(row[column]):
                raise DataError(
                    f"{source.describe()}: row {n} column {column!r} = {row[column]!r} "
                    f"is not {getattr(check, '__doc__', None) or 'accepted'}"
                )
    log.info("%s: %d rows through datasets", source.describe(), len(rows))
    return rows


def messages_column(value: Any) -> bool:
    """a non-empty list of {role, content} messages"""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)
    )


def prompt_column(value: Any) -> bool:
    """a non-empty string"""
    return isinstance(value, str) and bool(value.strip())
