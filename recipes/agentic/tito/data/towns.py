"""The towns glossary and comparison questions of the SmolLM2 TITO profiles.

    python -m recipes.agentic.tito.data.towns   # rewrites the three files

- ``towns.jsonl``: 192 made-up town names (``name``) with a founding year each
  (``fact``: "founded in 1843"), years distinct and drawn from 1600-1999. The names are
  invented so that no model knows the answer without the lookup tool.
- ``compare-train.jsonl``: 256 questions on pairs of the first 128 towns, the warm start's
  demonstrations and the RL tasks.
- ``compare-heldout.jsonl``: 128 questions on pairs of the other 64 towns, the greedy eval's;
  no town of a held-out question appears in a training question.

Each question (``first``, ``second``, ``ask``, ``answer``) asks which of the two was founded
first, so an episode needs two lookups and a comparison of what they return. In exactly half of
each file's questions the answer is the first name, in a seeded random order, so naming one
position (or any rule that ignores the years) scores 0.5.
``tests/unit/test_tito_compare.py`` checks the committed files are this module's output.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
GLOSSARY = HERE / "towns.jsonl"
TRAIN, HELD_OUT = HERE / "compare-train.jsonl", HERE / "compare-heldout.jsonl"
N_TOWNS, N_TRAIN_TOWNS = 192, 128
N_TRAIN, N_HELD_OUT = 256, 128
SEED = 0
ASK = "Which of the two was founded first?"

HEADS = (
    "Ash", "Bel", "Cor", "Dun", "El", "Fen", "Gar", "Hol", "Ivy", "Kel", "Lin", "Mar",
    "Nor", "Oak", "Pen", "Quin", "Ros", "Sal", "Tam", "Ul", "Ver", "Wil", "Yar", "Zen",
)  # fmt: skip
TAILS = ("ford", "brook", "dale", "wick", "ton", "mere", "field", "haven", "moor", "stead")


def towns() -> list[dict[str, str]]:
    rng = random.Random(SEED)
    names = [h + t for h, t in itertools.product(HEADS, TAILS)]
    rng.shuffle(names)
    years = rng.sample(range(1600, 2000), N_TOWNS)
    return [
        {"name": name, "fact": f"founded in {year}"}
        for name, year in zip(names[:N_TOWNS], years, strict=True)
    ]


def _year(town: dict[str, str]) -> int:
    return int(town["fact"].rsplit(" ", 1)[1])


def questions(pool: list[dict[str, str]], n: int, rng: random.Random) -> list[dict[str, str]]:
    pairs = list(itertools.combinations(range(len(pool)), 2))
    chosen = rng.sample(pairs, n)
    earlier_first = [k < n // 2 for k in range(n)]
    rng.shuffle(earlier_first)
    rows = []
    for (i, j), first in zip(chosen, earlier_first, strict=True):
        early, late = sorted((pool[i], pool[j]), key=_year)
        a, b = (early, late) if first else (late, early)
        rows.append({"first": a["name"], "second": b["name"], "ask": ASK, "answer": early["name"]})
    return rows


def split() -> tuple[list[dict[str, str]], list[dict[str, str]], list[dict[str, str]]]:
    glossary = towns()
    rng = random.Random(SEED + 1)
    train = questions(glossary[:N_TRAIN_TOWNS], N_TRAIN, rng)
    held_out = questions(glossary[N_TRAIN_TOWNS:], N_HELD_OUT, rng)
    return glossary, train, held_out


def write(path: Path, rows: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_task(paths: tuple[Path, Path, Path], rows: tuple[list, list, list], noun: str) -> None:
    """Write a task's glossary, training and held-out questions (``paths``, in that order)."""
    for path, part in zip(paths, rows, strict=True):
        write(path, part)
    glossary, train, held_out = rows
    print(f"wrote {len(glossary)} {noun}, {len(train)} + {len(held_out)} questions")


if __name__ == "__main__":
    write_task((GLOSSARY, TRAIN, HELD_OUT), split(), "towns")
