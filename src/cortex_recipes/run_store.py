"""The checkpoint store of a run folder: ``checkpoints/step_N/state.json``, the resume state
of each saved step (written atomically: temp file, fsync, rename; a step folder without the
file is incomplete and ignored), and which of them a resume may trust.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


MANIFEST_FILE = "manifest.json"  # cortex_recipes.local.checkpoints.MANIFEST
# A resume state's mark that its trainer checkpoint had a manifest when it was saved.
MANIFESTED = "checkpoint_manifest"


def local_checkpoint(backend_dir: Path, trainer: dict[str, Any]) -> Path | None:
    """The folder of ``trainer``'s checkpoint (``job_id``, ``checkpoint_id``) under a local
    backend's ``backend_dir``, its newest ``global_step*``; None when it is not there."""
    pattern = f"jobs/{trainer['job_id']}/checkpoints/{trainer['checkpoint_id']}/global_step*"
    found = sorted(Path(backend_dir).glob(pattern))
    return found[-1] if found else None


class CheckpointError(RuntimeError):
    """A run that cannot be started or resumed as asked; the message names the file and field."""


def write_json_atomic(path: Path, data: Any, *, fsync: bool = False) -> None:
    tmp = path.parent / f".{path.name}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


class RunCheckpoints:
    """``<run>/checkpoints/step_N/state.json``: the resume state of each saved step."""

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
        write_json_atomic(directory / STATE_FILE, {**state, "step": step}, fsync=True)
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

    def latest_verified(self, backend_dir: Path) -> dict[str, Any] | None:
        """The newest resume state whose trainer checkpoint can be trusted; each newer one
        skipped is logged with the reason, and the one resumed from is named. When none can,
        CheckpointError names each one's reason (nothing is deleted).

        A checkpoint of a job on this machine's local backend (``backend_dir/jobs/<job>``)
        must be there and verify against its manifest
        (:func:`cortex_recipes.local.checkpoints.verify`); one whose folder is gone is skipped
        like a corrupt one. A run that recorded a manifest with its checkpoints
        (:data:`MANIFESTED` in any of its states) never trusts one without: deleting the
        proof does not bypass the check. A hosted job's checkpoint is verified by the service
        when it is loaded."""
        steps = self.steps()
        states = {step: self.load(step) for step in steps}
        manifested = any(state.get(MANIFESTED) for state in states.values())
        skipped: list[str] = []
        for step in reversed(steps):
            state, problem = states[step], None
            trainer = state["trainer"]
            directory = local_checkpoint(backend_dir, trainer)
            job_dir = Path(backend_dir) / "jobs" / trainer["job_id"]
            if directory is None and not job_dir.is_dir():
                return self._resuming(state, skipped)  # a hosted job's: the service verifies
            if directory is None:
                problem = (
                    f"trainer checkpoint {trainer['checkpoint_id']} is missing from "
                    f"{job_dir / 'checkpoints'}"
                )
            elif manifested and not (directory / MANIFEST_FILE).is_file():
                problem = (
                    f"{directory / MANIFEST_FILE} is missing, and this run wrote one with its "
                    f"checkpoints ({MANIFESTED} in its resume states): its files are unproven"
                )
            else:
                from cortex_recipes.local.checkpoints import CheckpointCorrupt, verify

                try:
                    verify(directory)
                except CheckpointCorrupt as exc:
                    problem = str(exc)
            if problem is None:
                return self._resuming(state, skipped)
            log.warning("not resuming from step %d: %s", step, problem)
            skipped.append(f"step {step}: {problem}")
        if skipped:
            raise CheckpointError(
                f"{self.root}: no checkpoint verifies ({'; '.join(skipped)}); pass "
                "if_exists=overwrite to start the run again, or another run_name"
            )
        return None

    @staticmethod
    def _resuming(state: dict[str, Any], skipped: list[str]) -> dict[str, Any]:
        if skipped:
            log.warning("resuming from step %d, the newest checkpoint that verifies",
                        state["step"])  # fmt: skip
        return state

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
