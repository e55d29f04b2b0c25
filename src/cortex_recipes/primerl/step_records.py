"""A step's prime-rl record, re-derived when prime-rl's own ``metrics.jsonl`` line is lost.

prime-rl's orchestrator (559b447, ``finalize_train_batch``) ships a batch in this order: it
appends the shipped (``effective``) episodes to
``rollouts/step_<N>/train/effective/traces.jsonl``, writes the rollout files, saves its
checkpoint, and only then appends the step's line to ``metrics.jsonl``. An orchestrator killed
between its checkpoint and that line resumes at ``N + 1`` and never writes step ``N``'s record.

The episodes file still holds what the journey reads from that record, computed here exactly
as prime-rl computes it:

- ``train/agg/effective/<agent>/reward/mean``: the mean over the shipped traces of each trace's
  reward (verifiers' ``Trace.reward``: the sum of ``score * weight`` over its rewards), per agent;
- ``off_policy/mean`` and ``off_policy/max``: per shipped episode, the version batch ``N``
  trains on (``N - 1``) minus the version that started generating it
  (``run.work.policy.start``), floored at 0 (prime-rl's ``episode_staleness``); an episode
  with no policy span counts 0.

The re-derived record carries ``record_source`` (``REDERIVED``) so it is never mistaken for
prime-rl's own line; a step with neither is marked ``LOST`` with the reason. Checked against
prime-rl's own lines on a recorded run (``recipes/rl/async_grpo/primerl/recorded/``) and, where
prime-rl is installed, on every step of a live run (tests/e2e/test_primerl_orchestrator.py).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from cortex_recipes.driver import sampling_version

REDERIVED = "rederived from rollouts/step_{step}/train/effective/traces.jsonl"
LOST = "lost"
SOURCE_KEY = "record_source"


def episode_lag(step: int, start: int | None) -> int:
    """prime-rl's ``episode_staleness`` of an episode batch ``step`` trains on: the version the
    step's rollouts are asked of (:func:`cortex_recipes.driver.sampling_version`) minus the one
    that started generating it, floored at 0; 0 for an episode with no policy span."""
    return 0 if start is None else max(0, sampling_version(step) - start)


def traces_path(output_dir: Path, step: int) -> Path:
    return Path(output_dir) / "rollouts" / f"step_{step}" / "train" / "effective" / "traces.jsonl"


class StepRecordError(ValueError):
    """An episodes file that cannot give a record; the message names the file, line and field."""


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise StepRecordError(f"{where}={value!r}; a finite number")
    return float(value)


def _episode(line: str, where: str) -> tuple[int | None, list[tuple[str, float]]]:
    """``(policy.start or None, [(agent, reward), ...])`` of one episode line."""
    try:
        episode = json.loads(line)
    except json.JSONDecodeError as exc:
        raise StepRecordError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(episode, dict):
        raise StepRecordError(f"{where}: an episode is a JSON object, got {type(episode).__name__}")
    policy = ((episode.get("run") or {}).get("work") or {}).get("policy")
    start = None
    if policy is not None:
        start = policy.get("start") if isinstance(policy, dict) else None
        if isinstance(start, bool) or not isinstance(start, int):
            raise StepRecordError(f"{where}: run.work.policy.start={start!r}; an integer version")
    traces = episode.get("traces")
    if not isinstance(traces, list):
        raise StepRecordError(f"{where}: traces={traces!r}; a list")
    rewards = []
    for i, trace in enumerate(traces):
        agent = ((trace or {}).get("agent") or {}).get("name")
        if not isinstance(agent, str) or not agent:
            raise StepRecordError(f"{where}: traces[{i}].agent.name={agent!r}; a name")
        total = 0.0
        for name, reward in (trace.get("rewards") or {}).items():
            if reward is None:
                continue
            at = f"{where}: traces[{i}].rewards.{name}"
            total += _number(reward.get("score"), f"{at}.score") * _number(
                reward.get("weight", 1.0), f"{at}.weight"
            )
        rewards.append((agent, total))
    return start, rewards


def rederive(output_dir: Path, step: int) -> dict[str, Any]:
    """prime-rl's record of ``step`` as far as its shipped episodes give it (module docstring).

    Raises :class:`StepRecordError` (naming the file and, for a bad line, the line and field)
    when the file is missing, empty or malformed."""
    path = traces_path(output_dir, step)
    if not path.is_file():
        raise StepRecordError(f"{path}: missing")
    lags: list[int] = []
    by_agent: dict[str, list[float]] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        start, rewards = _episode(line, f"{path}:{number}")
        lags.append(episode_lag(step, start))
        for agent, reward in rewards:
            by_agent.setdefault(agent, []).append(reward)
    if not lags:
        raise StepRecordError(f"{path}: no episodes")
    record: dict[str, Any] = {
        "step": step,
        SOURCE_KEY: REDERIVED.format(step=step),
        "off_policy/mean": sum(lags) / len(lags),
        "off_policy/max": float(max(lags)),
    }
    for agent, values in sorted(by_agent.items()):
        record[f"train/agg/effective/{agent}/reward/mean"] = sum(values) / len(values)
    return record


def lag_counts(output_dir: Path, steps: range) -> dict[str, int]:
    """How many shipped episodes trained at each lag (``"0"``, ``"1"``, ...) over ``steps``,
    from their episodes files (the lag of :func:`rederive`); steps without a file are skipped."""
    counts: dict[int, int] = {}
    for step in steps:
        path = traces_path(output_dir, step)
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip():
                start, _ = _episode(line, f"{path}:{number}")
                lag = episode_lag(step, start)
                counts[lag] = counts.get(lag, 0) + 1
    return {str(lag): counts[lag] for lag in sorted(counts)}


def sample_versions(output_dir: Path, step: int) -> dict[tuple[int, ...], list[int]]:
    """The policy version each shipped sample of ``step`` started at, keyed by its token ids
    (every node's ``token_ids`` in order: what the rollout file's row holds), in the order the
    episodes file lists them (a sample shipped twice, after a resume, has two entries; the last
    is the one the rollout file holds). Raises :class:`StepRecordError` naming the file when it
    is missing or malformed."""
    path = traces_path(output_dir, step)
    if not path.is_file():
        raise StepRecordError(f"{path}: missing")
    found: dict[tuple[int, ...], list[int]] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        start, _ = _episode(line, where)
        for trace in json.loads(line).get("traces") or []:
            ids: list[int] = []
            for node in trace.get("nodes") or []:
                tokens = node.get("token_ids") or []
                if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
                    raise StepRecordError(f"{where}: a node's token_ids are not integers")
                ids.extend(tokens)
            found.setdefault(tuple(ids), []).append(0 if start is None else start)
    return found


_STALE = re.compile(
    r"(?:Cancelled|Dropped) (\d+) (?:train episodes|queued traces) past max_off_policy_steps"
)


def stale_cancellations(orchestrator_log: Path) -> int:
    """Episodes prime-rl's orchestrator cancelled or dropped as staler than
    ``max_off_policy_steps`` (its warnings in ``orchestrator.log``; 559b447 keeps no metric of
    the in-flight ones)."""
    if not orchestrator_log.is_file():
        return 0
    text = orchestrator_log.read_text(errors="replace")
    return sum(int(n) for n in _STALE.findall(text))


def lost(step: int, reason: str) -> dict[str, Any]:
    """The marker a step gets when neither prime-rl's line nor its episodes give a record."""
    return {"step": step, SOURCE_KEY: LOST, "record_lost_because": reason}


def recover(output_dir: Path, step: int) -> dict[str, Any]:
    """:func:`rederive`, or :func:`lost` naming why it could not."""
    try:
        return rederive(output_dir, step)
    except StepRecordError as exc:
        return lost(step, f"prime-rl's metrics.jsonl has no step {step} record and {exc}")
