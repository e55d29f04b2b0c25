"""Hub weights pinned like code: a revision (the 40-hex commit) and the sha256 of each weight file.

Every ``source: hub`` model in ``model-catalog/models.json`` carries its pin::

    "revision": "<40 hex>" | null,
    "weights": {"model.safetensors": "<64 hex>", ...} | null,
    "pin_status": "pinned" | "unverified",
    "pin_note": "where the values came from, or what is missing"

``pinned`` means every field has a value; ``unverified`` means at least one is null, and
:func:`verify` fails closed on it with the command that fills it in.

- :func:`fetch` downloads exactly the pinned revision with ``huggingface_hub.snapshot_download``
  into the Hugging Face cache (``HF_HUB_CACHE``/``HF_HOME``) or, with ``local_dir``, into
  ``<dir>/<org>/<name>`` for ``$CORTEX_RECIPES_MODEL_DIRS``. It is the only code here that uses
  the network, and it only runs on a machine that can reach the Hub. ``pin=True`` pins what it
  downloaded (the revision and the hashes) into models.json; a maintainer commits that.
- :func:`verify` finds the weights where the resolver looks (``$CORTEX_RECIPES_MODEL_DIRS``,
  then the cache's ``snapshots/<pinned revision>``), hashes each pinned file and reports every
  missing file, mismatch and unfilled pin as a problem naming the command that fixes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CATALOG_MODELS = Path("model-catalog") / "models.json"
MODEL_DIRS_ENV = "CORTEX_RECIPES_MODEL_DIRS"
REVISION_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
PIN_STATUSES = ("pinned", "unverified")
# Files a pin hashes: the weights (and the tokenizer, which the Hub also stores as LFS).
WEIGHT_GLOBS = ("*.safetensors", "tokenizer.json")


class WeightsError(LookupError):
    """A pin that is missing, unfilled or malformed, or weights that do not match it."""


@dataclass(frozen=True)
class Pin:
    name: str
    revision: str | None
    weights: dict[str, str] | None
    status: str
    note: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.status == "pinned" and not self.problems


def fetch_command(name: str, pin: bool = False) -> str:
    return f"cortex-recipes models fetch {name}" + (" --pin" if pin else "")


def pin_problems(entry: dict[str, Any]) -> list[str]:
    """What is wrong with one hub entry's pin fields, as ``field=value: what is accepted``."""
    name = entry.get("name")
    where = f"models[{name}]"
    problems = []
    status = entry.get("pin_status")
    if status not in PIN_STATUSES:
        problems.append(f"{where}.pin_status={status!r}: use one of {list(PIN_STATUSES)}")
    revision = entry.get("revision")
    if revision is not None and not (isinstance(revision, str) and REVISION_RE.match(revision)):
        problems.append(f"{where}.revision={revision!r}: a 40-hex commit, or null (unverified)")
    weights = entry.get("weights")
    if weights is not None:
        if not isinstance(weights, dict) or not weights:
            problems.append(f"{where}.weights={weights!r}: a non-empty {{file: sha256}} or null")
        else:
            for file, digest in weights.items():
                if not (isinstance(digest, str) and SHA256_RE.match(digest)):
                    problems.append(f"{where}.weights[{file}]={digest!r}: 64 hex digits")
    if status == "pinned" and (revision is None or weights is None):
        problems.append(
            f"{where}: pin_status='pinned' with revision={revision!r}, weights="
            f"{'null' if weights is None else '{...}'}; a pinned entry has both, else say "
            f"'unverified'"
        )
    if status == "unverified" and not entry.get("pin_note"):
        problems.append(f"{where}: pin_status='unverified' needs a pin_note saying what is missing")
    return problems


def load_pins(root: Path) -> dict[str, Pin]:
    """The pins of every ``source: hub`` model in ``root``'s model catalog."""
    path = root / CATALOG_MODELS
    try:
        models = json.loads(path.read_text())["models"]
    except (OSError, ValueError, KeyError) as exc:
        raise WeightsError(f"{path}: cannot read the model catalog: {exc}") from exc
    pins = {}
    for entry in models:
        if entry.get("source") != "hub":
            continue
        pins[entry["name"]] = Pin(
            name=entry["name"],
            revision=entry.get("revision"),
            weights=entry.get("weights"),
            status=entry.get("pin_status", "missing"),
            note=entry.get("pin_note", ""),
            problems=pin_problems(entry),
        )
    return pins


def get_pin(root: Path, name: str) -> Pin:
    pins = load_pins(root)
    if name not in pins:
        raise WeightsError(
            f"model name={name!r} is not a hub model of {CATALOG_MODELS}; hub models are "
            f"{sorted(pins)}"
        )
    return pins[name]


def pinned_revision(name: str, root: Path | None = None) -> str | None:
    """The pinned revision of ``name``, or None when there is no catalog or no pin."""
    try:
        if root is None:
            from cortex_recipes.journeys import JourneyError, find_root

            try:
                root = find_root()
            except JourneyError:
                return None
        pin = load_pins(root).get(name)
    except WeightsError:
        return None
    return pin.revision if pin else None


def hub_cache_dir() -> Path:
    import huggingface_hub.constants  # a lazily loaded submodule: import it by name

    return Path(huggingface_hub.constants.HF_HUB_CACHE)


def cache_snapshot(name: str, revision: str, cache_dir: Path | None = None) -> Path:
    """``<cache>/models--<org>--<name>/snapshots/<revision>``, the Hugging Face cache layout."""
    return (
        (cache_dir or hub_cache_dir())
        / f"models--{name.replace('/', '--')}"
        / "snapshots"
        / revision
    )


def model_dir_candidates(name: str) -> list[Path]:
    """The folders ``$CORTEX_RECIPES_MODEL_DIRS`` offers for ``name`` (as the resolver reads it)."""
    raw = os.environ.get(MODEL_DIRS_ENV, "")
    roots = [Path(p).expanduser() for p in raw.split(os.pathsep) if p]
    return [c for r in roots for c in (r / name, r / name.split("/")[-1])]


def locate(pin: Pin, cache_dir: Path | None = None) -> tuple[Path | None, list[str]]:
    """The folder holding ``pin``'s weights and the places searched."""
    searched = []
    for candidate in model_dir_candidates(pin.name):
        searched.append(str(candidate))
        if (candidate / "config.json").is_file():
            return candidate, searched
    if pin.revision:
        snapshot = cache_snapshot(pin.name, pin.revision, cache_dir)
        searched.append(str(snapshot))
        if (snapshot / "config.json").is_file():
            return snapshot, searched
    return None, searched


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verify(root: Path, name: str, cache_dir: Path | None = None) -> tuple[Path | None, list[str]]:
    """Check ``name``'s local weights against its pin; return the folder and every problem.

    Fails closed: an unfilled or malformed pin, a missing folder, a missing file and a hash
    mismatch are each a problem, and each names the command that fixes it.
    """
    pin = get_pin(root, name)
    if pin.problems:
        return None, [f"{CATALOG_MODELS}: {p}" for p in pin.problems]
    if not pin.complete:
        return None, [
            f"{CATALOG_MODELS}: models[{name}] is pin_status={pin.status!r} (revision="
            f"{pin.revision!r}, weights={'null' if pin.weights is None else 'set'}): nothing to "
            f"check the weights against. {pin.note} On a machine that reaches the Hub run "
            f"`{fetch_command(name, pin=True)}` and commit the values it writes."
        ]
    folder, searched = locate(pin, cache_dir)
    if folder is None:
        return None, [
            f"{name}: no weights at revision {pin.revision}; searched {', '.join(searched)}. "
            f"On a machine that reaches the Hub run `{fetch_command(name)}` (the download only "
            f"runs there), then mount or copy the cache here"
        ]
    problems = []
    for file, expected in sorted((pin.weights or {}).items()):
        path = folder / file
        if not path.is_file():
            problems.append(
                f"{name}: {path} is missing (pinned sha256 {expected}); run `{fetch_command(name)}`"
            )
            continue
        actual = sha256_file(path)
        if actual != expected:
            problems.append(
                f"{name}: {path} has sha256 {actual}, the pin says {expected}: not the pinned "
                f"revision {pin.revision}'s file. Delete it and run `{fetch_command(name)}`"
            )
    return folder, problems


def weight_files(folder: Path) -> list[str]:
    names = {p.name for glob in WEIGHT_GLOBS for p in folder.glob(glob) if p.is_file()}
    return sorted(names)


def write_pin(root: Path, name: str, revision: str, weights: dict[str, str], note: str) -> Path:
    """Record ``revision`` and ``weights`` as ``name``'s pin in the model catalog."""
    path = root / CATALOG_MODELS
    data = json.loads(path.read_text())
    for entry in data["models"]:
        if entry.get("name") == name and entry.get("source") == "hub":
            entry.update(revision=revision, weights=weights, pin_status="pinned", pin_note=note)
            break
    else:
        raise WeightsError(f"{path}: no hub model named {name!r}")
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return path


def fetch(
    root: Path, name: str, *, pin: bool = False, local_dir: Path | None = None
) -> tuple[Path, list[str]]:
    """Download ``name`` at its pinned revision (needs the network); return the folder and the
    problems :func:`verify` finds in it. ``pin=True`` on an unfilled pin downloads ``main`` and
    pins the commit and hashes it got."""
    current = get_pin(root, name)
    if current.revision is None and not pin:
        raise WeightsError(
            f"{CATALOG_MODELS}: models[{name}].revision is null, so there is no revision to fetch; "
            f"`{fetch_command(name, pin=True)}` downloads main and pins the commit it gets"
        )
    import huggingface_hub

    if os.environ.get("HF_HUB_OFFLINE") not in (None, "", "0"):
        raise WeightsError(
            "HF_HUB_OFFLINE is set, and fetching needs the Hub: run this on a networked machine "
            "with HF_HUB_OFFLINE unset (images set it; fetch on the host and mount the cache)"
        )
    revision = current.revision or "main"
    target = None if local_dir is None else local_dir / name
    path = Path(
        huggingface_hub.snapshot_download(
            repo_id=name, revision=revision, local_dir=str(target) if target else None
        )
    )
    if pin:
        got = current.revision
        if got is None:
            if target is not None:
                raise WeightsError("--pin of an unpinned model needs the cache, not --local-dir")
            got = path.name  # snapshots/<commit>
        hashes = {file: sha256_file(path / file) for file in weight_files(path)}
        write_pin(root, name, got, hashes, note=f"pinned by `{fetch_command(name, pin=True)}`")
        log.info("pinned %s at %s (%d files) in %s", name, got, len(hashes), CATALOG_MODELS)
    if target is not None:
        problems = []
        pinned = get_pin(root, name)
        for file, expected in sorted((pinned.weights or {}).items()):
            if not (path / file).is_file() or sha256_file(path / file) != expected:
                problems.append(f"{name}: {path / file} does not match the pinned sha256")
        return path, problems
    return verify(root, name, cache_dir=path.parents[2])
