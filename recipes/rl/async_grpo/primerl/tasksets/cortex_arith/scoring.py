"""The ``cortex-arith`` reward, kept free of verifiers imports so this project's tests can check
it against Math GRPO's scorer (``cortex_recipes.envs.math``) without prime-rl.

The synchronous Math GRPO example trains on ``env.score``: for reasoning-gym problems that is the dataset's
``score_answer`` applied to the reply's first integer, 1.0 for the exact answer and
``len(answer) / len(integer)`` when the answer is a substring of that integer (partial credit);
for a task file (``env.tasks``), 1.0 for the exact answer and 0.0 otherwise. Each line of
``tasks.jsonl`` says which rule applies (``partial_credit``), so prime-rl's orchestrator trains
on exactly the reward Math GRPO trains on.
"""

import re

INT = re.compile(r"-?\d+")


def first_integer(reply: str) -> str | None:
    match = INT.search(reply or "")
    return match.group(0) if match else None


def score(reply: str, answer: str, partial_credit: bool) -> float:
    found = first_integer(reply)
    if not found:
        return 0.0
    if found == answer:
        return 1.0
    if partial_credit and answer in found:
        return len(answer) / len(found)
    return 0.0
