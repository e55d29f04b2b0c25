"""Where built model fixtures live, and how a build lands there atomically.

Fixtures are cached under one user cache directory (``CORTEX_RECIPES_CACHE`` overrides it).
Read-only caches built ahead of time (an image's baked fixtures) are named by
``CORTEX_RECIPES_BAKED_CACHE`` (paths separated by ``os.pathsep``): a finished build found at
the same relative path in one of them is used as it is, and anything not there is built in the
writable cache, never in a baked one.
A build writes into a temporary sibling directory and is renamed into place only when it is
complete, under an exclusive file lock, so a crash never leaves a half-built fixture behind
and two processes never build the same fixture at once.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import platformdirs

log = logging.getLogger(__name__)

CACHE_ENV = "CORTEX_RECIPES_CACHE"
BAKED_CACHE_ENV = "CORTEX_RECIPES_BAKED_CACHE"
COMPLETE_MARKER = ".complete"


def cache_root() -> Path:
    """The root cache directory: ``$CORTEX_RECIPES_CACHE`` or the platform user cache dir."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("cortex-recipes"))


def baked_roots() -> list[Path]:
    """The read-only caches of ``$CORTEX_RECIPES_BAKED_CACHE``, in order."""
    raw = os.environ.get(BAKED_CACHE_ENV, "")
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p]


def baked(target: Path) -> Path | None:
    """The finished build of ``target`` in a baked cache (same path relative to the cache root)."""
    try:
        relative = Path(target).relative_to(cache_root())
    except ValueError:
        return None
    for root in baked_roots():
        if (root / relative / COMPLETE_MARKER).is_file():
            return root / relative
    return None


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return ``target`` (or its finished copy in a baked cache), building it with
    ``build(tmp_dir)`` first if it is not complete.

    ``build`` writes every file into the directory it is given; that directory is renamed to
    ``target`` after ``build`` returns, so ``target`` either holds a finished build or does
    not exist.
    """
    if (target / COMPLETE_MARKER).is_file():
        return target
    ready = baked(target)
    if ready is not None:
        return ready
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        if (target / COMPLETE_MARKER).is_file():
            return target
        if target.exists():
            log.warning("removing incomplete fixture build at %s", target)
            shutil.rmtree(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            from cortex_recipes.progress import task

            with task(f"building model fixture {target.parent.name}", unit="build"):
                build(tmp)
            (tmp / COMPLETE_MARKER).write_text("")
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target
