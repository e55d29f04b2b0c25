"""The embedded Cortex Training-compatible backend (FastAPI + one worker process per sub-job)."""

from cortex_recipes.local.server import LocalBackend

__all__ = ["LocalBackend"]
