"""One check of a run's whole configuration before any backend starts or anything is written.

:meth:`cortex_recipes.run.RunConfig.open_run` calls :func:`check` with the journey's
command-line config, its typed profile (overrides applied) and the run folder. It refuses, in
one message that names each field or path, its value and what is accepted:

- a float that is not finite (NaN, infinity) anywhere in the profile, its free-form blocks
  (``training``, ...) included, or in the command-line config;
- sub-job settings the backend would refuse (a misspelt ``training.peft_config`` key, a bad
  optimizer field...): on the local backend, the sub-jobs the profile creates are parsed by the
  backend's own create-job parser (:func:`cortex_recipes.local.specs.parse_sub_jobs`), so the
  rules are the ones the backend applies, without starting it; a hosted endpoint applies its
  own when the job is created;
- a run folder that cannot be made or written: a file where the folder should be, or a
  folder (or its nearest existing parent) this process cannot write.

Typed profile fields are bounded where they are read (:mod:`cortex_recipes.profiles`:
``steps`` > 0, counts >= their minimum, choices), and so is ``steps=`` on the command line.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from cortex_recipes.profiles import ProfileError
from cortex_recipes.run_store import CheckpointError

LOCAL_CONNECTIONS = ("local", "local-hosted")


def not_finite(value: Any, where: str) -> list[str]:
    """``where=value`` for each float in ``value`` (nested dicts and lists) that is NaN or
    infinite, named by its dotted path."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [f"{where}={value!r}"]
    if isinstance(value, dict):
        found: list[str] = []
        for key, inner in value.items():
            found += not_finite(inner, f"{where}.{key}" if where else str(key))
        return found
    if isinstance(value, list | tuple):
        found = []
        for i, inner in enumerate(value):
            found += not_finite(inner, f"{where}[{i}]")
        return found
    return []


def check_numbers(config_fields: dict[str, Any], raw_profile: dict[str, Any]) -> None:
    bad = not_finite(config_fields, "") + not_finite(raw_profile, "")
    if bad:
        raise ProfileError(f"{'; '.join(bad)}: a number here must be finite (not NaN or infinity)")


def check_sub_jobs(profile: Any, connection: str) -> None:
    """The profile's sub-jobs through the local backend's create-job parser."""
    sub_jobs = getattr(profile, "sub_jobs", None)  # every journey profile has them
    if connection not in LOCAL_CONNECTIONS or sub_jobs is None:
        return
    from cortex_recipes.local.errors import BackendError
    from cortex_recipes.local.specs import parse_sub_jobs

    try:
        wires = [sub_job.to_wire() for sub_job in sub_jobs()]
        parse_sub_jobs("preflight", wires)
    except (BackendError, ValueError, TypeError) as exc:
        raise ProfileError(
            f"{getattr(profile, 'path', 'the profile')}: the sub-jobs it creates would be "
            f"refused by the backend: {exc} (sub_job_configs[0] is the trainer, from the "
            "profile's top-level fields and its training block; the others are samplers)"
        ) from None


def check_run_folder(path: Path) -> None:
    """``path`` can be created (or exists) as a folder this process writes in."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CheckpointError(
            f"run folder {path} is a file; name a folder with log_path= (it is created when "
            "missing) or another run_name"
        )
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise CheckpointError(
            f"run folder {path}: {existing} is a file, so the folder cannot be created; name "
            "another log_path"
        )
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".cortex-recipes-write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise CheckpointError(
            f"run folder {path}: cannot write in {existing} ({reason}); name a writable folder "
            f"with log_path=, or set $CORTEX_RECIPES_RUNS to a writable place for runs/"
        ) from None


def check(config: Any, profile: Any, path: Path) -> None:
    """Every check above, cheapest first; the first failing one raises."""
    import chz

    fields = chz.asdict(config) if chz.is_chz(config) else {}
    check_numbers(fields, getattr(profile, "raw", None) or {})
    check_sub_jobs(profile, getattr(config, "connection", "local"))
    check_run_folder(path)
