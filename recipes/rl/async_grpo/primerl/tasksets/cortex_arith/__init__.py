"""Offline arithmetic taskset for prime-rl's env-server (verifiers a60a606 v1 API).

Loaded by the env-server as taskset id ``cortex-arith`` when this folder's parent is on its
PYTHONPATH (``cortex_recipes.primerl.journey`` puts it there). It runs only inside prime-rl's
own environment, never in this project's. Problems are generated from a seed with the same
knobs as the journey profile's ``env.config`` (terms, digits, operators), so the taskset needs
no download and two runs with one seed see the same problems. Reward: 1 when the last integer
in the reply is the answer.
"""

import random
import re

import httpx
import verifiers.v1 as vf
from openai import AsyncOpenAI
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harness import Harness
from verifiers.v1.runtimes import ProgramResult

INT = re.compile(r"-?\d+")


def problems(seed: int, size: int, min_terms: int, max_terms: int, min_digits: int,
             max_digits: int, operators: list[str]) -> list[tuple[str, str]]:  # fmt: skip
    rng = random.Random(seed)
    out = []
    for _ in range(size):
        terms = [
            rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1)
            for d in (
                rng.randint(min_digits, max_digits)
                for _ in range(rng.randint(min_terms, max_terms))
            )
        ]
        ops = [rng.choice(operators) for _ in terms[1:]]
        expr = " ".join(
            [str(terms[0])] + [f"{op} {t}" for op, t in zip(ops, terms[1:], strict=True)]
        )
        out.append((expr, str(value(terms, ops))))
    return out


def value(terms: list[int], ops: list[str]) -> int:
    """The usual precedence: products first, then sums and differences left to right."""
    sums, signs, product = [], [1], terms[0]
    for op, term in zip(ops, terms[1:], strict=True):
        if op == "*":
            product *= term
        else:
            sums.append(product)
            signs.append(1 if op == "+" else -1)
            product = term
    sums.append(product)
    return sum(sign * part for sign, part in zip(signs, sums, strict=True))


class ArithData(vf.TaskData):
    answer: str


class ArithTask(vf.Task[ArithData]):
    @vf.stop
    async def single_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        found = INT.findall(trace.last_reply or "")
        return 1.0 if found and found[-1] == self.data.answer else 0.0


class ArithConfig(vf.TasksetConfig):
    seed: int = 0
    size: int = 64
    min_terms: int = 2
    max_terms: int = 2
    min_digits: int = 1
    max_digits: int = 1
    operators: list[str] = ["+"]
    instruction: str = "Answer with just the number."


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> list[ArithTask]:
        c = self.config
        if any(op not in {"+", "-", "*"} for op in c.operators):
            raise ValueError(f"operators={c.operators!r}; accepted: '+', '-', '*'")
        rows = problems(c.seed, c.size, c.min_terms, c.max_terms, c.min_digits, c.max_digits,
                        c.operators)  # fmt: skip
        return [
            ArithTask(
                ArithData(idx=i, prompt=f"What is {expr}? {c.instruction}".strip(), answer=answer),
                c.task,
            )
            for i, (expr, answer) in enumerate(rows)
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
