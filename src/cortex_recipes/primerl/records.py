"""The async GRPO journey's records of a prime-rl run, on the run lifecycle every journey shares.

Per step the trainer adapter's record (loss, reward statistics from the advantages prime-rl
computed, ``time/*``) is merged with prime-rl's own record for that step (its
``metrics.jsonl``: off-policy lag, in-flight counts, rewards) under the key prefix
``primerl/``, plus the keys every GRPO runner spells the same (:func:`shared_keys`). The merged
record is written the way every journey writes a step (:func:`cortex_recipes.driver.
record_step`: checked against ``async_grpo/prime-rl`` in metrics_schema.json, trackers,
progress, one log line), and on the steps where prime-rl's orchestrator checkpoints the run
gets a resume point in the one format every journey uses
(:func:`cortex_recipes.training_job.save_resume_point`), with ``runner`` set to ``prime-rl``.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cortex_recipes.driver import record_step
from cortex_recipes.primerl import broadcasts, resume, step_records
from cortex_recipes.primerl.trainer import METRICS
from cortex_recipes.training_job import save_resume_point

log = logging.getLogger(__name__)

METRICS_SCHEMA = "async_grpo/prime-rl"  # this runner's record in metrics_schema.json
RUNNER = "prime-rl"  # the resume points' ``runner``
SOURCE = f"primerl/{step_records.SOURCE_KEY}"
# a step's log line, as the driver writes one for the step-by-step journeys
LOG_KEYS = (("reward/mean", ".3f"), ("loss", ".4f"), ("off_policy/max", "d"),
            ("eval/accuracy", ".3f"))  # fmt: skip


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def merge_record(ours: dict[str, Any], theirs: dict[str, Any] | None) -> dict[str, Any]:
    """The trainer adapter's record of a step with prime-rl's, under ``primerl/``."""
    extra = {f"primerl/{k}": v for k, v in (theirs or {}).items() if k != "step"}
    return {**ours, **extra}


def merged_metrics(output_dir: Path) -> list[dict[str, Any]]:
    """The trainer adapter's per-step records, each with prime-rl's record for that step."""
    theirs = {r["step"]: r for r in _jsonl(output_dir / "metrics.jsonl") if "step" in r}
    return [merge_record(r, theirs.get(r["step"])) for r in _jsonl(output_dir / "cortex" / METRICS)]


def overlap_fraction(training: list[tuple[float, float]],
                     generation: list[tuple[float, float]]) -> float:  # fmt: skip
    """The share of training time during which at least one rollout was being generated."""
    merged: list[list[float]] = []
    for start, end in sorted(generation):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    total = sum(end - start for start, end in training)
    both = sum(
        max(0.0, min(end, g_end) - max(start, g_start))
        for start, end in training
        for g_start, g_end in merged
    )
    return both / total if total > 0 else 0.0


REWARD_KEY = re.compile(r"^primerl/train/agg/effective/[^/]+/reward/mean$")


def step_reward(record: dict[str, Any]) -> float | None:
    """The mean reward of the samples a step trained on, from prime-rl's record (its
    ``train/agg/effective/<agent>/reward/mean``); None when prime-rl logged none."""
    found = [v for k, v in record.items() if REWARD_KEY.match(k)]
    if len(found) > 1:
        keys = sorted(k for k in record if REWARD_KEY.match(k))
        raise ValueError(f"step {record.get('step')}: more than one agent's reward: {keys}")
    return found[0] if found else None


def primerl_record(output_dir: Path, step: int) -> dict[str, Any] | None:
    """prime-rl's own record of ``step`` (its ``metrics.jsonl``; the last one when repeated)."""
    found = [r for r in _jsonl(output_dir / "metrics.jsonl") if r.get("step") == step]
    return found[-1] if found else None


def shared_keys(merged: dict[str, Any]) -> dict[str, Any]:
    """The metrics every GRPO runner spells the same (docs/metrics.md), from prime-rl's keys:
    ``reward/mean`` (the trained samples' reward, :func:`step_reward`), ``off_policy/mean`` and
    ``off_policy/max`` (prime-rl's observed lag; an integer count of steps)."""
    out: dict[str, Any] = {}
    reward = step_reward(merged)
    if reward is not None:
        out["reward/mean"] = reward
    mean, top = merged.get("primerl/off_policy/mean"), merged.get("primerl/off_policy/max")
    if mean is not None:
        out["off_policy/mean"] = mean
    if top is not None:
        if float(top) != int(top):
            raise ValueError(f"step {merged.get('step')}: primerl/off_policy/max={top!r}; a count")
        out["off_policy/max"] = int(top)
    return out


class RunRecorder:
    """The trainer adapter's ``on_step``: each published step's record, merged with prime-rl's
    record of that step and the shared keys (:func:`shared_keys`), is recorded as every
    journey records a step; then, on the steps where prime-rl's orchestrator checkpoints, the
    run's resume point. ``evaluate_last`` (returns an accuracy) runs before the last step's
    record is written, which then carries ``eval/accuracy`` as Math GRPO's last record does."""

    def __init__(self, run, output_dir: Path, *, interval: int, max_steps: int,
                 state: dict[str, Any], wait_s: float = 30.0,
                 evaluate_last: Callable[[], float] | None = None):  # fmt: skip
        self.run, self.output_dir = run, Path(output_dir)
        self.interval, self.max_steps = interval, max_steps
        self.state = state  # what every resume point carries besides the step and trainer
        self.wait_s = wait_s
        self.evaluate_last = evaluate_last
        # Set once prime-rl's orchestrator runs: a dead one writes nothing more, so waiting
        # for its files stops at once (one last look, its files are written before it exits).
        self.alive: Callable[[], bool] | None = None

    def _wait(self, predicate) -> bool:
        deadline = time.monotonic() + self.wait_s
        while not predicate():
            if time.monotonic() > deadline or (self.alive is not None and not self.alive()):
                return predicate()
            time.sleep(0.1)
        return True

    def save_point(self, step: int) -> bool:
        """The run's resume point at ``step``, if both sides can resume from it."""
        if not resume.agreed(self.output_dir, step):
            return False
        manifest = broadcasts.read_manifest(broadcasts.version_dir(self.output_dir, step))
        trainer = {k: manifest.get(k) for k in ("job_id", "checkpoint_id", "stage_path")}
        save_resume_point(self.run, step, {**self.state, "runner": RUNNER}, trainer, runner=RUNNER)
        return True

    def __call__(self, record: dict[str, Any]) -> None:
        step = record["step"]
        self._wait(lambda: primerl_record(self.output_dir, step) is not None)
        theirs = primerl_record(self.output_dir, step)
        if theirs is None:  # killed between its checkpoint and its metrics line
            theirs = step_records.recover(self.output_dir, step)
            log.warning("step %d: prime-rl wrote no record; %s", step,
                        theirs.get("record_lost_because") or theirs[step_records.SOURCE_KEY])  # fmt: skip
        merged = merge_record(record, theirs)
        merged.update(shared_keys(merged))
        if step == self.max_steps and self.evaluate_last is not None:
            merged["eval/accuracy"] = self.evaluate_last()
        record_step(self.run, merged, self.max_steps, LOG_KEYS, schema=METRICS_SCHEMA)
        if step % self.interval == 0 or step == self.max_steps:
            ckpt = resume.orchestrator_checkpoint(self.output_dir, step)
            if not (self._wait(ckpt.is_file) and self.save_point(step)):
                log.warning("step %d: no orchestrator checkpoint %s; no resume point", step, ckpt)


def summary_fields(run, work: Path, max_steps: int) -> dict[str, Any]:
    """The summary's prime-rl fields of a run whose ``metrics.jsonl`` holds steps 1..max_steps
    once each (raises naming the file otherwise), ``work`` its ``primerl/`` folder."""
    output_dir = work / "outputs"
    records = run.read_metrics()
    steps = [r["step"] for r in records]
    if steps != list(range(1, max_steps + 1)):
        raise RuntimeError(
            f"{run.path}/metrics.jsonl holds steps {steps}, expected 1..{max_steps} once each"
        )
    published = broadcasts.published_versions(output_dir)
    return {
        "orchestrator": RUNNER,
        "published_versions": published,
        "steps": steps,
        "losses": [r.get("loss") for r in records],
        "rewards": [step_reward(r) for r in records],
        "off_policy_max_per_step": [r.get("primerl/off_policy/max") for r in records],
        # shipped episodes per lag over the whole run, and those prime-rl cancelled as stale
        "lag_histogram": step_records.lag_counts(output_dir, range(1, max_steps + 1)),
        "stale_cancelled": step_records.stale_cancellations(work / "orchestrator.log"),
        # Steps whose prime-rl record was re-derived from its episodes, or lost (step_records).
        "primerl_record_sources": {
            str(r["step"]): r[SOURCE] for r in records if r.get(SOURCE) is not None
        },
        "applied_versions": [v for v in published if broadcasts.is_applied(output_dir, v)],
    }
