"""TITO comparison questions: the committed towns data, the loader's refusals, the reward, and
the two-lookup demonstrations."""

from __future__ import annotations

import pytest

pytest.importorskip("verifiers")

from cortex_recipes.data import DataError
from cortex_recipes.envs.glossary import (
    CompareTaskData,
    answer_text,
    compare_tasks,
    entity_key,
    glossary_config,
    load_questions,
    named,
    task_reward,
)
from cortex_recipes.tito.tito_profile import load_tito_profile
from cortex_recipes.tito.training import compare_demonstration
from recipes.agentic.tito.data import towns
from tests.helpers import ROOT, write_jsonl
from tests.unit.glossary_data import committed_split, profile_tasks

pytestmark = pytest.mark.unit

COMPARE = ROOT / "recipes" / "agentic" / "tito" / "configs" / "local-cpu-smollm2-compare.json"


def test_the_committed_towns_data_is_the_generators_and_the_held_out_towns_are_unseen():
    glossary, train, held_out = committed_split(towns)
    assert len(held_out) >= 128 and len({r["name"] for r in glossary}) == len(glossary)
    seen = {r[c] for r in train for c in ("first", "second")}
    unseen = {r[c] for r in held_out for c in ("first", "second")}
    assert not seen & unseen
    years = {r["name"]: int(r["fact"].split()[-1]) for r in glossary}
    for row in train + held_out:
        assert row["answer"] == min(row["first"], row["second"], key=years.get)
    # the answer is not always in one position: "always the first" is no strategy
    share_first = sum(r["answer"] == r["first"] for r in held_out) / len(held_out)
    assert share_first == 0.5


def test_the_compare_profile_loads_its_questions_against_its_glossary():
    profile = load_tito_profile(COMPARE)
    _, tasks = profile_tasks(profile, load_questions, compare_tasks)
    assert len(tasks) == 256
    task = tasks[0]
    assert isinstance(task.data, CompareTaskData)
    assert task.data.first in task.data.prompt and task.data.second in task.data.prompt
    assert "<answer></answer>" in task.data.prompt
    assert task.data.other in (task.data.first, task.data.second)
    assert task.data.other != task.data.answer


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"first": "Atlantis", "second": "Oakford"},
            r"row 1 column 'first' = 'Atlantis' is not in the glossary",
        ),
        (
            {"first": "Oakford", "second": " oakford"},
            r"row 1: first and second are the same entity",
        ),
        ({"answer": "Elmere"}, r"row 1 column 'answer' = 'Elmere' is neither first"),
        ({"ask": " "}, r"row 1 column 'ask' = ' ' is not a non-empty string"),
    ],
)
def test_a_bad_question_is_refused_naming_the_row_and_value(tmp_path, row, message):
    facts = {"oakford": "founded in 1700", "belton": "founded in 1800", "elmere": "founded in 1900"}
    base = {
        "first": "Oakford",
        "second": "Belton",
        "ask": "Which was founded first?",
        "answer": "Oakford",
    }
    path = write_jsonl(tmp_path / "q.jsonl", [{**base, **row}])
    with pytest.raises(DataError, match=message):
        load_questions("questions", str(path), tmp_path, facts)


def test_the_comparison_reward_needs_the_answer_and_not_the_other_name():
    assert named("Oakford", "Belton", "<answer>Oakford</answer>") == 1.0
    assert named("Oakford", "Belton", "<answer> oakford </answer>") == 1.0
    assert named("Oakford", "Belton", "<answer>Belton</answer>") == 0.0
    assert named("Oakford", "Belton", "<answer>Oakford or Belton</answer>") == 0.0
    # only the last answer tags count; without tags, the whole reply
    assert named("Oakford", "Belton", "<answer>Belton</answer> <answer>Oakford</answer>") == 1.0
    assert named("Oakford", "Belton", "It is Oakford.") == 1.0
    assert named("Oakford", "Belton", None) == 0.0
    assert answer_text("x <answer>Belton") == "Belton"


def test_a_comparison_demonstration_looks_up_both_names_then_answers():
    facts = {"oakford": "founded in 1700", "belton": "founded in 1800"}
    question = {
        "first": "Belton",
        "second": "Oakford",
        "ask": "Which was founded first?",
        "answer": "Oakford",
    }
    messages = compare_demonstration(question, facts)
    turns = [m["tool_calls"] for m in messages if m.get("tool_calls")]
    assert len(turns) == 1  # one turn, two calls
    assert [c["function"]["arguments"]["name"] for c in turns[0]] == ["Belton", "Oakford"]
    assert [m["content"] for m in messages if m["role"] == "tool"] == [
        "founded in 1800",
        "founded in 1700",
    ]
    assert messages[-1] == {"role": "assistant", "content": "<answer>Oakford</answer>"}
    task = compare_tasks(glossary_config(facts), [question])[0]
    assert task_reward(task, messages[-1]["content"]) == 1.0
    assert entity_key(task.data.other) == "belton"
