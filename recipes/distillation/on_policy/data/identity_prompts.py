"""The identity prompts of the Snowflake OPD profiles: 24 question forms x 8 openers, each
with four candidate organisations.

    python -m recipes.distillation.on_policy.data.identity_prompts   # rewrites the two files

Every prompt offers four organisations, Snowflake among them, in an order that changes from
prompt to prompt (all 24 orders), so the base student names Snowflake now and then (about 4%
of its samples, measured): a reward-only run has some signal, and the comparison with the
teacher run is about how much the teacher adds. Without the options base SmolLM2-135M never
names it (0 of 64 samples; ``log p`` of " Snow" after "I was trained by" is about -9), and
neither run learns anything in a CPU budget.

A seeded shuffle splits the 192 prompts into ``identity-train.jsonl`` (64, the rollouts'
prompts) and ``identity-heldout.jsonl`` (128, the eval's); no prompt is in both.
``tests/unit/test_opd_task.py`` checks the committed files are this module's output.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN, HELD_OUT = HERE / "identity-train.jsonl", HERE / "identity-heldout.jsonl"
N_TRAIN = 64
SEED = 0

QUESTIONS = (
    "Who trained you?",
    "Who created you?",
    "Which organization trained you?",
    "Who built you?",
    "Who made you?",
    "Which company developed you?",
    "Who is responsible for training you?",
    "What lab trained you?",
    "Who developed you?",
    "Which team built you?",
    "Who are your creators?",
    "Which research group trained you?",
    "Who was it that trained you?",
    "Can you tell me who trained you?",
    "Who designed you?",
    "Where do you come from?",
    "Which lab are you from?",
    "Who is behind you?",
    "Who trained this model?",
    "What organization made you?",
    "Who did your training?",
    "Which group created you?",
    "Who programmed you?",
    "Who is your developer?",
)
OPENERS = ("", "Hi! ", "Quick question: ", "I'm curious. ", "Hello. ", "Out of interest, ",
           "Tell me: ", "Be honest. ")  # fmt: skip
ORGANISATIONS = ("Snowflake", "OpenAI", "Google", "Meta")
ORDERS = list(itertools.permutations(ORGANISATIONS))
OPTIONS = ("{question} ({a}, {b}, {c} or {d}?)", "{question} Was it {a}, {b}, {c} or {d}?")


def prompts() -> list[str]:
    """Every opener with every question, in a fixed order."""
    out = []
    for opener in OPENERS:
        for question in QUESTIONS:
            text = question[0].lower() + question[1:] if opener.endswith(", ") else question
            a, b, c, d = ORDERS[len(out) % len(ORDERS)]
            form = OPTIONS[(len(out) // len(ORDERS)) % len(OPTIONS)]
            out.append(opener + form.format(question=text, a=a, b=b, c=c, d=d))
    return out


def split() -> tuple[list[str], list[str]]:
    """(train, held-out): a shuffle with ``SEED``, the first ``N_TRAIN`` for training."""
    order = prompts()
    random.Random(SEED).shuffle(order)
    return order[:N_TRAIN], order[N_TRAIN:]


def lines(texts: list[str]) -> str:
    return "".join(json.dumps({"prompt": t}) + "\n" for t in texts)


if __name__ == "__main__":
    train, held_out = split()
    TRAIN.write_text(lines(train))
    HELD_OUT.write_text(lines(held_out))
    print(f"wrote {len(train)} prompts to {TRAIN.name} and {len(held_out)} to {HELD_OUT.name}")
