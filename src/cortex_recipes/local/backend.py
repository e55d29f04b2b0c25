"""The local backend's parts, wired together once: what the HTTP routes call.

- :class:`~cortex_recipes.local.jobs.JobRegistry`: jobs, sub-jobs, workers, placement;
- :class:`~cortex_recipes.local.dispatch.Dispatcher`: work as asynchronous requests;
- :class:`~cortex_recipes.local.data_plane.DataPlane`: forward-backward, step, save, load,
  generate, checkpoints, polling;
- :data:`~cortex_recipes.local.operations.OPERATIONS`: the ``/operation`` table.
The parts do not reach into each other beyond these references.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cortex_recipes.local.data_plane import DataPlane
from cortex_recipes.local.dispatch import Dispatcher
from cortex_recipes.local.jobs import JobRegistry
from cortex_recipes.local.operations import run_operation


class Backend:
    def __init__(self, state_dir: Path, *, hosted: bool = False, **registry_options: Any):
        """``registry_options``: :class:`~cortex_recipes.local.jobs.JobRegistry`'s (``device``,
        ``threads``, ``result_chunk_bytes``, ``poll_wait_s``)."""
        self.hosted = hosted  # hosted-conformance mode (cortex_recipes.local.hosted)
        self.registry = JobRegistry(state_dir, hosted=hosted, **registry_options)
        self.dispatcher = Dispatcher()
        self.data_plane = DataPlane(self.registry, self.dispatcher, hosted=hosted)

    def operation(self, job_id: str, body: Any) -> dict[str, Any]:
        return run_operation(self, job_id, body)

    def shutdown(self) -> None:
        self.registry.shutdown()
        self.dispatcher.shutdown()
