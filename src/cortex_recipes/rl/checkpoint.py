"""Orchestrator checkpoints: ``<run>/checkpoints/step_N/orchestrator.json``, written atomically.

Each file names the trainer checkpoint saved at the same step (job id, checkpoint id, stage
path) and the orchestrator state resume needs (prime-rl's ``checkpoints/step_N/orchestrator``
layout, as JSON: nothing is ever unpickled). A step directory without the file is incomplete
and ignored, so a crash while saving never hides the previous good checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

STATE_FILE = "orchestrator.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from; the message names the file and the field."""


class RunCheckpoints:
    def __init__(self, root: Path):
        self.root = Path(root)

    def steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        found = []
        for child in self.root.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and (child / STATE_FILE).is_file():
                found.append(int(match.group(1)))
        return sorted(found)

    def save(self, step: int, state: dict[str, Any]) -> Path:
        directory = self.root / f"step_{step}"
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{STATE_FILE}.tmp"
        with open(tmp, "w") as f:
            json.dump({**state, "step": step}, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / STATE_FILE)
        return directory / STATE_FILE

    def load(self, step: int) -> dict[str, Any]:
        path = self.root / f"step_{step}" / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path} cannot be read: {exc}") from exc
        if not isinstance(state, dict) or state.get("step") != step:
            raise CheckpointError(f"{path}: step={state.get('step')!r} does not match its folder")
        trainer = state.get("trainer")
        if not isinstance(trainer, dict) or not all(
            isinstance(trainer.get(k), str) and trainer[k] for k in ("job_id", "checkpoint_id")
        ):
            raise CheckpointError(f"{path}: trainer={trainer!r} must name job_id and checkpoint_id")
        return state

    def latest(self) -> dict[str, Any] | None:
        steps = self.steps()
        return self.load(steps[-1]) if steps else None

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
