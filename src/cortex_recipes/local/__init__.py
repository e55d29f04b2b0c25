"""The embedded Cortex Training-compatible backend (FastAPI + one worker process per sub-job)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cortex_recipes.local.server import LocalBackend

__all__ = ["LocalBackend"]


def __getattr__(name: str):
    # Lazy, so `python -m cortex_recipes.local.server` does not import the module twice.
    if name == "LocalBackend":
        from cortex_recipes.local.server import LocalBackend

        return LocalBackend
    raise AttributeError(name)
