"""Where built model fixtures live, and how a build lands there atomically.

Fixtures are cached under one user cache directory (``CORTEX_RECIPES_CACHE`` overrides it).
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
COMPLETE_MARKER = ".complete"


def cache_root() -> Path:
    """The root cache directory: ``$CORTEX_RECIPES_CACHE`` or the platform user cache dir."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("cortex-recipes"))


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return ``target``, building it with ``build(tmp_dir)`` first if it is not complete.

    ``build`` writes every file into the directory it is given; that directory is renamed to
    ``target`` after ``build`` returns, so ``target`` either holds a finished build or does
    not exist.
    """
    if (target / COMPLETE_MARKER).is_file():
        return target
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
