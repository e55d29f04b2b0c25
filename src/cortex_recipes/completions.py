"""``rollouts.jsonl``: what an RL, OPD or TITO run sampled, so a person can read what it did.

One JSON object per sampled completion, appended in the run folder (the format is in
docs/metrics.md, "rollouts.jsonl"):

``step``            the training step the completion was trained in
``group``           its group in that step (GRPO: one prompt's ``group_size`` samples; OPD:
                    one sample a group; TITO: one task's episodes)
``sample``          its index in the group
``policy_version``  the policy that sampled it (0: the initial weights; ``N``: after step N)
``prompt``, ``prompt_ids``          the prompt, decoded with special tokens, and its token ids
``completion``, ``completion_ids``  the completion, decoded without special tokens, and ids
``reward``          its reward (null where the journey has none: OPD)
``finish_reason``   why sampling stopped, when known
``turns``           TITO only: each model turn (prompt/completion ids and text, tool calls)
``tool_calls``      TITO only: every tool call of the episode, in order

Which groups are written is deterministic: every step's first group (``group == 0``), plus a
fraction ``rollouts_rate`` of the others, chosen by a hash of ``(step, group)`` (so a rerun or
a resumed run writes the same ones). ``rollouts_rate=1`` writes every group. A resumed run
keeps the records up to its checkpoint and drops later ones, like ``metrics.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import chz

FILE = "rollouts.jsonl"


def rate_field(default: float = 0.0) -> Any:
    """The ``rollouts_rate`` field of an RL / OPD / TITO journey's ``Config``."""
    return chz.field(
        default=default,
        doc="rollouts.jsonl: every step's first group is written, plus this fraction "
        "(0..1, deterministic) of the others; 1 writes all",
    )


def check_rate(rate: float) -> float:
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0.0 <= rate <= 1.0:
        raise ValueError(
            f"rollouts_rate={rate!r}; accepted: a number from 0 (each step's first group "
            "only) to 1 (every group)"
        )
    return float(rate)


def keeps(step: int, group: int, rate: float) -> bool:
    """Whether group ``group`` of step ``step`` is written at ``rate`` (deterministic)."""
    if group == 0:
        return True
    if rate <= 0.0:
        return False
    if rate >= 1.0:
        return True
    digest = hashlib.sha256(f"rollouts:{step}:{group}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


class RolloutWriter:
    """Appends the sampled groups of a run to ``<run>/rollouts.jsonl``.

    ``tokenizer`` decodes the ids into text (only for the groups that are written)."""

    def __init__(self, run_dir: Path, tokenizer: Any, *, rate: float = 0.0):
        self.path = Path(run_dir) / FILE
        self.tokenizer = tokenizer
        self.rate = check_rate(rate)
        self.written = 0

    def keeps(self, step: int, group: int) -> bool:
        return keeps(step, group, self.rate)

    def _decode(self, ids: Sequence[int], *, special: bool) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=not special)

    def record(
        self,
        *,
        step: int,
        group: int,
        sample: int,
        policy_version: int,
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        reward: float | None,
        finish_reason: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """One completion's record (not written; see :meth:`write`)."""
        return {
            "step": int(step),
            "group": int(group),
            "sample": int(sample),
            "policy_version": int(policy_version),
            "prompt": self._decode(prompt_ids, special=True),
            "prompt_ids": [int(t) for t in prompt_ids],
            "completion": self._decode(completion_ids, special=False),
            "completion_ids": [int(t) for t in completion_ids],
            "reward": None if reward is None else float(reward),
            "finish_reason": finish_reason,
            **extra,
        }

    def write_group(
        self,
        *,
        step: int,
        group: int,
        policy_version: int,
        rollouts: Sequence[Any],
        rewards: Sequence[float | None] | None = None,
        extras: Sequence[dict[str, Any]] | None = None,
    ) -> int:
        """Write one group of :class:`cortex_recipes.rollouts.Rollout` (``prompt_ids``,
        ``completion_ids``, ``finish_reason``) if :meth:`keeps` it; returns how many lines."""
        if not self.keeps(step, group):
            return 0
        records = [
            self.record(
                step=step,
                group=group,
                sample=i,
                policy_version=policy_version,
                prompt_ids=r.prompt_ids,
                completion_ids=r.completion_ids,
                reward=None if rewards is None else rewards[i],
                finish_reason=getattr(r, "finish_reason", None),
                **(extras[i] if extras else {}),
            )
            for i, r in enumerate(rollouts)
        ]
        return self.write(records)

    def write_episodes(
        self, *, step: int, group: int, policy_version: int, episodes: Sequence[Any]
    ) -> int:
        """Write one group of TITO episodes (:class:`cortex_recipes.tito.episode.Episode`):
        the first turn's prompt, the whole rollout after it, the turns and the tool calls."""
        if not self.keeps(step, group):
            return 0
        records = []
        for i, episode in enumerate(episodes):
            turns = episode.turns
            prompt_ids = turns[0].prompt_ids if turns else []
            ids = list(episode.token_ids) or (
                turns[-1].prompt_ids + turns[-1].completion_ids if turns else []
            )
            records.append(
                self.record(
                    step=step,
                    group=group,
                    sample=i,
                    policy_version=policy_version,
                    prompt_ids=prompt_ids,
                    completion_ids=ids[len(prompt_ids) :],
                    reward=episode.reward,
                    finish_reason=episode.stop,
                    task_index=episode.task_index,
                    turns=[
                        {
                            "prompt_ids": list(t.prompt_ids),
                            "completion_ids": list(t.completion_ids),
                            "completion": self._decode(t.completion_ids, special=False),
                            "finish_reason": t.finish_reason,
                            "bridged": t.bridged,
                            "tool_calls": list(t.tool_calls),
                        }
                        for t in turns
                    ],
                    tool_calls=[call for t in turns for call in t.tool_calls],
                )
            )
        return self.write(records)

    def write(self, records: Sequence[dict[str, Any]]) -> int:
        if not records:
            return 0
        with open(self.path, "a") as f:
            for record in records:
                f.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        self.written += len(records)
        return len(records)


def read(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``<run_dir>/rollouts.jsonl`` (empty when there is none)."""
    path = Path(run_dir) / FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
