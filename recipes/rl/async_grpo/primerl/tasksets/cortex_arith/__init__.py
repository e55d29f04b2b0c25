"""Offline arithmetic taskset for prime-rl's env-server (verifiers a60a606 v1 API).

Loaded by the env-server as taskset id ``cortex-arith`` when this folder's parent is on its
PYTHONPATH (the journey's ``loop.py`` puts it there). It runs only inside prime-rl's
own environment, never in this project's. The problems come from ``tasks_path``, a JSONL file
of ``{"prompt", "answer", "partial_credit"}`` that the journey writes from the profile's
reasoning-gym dataset (``primerl/tasks.jsonl`` in the run): the same problems and prompts the
synchronous Math GRPO example trains on and the greedy eval uses. Reward: Math GRPO's training
reward (``scoring.py``): the reply's first integer against the answer, with reasoning-gym's
partial credit where Math GRPO gives it, after ``latency_s`` seconds of waiting (a simulated
slow environment, like a sandbox or tool call: the env-server's event loop runs the waits of
all rollouts in flight concurrently). The greedy eval counts only exact answers. A reply
such as "8 + 3 = 11" scores 0 under both; a taskset that scored the last integer taught exactly
that format, which the eval then failed.
"""

import asyncio
import json
import math
from pathlib import Path

import httpx
import verifiers.v1 as vf
from openai import AsyncOpenAI
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harness import Harness
from verifiers.v1.runtimes import ProgramResult

from .scoring import score


def read_tasks(path: str) -> list[tuple[str, str, bool]]:
    """``(prompt, answer, partial_credit)`` per line of ``path``; a bad line fails naming the
    line and field (``partial_credit`` is optional, false when absent)."""
    if not path:
        raise ValueError("tasks_path is empty: the journey writes primerl/tasks.jsonl and names it")
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        for field in ("prompt", "answer"):
            if not isinstance(row.get(field), str) or not row[field]:
                raise ValueError(f"{path}:{number}: {field}={row.get(field)!r}; a non-empty string")
        partial = row.get("partial_credit", False)
        if not isinstance(partial, bool):
            raise ValueError(f"{path}:{number}: partial_credit={partial!r}; true or false")
        rows.append((row["prompt"], row["answer"], partial))
    if not rows:
        raise ValueError(f"{path}: no tasks")
    return rows


class ArithData(vf.TaskData):
    answer: str
    partial_credit: bool = False
    latency_s: float = 0.0


class ArithTask(vf.Task[ArithData]):
    @vf.stop
    async def single_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        if self.data.latency_s:
            await asyncio.sleep(self.data.latency_s)
        return score(trace.last_reply, self.data.answer, self.data.partial_credit)


class ArithConfig(vf.TasksetConfig):
    tasks_path: str = ""
    latency_s: float = 0.0


def check_latency(value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"latency_s={value!r}; a finite number of seconds >= 0")
    return float(value)


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> list[ArithTask]:
        latency = check_latency(self.config.latency_s)
        return [
            ArithTask(
                ArithData(
                    idx=i, prompt=prompt, answer=answer, partial_credit=partial, latency_s=latency
                ),
                self.config.task,
            )
            for i, (prompt, answer, partial) in enumerate(read_tasks(self.config.tasks_path))
        ]


class InlineChatConfig(HarnessConfig):
    pass


class InlineChatHarness(Harness[InlineChatConfig]):
    """One chat turn from the env-server's own event loop: the ``null`` harness's exchange for
    a tool-less single-turn task, without its per-rollout program.

    ``null`` starts a Python program (a uv script importing openai, mcp, httpx and tenacity)
    for every rollout; on a 2-core CPU host that start-up, not generation, bounded the CPU
    profile at about 30 rollouts a minute. This harness sends the same request to the same
    interception ``endpoint`` with the same ``secret`` -- the env-server records the turn
    there exactly as it does for ``null`` -- and runs no code of the model's, so it needs no
    program and no container. It is the taskset's default harness (exported below).
    """

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def setup(self, runtime) -> None:
        return None  # nothing to install: no program runs in the runtime

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data):
        if mcp_urls:
            raise ValueError("the cortex-arith harness has no tools; mcp_urls must be empty")
        system_prompt, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages.extend(message_to_wire(m) for m in prompt)
        client = AsyncOpenAI(
            base_url=endpoint, api_key=secret, timeout=httpx.Timeout(None, connect=5.0)
        )
        try:
            await client.chat.completions.create(model=ctx.model, messages=messages)
        finally:
            await client.close()
        return ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["ArithTaskset", "InlineChatHarness"]
