"""Resuming the prime-rl journey after a kill: one step both sides agree on, and nothing later.

Three parties keep state in prime-rl's ``output_dir`` (``<run>/primerl/outputs``):

- prime-rl's orchestrator: ``checkpoints/step_<n>/orchestrator/progress.pt`` once batch ``n``
  has shipped (every ``[ckpt] interval`` steps, and at its end), ``rollouts/step_<n>/``, and its
  ``metrics.jsonl``;
- the trainer adapter: ``broadcasts/step_<v>/`` (a resumable checkpoint per published version,
  :mod:`cortex_recipes.primerl.broadcasts`), ``cortex/trainer_metrics.jsonl`` and the live file;
- the inference adapter: the ``APPLIED`` markers, each naming the job whose sampler it was.

After a SIGKILL they are at different places: the orchestrator ships up to two batches ahead of
the newest published version, and checkpoints only every ``interval`` steps. The journey
therefore writes the run's own resume point (``<run>/checkpoints/step_<n>/state.json``,
:mod:`cortex_recipes.run`) only for a step ``n`` where both agree: version ``n`` is published
and the orchestrator's checkpoint ``n`` exists (``n = 0``: version 0, orchestrator from
scratch). Rerunning the same command then, before anything starts:

1. checks that the run's resume point and the files agree, failing closed naming the file and
   field: the orchestrator checkpoint of step ``n`` exists (``n >= 1``); version ``n`` is
   published; its manifest names the same trainer job and checkpoint as the run's state;
2. retracts what came after ``n``: rollouts, published versions and orchestrator checkpoints
   of later steps, both sides' metric records of later steps, and the live file (a new job
   writes its own). The orchestrator then resumes with ``resume.step = n`` (the batch after
   ``n`` ships next, once version ``n`` is applied), the trainer adapter finds ``n`` as its
   last published version and loads its checkpoint, and the inference adapter syncs exactly
   that version into the new job's sampler when the orchestrator asks for it.

A run with no resume point starts its prime-rl side from an empty ``output_dir``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from cortex_recipes.primerl import broadcasts
from cortex_recipes.run import CheckpointError

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")
PROCESSES = "processes.json"  # pids of the prime-rl processes a journey started


def orchestrator_checkpoint(output_dir: Path, step: int) -> Path:
    """prime-rl's orchestrator checkpoint file of ``step`` (``ckpt.py`` at 559b447)."""
    return Path(output_dir) / "checkpoints" / f"step_{step}" / "orchestrator" / "progress.pt"


def orchestrator_checkpoint_steps(output_dir: Path) -> list[int]:
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [int(m.group(1)) for c in root.iterdir() if (m := _STEP_DIR.match(c.name))]
    return sorted(s for s in found if orchestrator_checkpoint(output_dir, s).is_file())


def agreed(output_dir: Path, step: int) -> bool:
    """Whether ``step`` is a point both sides can resume from."""
    if step not in broadcasts.published_versions(output_dir):
        return False
    return step == 0 or orchestrator_checkpoint(output_dir, step).is_file()


def _later_step_dirs(root: Path, step: int) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(
        (c for c in root.iterdir() if (m := _STEP_DIR.match(c.name)) and int(m.group(1)) > step),
        key=lambda c: int(c.name.split("_")[1]),
    )


def _truncate_jsonl(path: Path, step: int) -> int:
    """Keep the records of steps up to ``step``; returns how many were dropped."""
    if not path.is_file():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise CheckpointError(f"{path}:{number} is not JSON: {exc}") from exc
        if not isinstance(record, dict) or record.get("step", 0) <= step:
            kept.append(line)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    os.replace(tmp, path)
    return len(lines) - len(kept)


def check(output_dir: Path, step: int, trainer: dict[str, Any]) -> dict[str, Any]:
    """Fail closed unless the run's resume point ``step`` (naming ``trainer``'s job and
    checkpoint) matches the orchestrator's checkpoint and the published version; returns the
    version's manifest."""
    output_dir = Path(output_dir)
    if step >= 1 and not orchestrator_checkpoint(output_dir, step).is_file():
        have = orchestrator_checkpoint_steps(output_dir)
        raise CheckpointError(
            f"the run resumes after step {step}, but prime-rl's orchestrator checkpoint "
            f"{orchestrator_checkpoint(output_dir, step)} does not exist (its checkpoints: "
            f"{have or 'none'}); the two sides cannot resume together: pass "
            "if_exists=overwrite to start again"
        )
    weight_dir = broadcasts.version_dir(output_dir, step)
    try:
        manifest = broadcasts.read_manifest(weight_dir)
    except broadcasts.BroadcastError as exc:
        raise CheckpointError(
            f"the run resumes after step {step}, but the trainer adapter's version {step} "
            f"cannot be used: {exc}; pass if_exists=overwrite to start again"
        ) from exc
    for key in ("job_id", "checkpoint_id"):
        if manifest.get(key) != trainer.get(key):
            raise CheckpointError(
                f"{weight_dir / broadcasts.MANIFEST}: {key}={manifest.get(key)!r}, but the run's "
                f"checkpoint of step {step} names {key}={trainer.get(key)!r}; the published "
                "version and the run's resume point disagree: pass if_exists=overwrite to "
                "start again"
            )
    return manifest


def restore(output_dir: Path, step: int | None, trainer: dict[str, Any] | None) -> dict[str, Any]:
    """Make ``output_dir`` hold exactly the state of the agreed step ``step`` (None: nothing,
    a fresh start); returns what was retracted. See the module docstring."""
    output_dir = Path(output_dir)
    if step is None:
        if output_dir.exists():
            log.info("no resume point: starting the prime-rl side afresh in %s", output_dir)
            shutil.rmtree(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        return {"resume_step": None}
    manifest = check(output_dir, step, trainer or {})
    retracted: dict[str, Any] = {"resume_step": step, "checkpoint_id": manifest["checkpoint_id"]}
    for name in ("rollouts", "broadcasts", "checkpoints"):
        later = _later_step_dirs(output_dir / name, step)
        for directory in later:
            shutil.rmtree(directory)
        retracted[name] = [int(d.name.split("_")[1]) for d in later]
    retracted["primerl_records"] = _truncate_jsonl(output_dir / "metrics.jsonl", step)
    retracted["trainer_records"] = _truncate_jsonl(
        output_dir / "cortex" / "trainer_metrics.jsonl", step
    )
    broadcasts.live_path(output_dir).unlink(missing_ok=True)
    log.info("resuming the prime-rl side after step %d; retracted %s", step, retracted)
    return retracted


# -- the processes of an earlier journey --------------------------------------------------------


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None


def record_processes(work: Path, processes: dict[str, int], marker: str) -> None:
    """Remember the pids of the prime-rl processes started for ``work`` (``marker`` is a string
    their command lines contain, the run's config path)."""
    broadcasts.write_json_atomic(
        Path(work) / PROCESSES, {"marker": marker, "pids": processes, "time": time.time()}
    )


def wait_for_earlier_processes(work: Path, timeout_s: float = 15.0) -> None:
    """Fail closed if a prime-rl process an earlier journey started for this run still runs
    after ``timeout_s`` (they die with the journey, ``exit_with_parent``; this is the check)."""
    path = Path(work) / PROCESSES
    if not path.is_file():
        return
    try:
        recorded = json.loads(path.read_text())
        pids, marker = dict(recorded["pids"]), str(recorded["marker"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} cannot be read: {exc}") from exc
    deadline = time.monotonic() + timeout_s
    while True:
        alive = {
            name: pid
            for name, pid in pids.items()
            if (line := _cmdline(int(pid))) is not None and marker in line
        }
        if not alive:
            path.unlink(missing_ok=True)
            return
        if time.monotonic() > deadline:
            raise CheckpointError(
                f"{path}: prime-rl processes of an earlier run of this journey still run "
                f"({', '.join(f'{n} pid {p}' for n, p in alive.items())}); they would write into "
                "the run being resumed: stop them and rerun"
            )
        time.sleep(0.2)
