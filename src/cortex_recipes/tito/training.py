"""Training rows for the TITO journey: tool-use demonstrations (SFT) and episodes (RL).

Episodes train with the ``grpo`` processor on exactly the tokens the model sampled: an
episode becomes a :class:`cortex_recipes.frames.Row` weighted by the trace's ``sampled_mask``,
so after the one shift (:func:`cortex_recipes.frames.shift`) tool results, user text and
template scaffolding are context only. Sampler logprobs become ``old_log_probs_shifted`` on
the same columns. Demonstrations use the SFT journey's library
(renderer weights -> next-token mask -> ``causal_cross_entropy``).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from typing import Any

import torch

from cortex_recipes import frames
from cortex_recipes.envs.glossary import (
    TOOL_NAME,
    chain_prompt,
    compare_prompt,
    entity_key,
    prompt_for,
)
from cortex_recipes.rl.grpo import group_advantages
from cortex_recipes.supervision import TrainOnWhat, render_supervised
from cortex_recipes.tito.episode import Episode


def wire_tools(tools) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def demonstration(entity: str, fact: str) -> list[dict[str, Any]]:
    """The conversation the warm-start teaches: call the tool, then answer with its result."""
    return [
        {"role": "user", "content": prompt_for(entity)},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": TOOL_NAME, "arguments": {"name": entity.title()}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": fact},
        {"role": "assistant", "content": f"<answer>{fact}</answer>"},
    ]


def _call(k: int, name: str) -> dict[str, Any]:
    return {
        "id": f"call_{k}",
        "type": "function",
        "function": {"name": TOOL_NAME, "arguments": {"name": name}},
    }


def compare_demonstration(question: dict[str, str], facts: dict[str, str]) -> list[dict[str, Any]]:
    """A comparison: one turn that looks up both names (two calls), then the chosen name."""
    first, second = question["first"], question["second"]
    return [
        {"role": "user", "content": compare_prompt(first, second, question["ask"])},
        {"role": "assistant", "content": "", "tool_calls": [_call(0, first), _call(1, second)]},
        {"role": "tool", "tool_call_id": "call_0", "content": facts[entity_key(first)]},
        {"role": "tool", "tool_call_id": "call_1", "content": facts[entity_key(second)]},
        {"role": "assistant", "content": f"<answer>{question['answer']}</answer>"},
    ]


def chain_demonstration(
    question: dict[str, str], facts: dict[str, str], *, complete: bool = True
) -> list[dict[str, Any]]:
    """A chain: look up ``start``, then (a turn later) the entity its fact names, then answer.
    ``complete=False`` is a demonstrator that stops after the first lookup and answers with
    the entity it returned (a wrong answer)."""
    start, via = question["start"], question["via"]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": chain_prompt(start, question["ask"])},
        {"role": "assistant", "content": "", "tool_calls": [_call(0, start)]},
        {"role": "tool", "tool_call_id": "call_0", "content": facts[entity_key(start)]},
    ]
    if not complete:
        return [*messages, {"role": "assistant", "content": f"<answer>{via}</answer>"}]
    return [
        *messages,
        {"role": "assistant", "content": "", "tool_calls": [_call(1, via)]},
        {"role": "tool", "tool_call_id": "call_1", "content": facts[entity_key(via)]},
        {"role": "assistant", "content": f"<answer>{question['answer']}</answer>"},
    ]


def completed_chains(n: int, share: float, seed: int) -> list[bool]:
    """Which of ``n`` chain demonstrations make the second lookup: ``round(share * n)`` of
    them, placed by a seeded shuffle."""
    complete = [k < round(share * n) for k in range(n)]
    random.Random(seed).shuffle(complete)
    return complete


def demonstrations(
    tokenizer,
    renderer,
    tools,
    facts: dict[str, str],
    questions: Sequence[dict] = (),
    *,
    question_type: str = "compare",
    complete_share: float = 1.0,
    seed: int = 0,
) -> list:
    """The warm start's examples, rendered with the tools, weights on assistant turns: one
    comparison (or chain) per question when there are ``questions``, else one lookup per
    entity. Of chains, ``complete_share`` make both lookups (:func:`completed_chains`)."""
    if not questions:
        conversations = [demonstration(entity, fact) for entity, fact in facts.items()]
    elif question_type == "chain":
        conversations = [
            chain_demonstration(q, facts, complete=c)
            for q, c in zip(
                questions, completed_chains(len(questions), complete_share, seed), strict=True
            )
        ]
    else:
        conversations = [compare_demonstration(q, facts) for q in questions]
    return [
        render_supervised(
            messages,
            tokenizer,
            renderer,
            TrainOnWhat.ALL_ASSISTANT_MESSAGES,
            tools=wire_tools(tools),
        )  # fmt: skip
        for messages in conversations
    ]


def episode_row(episode: Episode, advantage: float) -> frames.Row:
    """An episode as a training row: weight 1 on the tokens the model sampled, else context."""
    return frames.Row(
        token_ids=list(episode.token_ids),
        weights=[1.0 if m else 0.0 for m in episode.sampled_mask],
        advantages=[float(advantage)] * len(episode.token_ids),
        sampler_logprobs=[float(x) for x in episode.logprobs],
    )


def episode_frame(
    groups: Sequence[Sequence[Episode]], pad_id: int, loss_config: dict[str, Any]
) -> tuple[bytes, dict[str, Any]]:
    """One grpo frame from groups of episodes of the same task (group-relative advantages)."""
    episodes = [e for g in groups for e in g]
    advantages = [a for g in groups for a in group_advantages([e.reward for e in g])]
    rows = [episode_row(e, a) for e, a in zip(episodes, advantages, strict=True)]
    batch = frames.pad_batch(rows, pad_id)
    frame = frames.grpo_frame(batch, loss_config)
    input_ids, mask = batch.input_ids, batch.loss_mask
    stats = {
        "reward/mean": sum(e.reward for e in episodes) / len(episodes),
        "episodes": len(episodes),
        "trainable_tokens": int(mask.sum()),
        "model_turns/mean": sum(len(e.turns) for e in episodes) / len(episodes),
        "tool_turns/mean": sum(e.tool_turns for e in episodes) / len(episodes),
        "tool_calls/mean": sum(e.tool_calls for e in episodes) / len(episodes),
        "multi_call/share": sum(e.tool_calls >= 2 for e in episodes) / len(episodes),
        "bridged_turns": sum(t.bridged for e in episodes for t in e.turns),
        "overlong": sum(e.stop == "overlong" for e in episodes),
        "mask_sha256": mask_digest(input_ids, mask),
    }
    return frame, stats


def groups_digest(groups: Sequence[Sequence[Episode]]) -> str:
    """A hash of every episode's token ids, action mask, sampler logprobs and reward, as played
    (unshifted, so no position escapes it)."""
    data = [
        [e.token_ids, [int(m) for m in e.sampled_mask], e.logprobs, e.reward]
        for g in groups
        for e in g
    ]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16]


def mask_digest(input_ids: torch.Tensor, mask: torch.Tensor) -> str:
    """A short hash of the rows and their action masks, to compare runs and resumes."""
    data = json.dumps([input_ids.tolist(), (mask > 0).int().tolist()]).encode()
    return hashlib.sha256(data).hexdigest()[:16]
