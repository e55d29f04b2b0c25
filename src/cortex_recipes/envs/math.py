"""Math problems from ``reasoning-gym`` (seeded procedural datasets, scored by their own scorer).

Pinned by ``reasoning-gym==0.1.25`` in ``uv.lock``: a dataset name, its generator config and a
seed determine every problem, so nothing is downloaded and two runs see the same problems.

The answer is the first integer in the completion (the model answers in a few tokens, with no
room for tags); it is scored by the dataset's ``score_answer`` (1.0 for the exact answer,
partial credit when the oracle answer is a substring, else 0.0), or, with ``exact``, 1.0 for
the exact answer and 0.0 otherwise.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Any

_INTEGER = re.compile(r"-?\d+")


class MathEnvError(ValueError):
    """A math environment setting reasoning-gym rejects; the message names it."""


@dataclass(frozen=True)
class MathTask:
    index: int
    question: str
    answer: str
    entry: dict[str, Any] = field(repr=False, compare=False)


def extract_answer(completion: str) -> str | None:
    match = _INTEGER.search(completion)
    return match.group(0) if match else None


class MathEnv:
    """A seeded reasoning-gym dataset with a prompt suffix and its scorer."""

    def __init__(
        self,
        dataset: str,
        *,
        seed: int,
        size: int,
        config: dict[str, Any] | None = None,
        instruction: str = "Answer with just the number.",
        exact: bool = False,
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)  # a dependency's import-time noise
            import reasoning_gym

        self.name = dataset
        self.instruction = instruction
        #: score exact answers only (no partial credit): a profile's ``env.reward: exact``
        self.exact = exact
        try:
            self.dataset = reasoning_gym.create_dataset(
                dataset, seed=seed, size=size, **(config or {})
            )
        except (AssertionError, TypeError, ValueError, KeyError) as exc:
            raise MathEnvError(
                f"reasoning-gym dataset {dataset!r} with seed={seed}, size={size}, "
                f"config={config!r} was rejected: {exc}"
            ) from exc
        self.size = size

    def task(self, index: int) -> MathTask:
        entry = self.dataset[index % self.size]
        return MathTask(index % self.size, str(entry["question"]), str(entry["answer"]), entry)

    def prompt(self, task: MathTask) -> str:
        return f"{task.question} {self.instruction}".strip()

    def score(self, task: MathTask, completion: str) -> float:
        if self.exact:
            return 1.0 if extract_answer(completion) == task.answer else 0.0
        return float(self.dataset.score_answer(extract_answer(completion), task.entry))


INTEGER_ANSWER = re.compile(r"-?\d+")


def integer_answer(value: Any) -> bool:
    """an integer or a string of one (the reply's first integer is compared with it)"""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (
        isinstance(value, str) and INTEGER_ANSWER.fullmatch(value.strip()) is not None
    )


def question_column(value: Any) -> bool:
    """a non-empty string"""
    return isinstance(value, str) and bool(value.strip())


class TaskTableEnv:
    """Problems from a data source (``question`` and ``answer`` columns, through ``datasets``:
    :mod:`cortex_recipes.data`), in the source's row order. Scored by the journey's rule: 1.0
    when the first integer of the reply is the answer, else 0.0 (no partial credit)."""

    def __init__(
        self,
        field: str,
        source: str,
        base_dir,
        *,
        size: int,
        instruction: str = "Answer with just the number.",
    ):
        from cortex_recipes.data import DataError, load_records

        rows = load_records(
            field, source, base_dir, {"question": question_column, "answer": integer_answer}
        )
        if len(rows) < size:
            raise DataError(
                f"{field}={source!r} has {len(rows)} rows, fewer than the {size} problems the "
                f"profile asks for; set the size (env.size or eval.num_examples) to at most "
                f"{len(rows)}"
            )
        self.name = source
        self.instruction = instruction
        self.size = size
        self.rows = [
            {"question": r["question"].strip(), "answer": str(r["answer"]).strip()}
            for r in rows[:size]
        ]

    def task(self, index: int) -> MathTask:
        row = self.rows[index % self.size]
        return MathTask(index % self.size, row["question"], row["answer"], row)

    def prompt(self, task: MathTask) -> str:
        return f"{task.question} {self.instruction}".strip()

    def score(self, task: MathTask, completion: str) -> float:
        return 1.0 if extract_answer(completion) == task.answer else 0.0
