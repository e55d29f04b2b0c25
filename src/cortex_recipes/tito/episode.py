"""Multi-turn tool-use episodes with exact token-in/token-out, through verifiers' TrainClient.

Each turn:
1. ``prepare_turn(trace, messages, tools)`` resolves the prefix already in the trace;
2. ``TrainClient.get_response`` renders only the new tail and bridges it onto the previous
   prompt + completion ids, so earlier tokens are never decoded and re-encoded;
3. the gateway samples token ids; the turn is committed to the trace;
4. tool calls run, and their results are appended as ``tool`` messages.

After every turn, this module checks that the new prompt extends the previous prompt +
completion token for token. A turn that breaks the extension raises
:class:`PrefixExtensionError`, which names the turn; it is never silently forked. The trace's
single branch gives the training row: its token ids, ``sampled_mask`` (the action mask, true
only on tokens the model sampled) and sampler logprobs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import verifiers.v1 as vf
from verifiers.v1.dialects import ChatDialect
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.errors import ProviderError
from verifiers.v1.graph import prepare_turn
from verifiers.v1.trace import TraceTask

from cortex_recipes.envs.glossary import call_tool, task_reward


class PrefixExtensionError(RuntimeError):
    """A turn whose prompt does not extend the previous prompt + completion token for token."""


@dataclass
class TurnRecord:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    bridged: bool
    finish_reason: str | None
    tool_calls: list[dict]


@dataclass
class Episode:
    task_index: int
    reward: float
    stop: str  # answered | max_turns | overlong
    turns: list[TurnRecord]
    token_ids: list[int] = field(default_factory=list)
    sampled_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    branches: int = 1

    @property
    def tool_turns(self) -> int:
        return sum(1 for t in self.turns if t.tool_calls)

    @property
    def tool_calls(self) -> int:
        return sum(len(t.tool_calls) for t in self.turns)


def new_trace(task) -> vf.Trace:
    return vf.Trace(
        task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig(), name="tito", trainable=True),
    )


def check_extension(turns: list[TurnRecord]) -> None:
    """Turn ``k``'s prompt must start with turn ``k-1``'s prompt + completion, exactly."""
    for k in range(1, len(turns)):
        previous = turns[k - 1].prompt_ids + turns[k - 1].completion_ids
        prompt = turns[k].prompt_ids
        if prompt[: len(previous)] != previous:
            at = next(
                (i for i, (a, b) in enumerate(zip(previous, prompt, strict=False)) if a != b),
                min(len(previous), len(prompt)),
            )
            raise PrefixExtensionError(
                f"turn {k}'s prompt does not extend turn {k - 1}'s prompt + completion: they "
                f"differ at token {at} of {len(previous)} (bridged={turns[k].bridged}); the "
                "chat template or environment rewrote earlier history"
            )


async def run_episode(
    client,
    *,
    model: str,
    task,
    toolset,
    tools: list[vf.Tool],
    sampling: vf.SamplingConfig,
    session_id: str,
    max_turns: int,
) -> Episode:
    trace = new_trace(task)
    messages: list = [vf.UserMessage(content=task.data.prompt)]
    turns: list[TurnRecord] = []
    stop = "max_turns"
    for _ in range(max_turns):
        pending = prepare_turn(trace, messages, tools)
        body = {
            "model": model,
            "messages": [message_to_wire(m) for m in messages],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in tools
            ],
        }
        try:
            response = await client.get_response(
                ChatDialect(), body, sampling, session_id=session_id, turn=pending
            )
        except ProviderError as exc:
            pending.abandon()
            if getattr(exc, "status_code", None) == 400:
                stop = "overlong"
                break
            raise
        pending.commit(response)
        tokens = response.tokens
        calls = list(response.message.tool_calls or [])
        turns.append(
            TurnRecord(
                prompt_ids=list(tokens.prompt_ids),
                completion_ids=list(tokens.completion_ids),
                logprobs=list(tokens.completion_logprobs),
                bridged=bool(tokens.bridged),
                finish_reason=response.finish_reason,
                tool_calls=[{"name": c.name, "arguments": c.arguments} for c in calls],
            )
        )
        check_extension(turns)
        messages.append(response.message)
        if not calls:
            stop = "answered"
            break
        for call in calls:
            try:
                arguments = json.loads(call.arguments or "{}")
            except ValueError:
                arguments = call.arguments
            result = call_tool(toolset, call.name, arguments)
            messages.append(vf.ToolMessage(tool_call_id=call.id, content=result, name=call.name))
    last_reply = response.message.content if stop == "answered" else None
    episode = Episode(
        task_index=task.data.idx,
        reward=task_reward(task, last_reply),
        stop=stop,
        turns=turns,
    )
    branches = trace.branches
    episode.branches = len(branches)
    if len(branches) > 1:
        raise PrefixExtensionError(
            f"the trace forked into {len(branches)} branches; a linear tool conversation must "
            "stay one branch"
        )
    if branches:
        branch = branches[0]
        episode.token_ids = list(branch.token_ids)
        episode.sampled_mask = [bool(m) for m in branch.sampled_mask]
        episode.logprobs = [float(x) for x in branch.logprobs]
    return episode
