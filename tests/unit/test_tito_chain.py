"""TITO chain questions: the committed people-and-towns data, the loader's refusals, the
reward, the two-turn demonstrations (complete and stopped early) and the profile's checks."""

from __future__ import annotations

import pytest

pytest.importorskip("verifiers")

from cortex_recipes.data import DataError
from cortex_recipes.envs.glossary import (
    ChainTaskData,
    chain_tasks,
    entity_key,
    glossary_config,
    load_chain_questions,
    task_reward,
)
from cortex_recipes.profiles import ProfileError
from cortex_recipes.tito.tito_profile import load_tito_profile
from cortex_recipes.tito.training import chain_demonstration, completed_chains
from recipes.agentic.tito.data import chain
from tests.helpers import ROOT, write_jsonl
from tests.unit.glossary_data import committed_split, profile_tasks

pytestmark = pytest.mark.unit

CONFIGS = ROOT / "recipes" / "agentic" / "tito" / "configs"
CHAIN = CONFIGS / "local-cpu-smollm2-chain.json"


def test_the_committed_chain_data_is_the_generators_and_the_held_out_chains_are_unseen():
    glossary, train, held_out = committed_split(chain)
    assert (len(train), len(held_out)) == (256, 128)
    assert len({entity_key(r["name"]) for r in glossary}) == len(glossary)
    for column in ("start", "via", "answer"):
        seen = {r[column] for r in train}
        assert not seen & {r[column] for r in held_out}, column
    facts = {entity_key(r["name"]): r["fact"] for r in glossary}
    for row in train + held_out:
        assert facts[entity_key(row["start"])] == f"born in {row['via']}"
        assert facts[entity_key(row["via"])] == f"on the river {row['answer']}"
        # the wrong answer (the town) and the right one (the river) never contain each other
        assert row["answer"].lower() not in row["via"].lower()
        assert row["via"].lower() not in row["answer"].lower()


def test_the_chain_profile_loads_its_questions_against_its_glossary():
    profile = load_tito_profile(CHAIN)
    assert profile.question_type == "chain" and profile.warm_start.complete_share == 0.4
    facts, tasks = profile_tasks(profile, load_chain_questions, chain_tasks)
    assert len(tasks) == 256
    task = tasks[0]
    assert isinstance(task.data, ChainTaskData)
    assert task.data.start in task.data.prompt and task.data.via not in task.data.prompt
    assert "<answer></answer>" in task.data.prompt
    held_out = load_chain_questions(
        "eval_questions", profile.eval_questions, profile.recipe_dir, facts
    )
    assert len(held_out) == 128


FACTS = {
    "ada birch": "born in Oakford",
    "oakford": "on the river Belen",
    "belton": "on the river Arow",
}
BASE = {
    "start": "Ada Birch",
    "via": "Oakford",
    "ask": "Which river runs through the town where Ada Birch was born?",
    "answer": "Belen",
}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"start": "Bo Pike"}, r"row 1 column 'start' = 'Bo Pike' is not in the glossary"),
        ({"via": "Elmere"}, r"row 1 column 'via' = 'Elmere' is not in the glossary"),
        ({"via": " ada  BIRCH"}, r"row 1: start and via are the same entity"),
        (
            {"via": "Belton"},
            r"row 1 column 'via' = 'Belton' is not named by the fact of 'Ada Birch' "
            r"\('born in Oakford'\)",
        ),
        (
            {"answer": "Arow"},
            r"row 1 column 'answer' = 'Arow' is not in the fact of 'Oakford' "
            r"\('on the river Belen'\)",
        ),
        ({"ask": ""}, r"row 1 column 'ask' = '' is not a non-empty string"),
    ],
)
def test_a_bad_chain_question_is_refused_naming_the_row_and_value(tmp_path, row, message):
    path = write_jsonl(tmp_path / "q.jsonl", [{**BASE, **row}])
    with pytest.raises(DataError, match=message):
        load_chain_questions("questions", str(path), tmp_path, FACTS)


def test_a_chain_demonstration_looks_up_the_start_then_what_it_named():
    messages = chain_demonstration(BASE, FACTS)
    calls = [m["tool_calls"] for m in messages if m.get("tool_calls")]
    assert [len(c) for c in calls] == [1, 1]  # two turns, one call each
    assert [c[0]["function"]["arguments"]["name"] for c in calls] == ["Ada Birch", "Oakford"]
    assert [m["content"] for m in messages if m["role"] == "tool"] == [
        "born in Oakford",
        "on the river Belen",
    ]
    task = chain_tasks(glossary_config(FACTS), [BASE])[0]
    assert task_reward(task, messages[-1]["content"]) == 1.0
    # a demonstrator that stops early answers with the first lookup's result: reward 0
    early = chain_demonstration(BASE, FACTS, complete=False)
    assert len([m for m in early if m.get("tool_calls")]) == 1
    assert early[-1] == {"role": "assistant", "content": "<answer>Oakford</answer>"}
    assert task_reward(task, early[-1]["content"]) == 0.0
    assert task_reward(task, "<answer>Belen, in Oakford</answer>") == 0.0


def test_the_completed_share_is_exact_seeded_and_spread():
    picks = completed_chains(256, 0.4, seed=0)
    assert sum(picks) == round(0.4 * 256) and picks == completed_chains(256, 0.4, seed=0)
    assert picks != completed_chains(256, 0.4, seed=1)
    assert 0 < sum(picks[:128]) < 128  # not all the complete ones first
    assert completed_chains(5, 1.0, seed=0) == [True] * 5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("warm_start.complete_share=1.5",), r"warm_start.complete_share=1.5 must be at most 1"),
        (
            ("question_type=compare",),
            r"warm_start.complete_share=0.4 applies only to chain questions",
        ),
        (("question_type=graph",), r"question_type"),
    ],
)
def test_the_profile_refuses_a_complete_share_it_cannot_use(overrides, message):
    with pytest.raises(ProfileError, match=message):
        load_tito_profile(CHAIN, overrides)
