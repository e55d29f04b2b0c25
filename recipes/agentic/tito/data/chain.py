"""The people-and-towns glossary and chain questions of the SmolLM2 TITO chain profile.

    python -m recipes.agentic.tito.data.chain   # rewrites the three files

- ``chain-glossary.jsonl``: 192 made-up towns (the names of :mod:`.towns`), each on a made-up
  river (``fact``: "on the river Belen"), and 384 made-up people, each born in one of the towns
  (``fact``: "born in Corfield"). Every name is invented, so no model knows an answer
  without the lookup tool.
- ``chain-train.jsonl``: 256 questions, one per person born in the first 128 towns (two people
  per town): the warm start's demonstrations and the RL tasks.
- ``chain-heldout.jsonl``: 128 questions, one per person born in the other 64 towns, the greedy
  eval's; no person, town or river of a held-out question appears in a training question.

Each question (``start``, ``via``, ``ask``, ``answer``) asks which river runs through the town
where the person was born: the first lookup (the person) names the town, the second (the
town) names the river, so the second call's argument is only known after the first returns.
Answering with the town, what the first lookup returned, scores 0.
``tests/unit/test_tito_chain.py`` checks the committed files are this module's output.
"""

from __future__ import annotations

import itertools
import random

from recipes.agentic.tito.data.towns import HEADS, HERE, TAILS, write_task

GLOSSARY = HERE / "chain-glossary.jsonl"
TRAIN, HELD_OUT = HERE / "chain-train.jsonl", HERE / "chain-heldout.jsonl"
N_TOWNS, N_TRAIN_TOWNS = 192, 128
PEOPLE_PER_TOWN = 2
SEED = 2
ASK = "Which river runs through the town where {} was born?"

RIVER_HEADS = (
    "Ar", "Bre", "Cal", "Dor", "Em", "Fal", "Gil", "Har",
    "Is", "Jor", "Kes", "Lum", "Mor", "Ned", "Ot", "Pel",
)  # fmt: skip
RIVER_TAILS = ("en", "ow", "ay", "ith", "un", "el", "ash", "er", "ine", "od", "ar", "is")
GIVEN = (
    "Ada", "Bram", "Cora", "Dev", "Edda", "Finn", "Gwen", "Hal", "Ines", "Jory", "Kit", "Lena",
    "Milo", "Nia", "Otto", "Pia", "Rafe", "Sana", "Theo", "Uma", "Vik", "Wren", "Yara", "Zeb",
)  # fmt: skip
FAMILY = (
    "Abbot", "Birch", "Crane", "Dawes", "Ellis", "Frost", "Gale", "Hart", "Irwin", "Joyce",
    "Knox", "Lowe", "Marsh", "Nash", "Orme", "Pike", "Quill", "Reed", "Shaw", "Tate", "Vance",
    "Wade", "Yates", "Zorn",
)  # fmt: skip


def split() -> tuple[list[dict[str, str]], list[dict[str, str]], list[dict[str, str]]]:
    rng = random.Random(SEED)
    towns = [h + t for h, t in itertools.product(HEADS, TAILS)]
    rivers = [h + t for h, t in itertools.product(RIVER_HEADS, RIVER_TAILS)]
    people = [f"{g} {f}" for g, f in itertools.product(GIVEN, FAMILY)]
    rng.shuffle(towns)
    rng.shuffle(rivers)
    rng.shuffle(people)
    towns, rivers = towns[:N_TOWNS], rivers[:N_TOWNS]
    births = [town for town in towns for _ in range(PEOPLE_PER_TOWN)]
    people = people[: len(births)]
    glossary = [
        {"name": town, "fact": f"on the river {river}"}
        for town, river in zip(towns, rivers, strict=True)
    ] + [{"name": p, "fact": f"born in {town}"} for p, town in zip(people, births, strict=True)]
    river_of = dict(zip(towns, rivers, strict=True))
    rows = [
        {"start": p, "via": town, "ask": ASK.format(p), "answer": river_of[town]}
        for p, town in zip(people, births, strict=True)
    ]
    cut = N_TRAIN_TOWNS * PEOPLE_PER_TOWN
    train, held_out = rows[:cut], rows[cut:]
    rng.shuffle(train)
    rng.shuffle(held_out)
    return glossary, train, held_out


if __name__ == "__main__":
    write_task((GLOSSARY, TRAIN, HELD_OUT), split(), "entries")
