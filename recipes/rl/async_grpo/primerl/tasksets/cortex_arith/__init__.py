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

import verifiers.v1 as vf

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


__all__ = ["ArithTaskset"]
