"""The weight-version files shared by prime-rl's orchestrator and the two Cortex adapters.

prime-rl's filesystem protocol: the trainer publishes policy version ``v`` as
``<output_dir>/broadcasts/step_<v>/`` and then touches ``STABLE`` in it; the orchestrator's
``WeightWatcher`` sees the newest stable version and asks the inference server to
``/update_weights {"weight_dir": ".../broadcasts/step_<v>"}``. The orchestrator never reads the
weights: the directory is only a version name.

On Cortex the sampler's weights arrive by ``weight_sync`` from the training sub-job's *live*
weights, which is the hazard the protocol has to close: the batch for step ``v+1`` can reach the
trainer before version ``v`` is applied, and if the trainer steps first, a late sync would give
the sampler ``v+1``'s weights under ``v``'s name. Invariants kept here and by the adapters:

1. ``step_<v>/cortex_version.json`` (the version, the job and the checkpoint holding exactly
   those weights) is written before ``STABLE``; a directory without both is not published.
2. ``cortex/trainer_live.json`` says which version the training sub-job holds right now:
   ``{"version": v, "state": "stable"}``, or ``"stepping"`` while an optimizer step is under way.
   Only the trainer adapter writes it.
3. The inference adapter syncs for version ``v`` only while the live file says ``v``/``stable``
   for its own job, and then writes ``step_<v>/APPLIED`` naming that job. Only the inference
   adapter writes ``APPLIED``; a marker names the sampler of one job, so a resumed run's new
   job never takes an old job's marker for its own sampler's weights.
4. The trainer adapter never marks itself ``stepping`` past ``v`` (v >= 1) before
   ``step_<v>/APPLIED`` exists (the run's last step waits a bounded time: the orchestrator may
   be gone). Invariant 3 alone keeps labels right; invariant 4 keeps the run moving: between
   the live check and the sync the weights cannot move, so each version gets applied.

All files are written atomically (temp file + rename).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

STABLE = "STABLE"  # prime-rl's marker: the version directory is complete
APPLIED = "APPLIED"  # this project's marker: the sampler holds exactly this version
MANIFEST = "cortex_version.json"
LIVE = "trainer_live.json"
LIVE_STATES = ("stable", "stepping")
_STEP_DIR = re.compile(r"^step_(\d+)$")


class BroadcastError(ValueError):
    """A weight-version file or directory that cannot be used; names the path and the field."""


def broadcasts_dir(output_dir: Path) -> Path:
    return Path(output_dir) / "broadcasts"


def version_dir(output_dir: Path, version: int) -> Path:
    return broadcasts_dir(output_dir) / f"step_{version}"


def live_path(output_dir: Path) -> Path:
    return Path(output_dir) / "cortex" / LIVE


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def version_of(weight_dir: str | Path) -> int:
    """The version a ``weight_dir`` names (``.../step_<v>``)."""
    match = _STEP_DIR.match(Path(weight_dir).name)
    if not match:
        raise BroadcastError(
            f"weight_dir={str(weight_dir)!r} does not name a version; expected "
            "'<output_dir>/broadcasts/step_<v>'"
        )
    return int(match.group(1))


def publish(output_dir: Path, version: int, manifest: dict[str, Any]) -> Path:
    """Write ``step_<version>/cortex_version.json``, then ``STABLE`` (invariant 1)."""
    directory = version_dir(output_dir, version)
    write_json_atomic(directory / MANIFEST, {**manifest, "version": version})
    (directory / STABLE).touch()
    return directory


def read_manifest(weight_dir: Path) -> dict[str, Any]:
    """The manifest of a published version; refuses an unpublished or mislabelled one."""
    weight_dir = Path(weight_dir)
    version = version_of(weight_dir)
    if not (weight_dir / STABLE).is_file():
        raise BroadcastError(
            f"{weight_dir} has no {STABLE} marker: version {version} is not published"
        )
    path = weight_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BroadcastError(f"{path} cannot be read: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("version") != version:
        got = manifest.get("version") if isinstance(manifest, dict) else manifest
        raise BroadcastError(f"{path}: version={got!r} does not match its folder (step_{version})")
    for key in ("job_id", "checkpoint_id"):
        if not isinstance(manifest.get(key), str) or not manifest[key]:
            raise BroadcastError(f"{path}: {key}={manifest.get(key)!r} must be a non-empty string")
    return manifest


def published_versions(output_dir: Path) -> list[int]:
    """Versions with both a manifest and ``STABLE``, ascending."""
    root = broadcasts_dir(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / STABLE).is_file() and (child / MANIFEST).is_file():
            found.append(int(match.group(1)))
    return sorted(found)


def latest_published(output_dir: Path) -> dict[str, Any] | None:
    versions = published_versions(output_dir)
    return read_manifest(version_dir(output_dir, versions[-1])) if versions else None


def mark_applied(output_dir: Path, version: int, detail: dict[str, Any]) -> None:
    """``step_<version>/APPLIED``; ``detail`` names the ``job_id`` whose sampler holds it."""
    write_json_atomic(version_dir(output_dir, version) / APPLIED, {**detail, "version": version})


def is_applied(output_dir: Path, version: int, job_id: str | None = None) -> bool:
    """Whether the sampler of ``job_id`` (any job when None) holds ``version``."""
    path = version_dir(output_dir, version) / APPLIED
    if not path.is_file():
        return False
    if job_id is None:
        return True
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BroadcastError(f"{path} cannot be read: {exc}") from exc
    return isinstance(marker, dict) and marker.get("job_id") == job_id


def latest_applied(output_dir: Path, job_id: str | None = None) -> int | None:
    """The newest version the sampler of ``job_id`` (any job when None) was synced to."""
    root = broadcasts_dir(output_dir)
    if not root.is_dir():
        return None
    found = [
        int(m.group(1))
        for child in root.iterdir()
        if (m := _STEP_DIR.match(child.name)) and is_applied(output_dir, int(m.group(1)), job_id)
    ]
    return max(found) if found else None


def write_live(output_dir: Path, version: int, state: str, job_id: str) -> None:
    if state not in LIVE_STATES:
        raise BroadcastError(f"state={state!r}; accepted: {', '.join(LIVE_STATES)}")
    write_json_atomic(
        live_path(output_dir),
        {"version": version, "state": state, "job_id": job_id, "time": time.time()},
    )


def read_live(output_dir: Path) -> dict[str, Any] | None:
    path = live_path(output_dir)
    if not path.is_file():
        return None
    try:
        live = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BroadcastError(f"{path} cannot be read: {exc}") from exc
    if not isinstance(live, dict) or live.get("state") not in LIVE_STATES:
        raise BroadcastError(f"{path}: state must be one of {LIVE_STATES}, got {live!r}")
    if not isinstance(live.get("version"), int):
        raise BroadcastError(f"{path}: version={live.get('version')!r} must be an integer")
    return live


class Stopped(RuntimeError):
    """A wait was given up because its owner was told to stop (the orchestrator has exited)."""


def wait_for(predicate, *, timeout_s: float, poll_s: float, what: str, stop=None) -> float:
    """Poll ``predicate`` until true; seconds waited. Raises ``TimeoutError`` naming ``what``,
    or :class:`Stopped` once ``stop`` (a ``threading.Event``) is set."""
    start = time.monotonic()
    while not predicate():
        if stop is not None and stop.is_set():
            raise Stopped(f"stopped while waiting for {what}")
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"gave up after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)
    return time.monotonic() - start
