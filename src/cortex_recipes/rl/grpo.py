"""GRPO pieces shared by the synchronous and asynchronous journeys: groups, advantages, frames.

A group is ``group_size`` rollouts of one prompt. Advantages are group-relative
(``reward - group mean``, as in prime-rl's default, without std normalisation) and are spread
over the group's sampled tokens. The ``grpo`` processor gets the sampler's logprobs as
``old_log_probs_shifted`` so the PPO ratio corrects for the policy that actually sampled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cortex_recipes import frames
from cortex_recipes.rollouts import Rollout, rollouts_from_results
from cortex_recipes.sampling import generate


@dataclass
class ScoredGroup:
    """One prompt's rollouts and rewards (the policy versions they were sampled under are the
    orchestrator's ``Group.policy_start``/``policy_end``, its one owner)."""

    task_index: int
    rollouts: list[Rollout]
    rewards: list[float]

    @property
    def advantages(self) -> list[float]:
        return group_advantages(self.rewards)


def group_advantages(rewards: Sequence[float]) -> list[float]:
    mean = sum(rewards) / len(rewards)
    return [r - mean for r in rewards]


def sample_group(
    client,
    job_id: str,
    prompt_ids: list[int],
    group_size: int,
    params: dict[str, Any],
    seed: int,
) -> list[Rollout]:
    """``group_size`` samples of one prompt in one generate request, each with its own seed."""
    rows = [{**params, "logprobs": 0, "seed": seed + i} for i in range(group_size)]
    prompts = [list(prompt_ids)] * group_size
    return rollouts_from_results(prompts, generate(client, job_id, prompts, rows))


def group_seed(base_seed: int, group_index: int, group_size: int) -> int:
    """Disjoint per-rollout seeds for every group of a run."""
    return base_seed * 1_000_003 + group_index * group_size


def grpo_frame(
    groups: Sequence[ScoredGroup], pad_id: int, loss_config: dict[str, Any]
) -> tuple[bytes, dict[str, float]]:
    """The forward-backward frame for one training step, and what it contains."""
    rollouts = [r for g in groups for r in g.rollouts]
    rows = [
        frames.rollout_row(r, advantage)
        for g in groups
        for r, advantage in zip(g.rollouts, g.advantages, strict=True)
    ]
    batch = frames.pad_batch(rows, pad_id)
    frame = frames.grpo_frame(batch, loss_config)
    rewards = [x for g in groups for x in g.rewards]
    digest = hashlib.sha256(json.dumps([r.completion_ids for r in rollouts]).encode())
    stats = {
        "rollouts/sha256": digest.hexdigest()[:16],
        "reward/mean": sum(rewards) / len(rewards),
        "progress/rollouts": len(rollouts),
        "progress/output_tokens": int(batch.loss_mask.sum()),
        "groups/uniform_fraction": sum(len(set(g.rewards)) == 1 for g in groups) / len(groups),
    }
    return frame, stats


def task_order(seed: int, size: int) -> list[int]:
    """A seeded permutation of the task indices: group ``g`` trains on ``order[g % size]``."""
    import random

    order = list(range(size))
    random.Random(seed).shuffle(order)
    return order


def greedy_eval(client, job_id: str, tokenizer, env, max_tokens: int) -> dict[str, Any]:
    """Greedy answers to every task of ``env``: exact-answer accuracy, mean score, and which
    items were right (``correct``, 0/1 per task in order: what qualification's intervals use)."""
    from cortex_recipes.sampling import chat_prompt_ids

    tasks = [env.task(i) for i in range(env.size)]
    prompts = [chat_prompt_ids(tokenizer, env.prompt(t)) for t in tasks]
    from cortex_recipes.progress import task

    with task(f"eval: {len(prompts)} greedy answers"):
        results = generate(client, job_id, prompts, {"max_tokens": max_tokens, "temperature": 0.0})
    texts = [tokenizer.decode(r["token_ids"], skip_special_tokens=True) for r in results]
    scores = [env.score(t, text) for t, text in zip(tasks, texts, strict=True)]
    return {
        "accuracy": sum(s == 1.0 for s in scores) / len(scores),
        "score": sum(scores) / len(scores),
        "correct": [int(s == 1.0) for s in scores],
        "examples": [
            {"question": t.question, "completion": x}
            for t, x in zip(tasks[:3], texts[:3], strict=True)
        ],
    }
