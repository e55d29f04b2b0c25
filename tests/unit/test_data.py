"""Data through `datasets` (cortex_recipes.data): local JSON/JSONL/Parquet, pinned Hub ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cortex_recipes import sft
from cortex_recipes.data import DataError, load_records, parse_source, prompt_column
from cortex_recipes.distill.opd_profile import load_opd_profile
from tests.helpers import ROOT, write_jsonl

pytestmark = pytest.mark.unit

SFT_DIR = ROOT / "recipes" / "sft" / "conversational"
OPD_CONFIG = (
    ROOT / "recipes" / "distillation" / "on_policy" / "configs" / "local-cpu-smollm2-teacher.json"
)
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def offline_datasets(tmp_path, monkeypatch):
    """No network, and the Arrow cache in tmp (never in the repository or the user cache)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CORTEX_RECIPES_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)


def checked_in_conversations() -> list[list[dict]]:
    lines = (SFT_DIR / "data" / "identity.jsonl").read_text().splitlines()
    return [json.loads(line)["messages"] for line in lines if line.strip()]


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def test_the_checked_in_jsonl_loads_through_datasets_unchanged(tmp_path):
    conversations = sft.load_conversations("data/identity.jsonl", SFT_DIR)
    assert conversations == checked_in_conversations()
    assert (tmp_path / "cache" / "datasets").is_dir()  # the Arrow cache went where it was told


def test_a_read_only_project_cache_loads_through_hf_datasets_cache(tmp_path, monkeypatch):
    # The images' project cache holds the baked fixtures and is read-only to the journey's
    # user; they point datasets' own HF_DATASETS_CACHE somewhere writable instead.
    frozen = tmp_path / "cache"
    frozen.mkdir()
    frozen.chmod(0o555)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "arrow"))
    try:
        assert sft.load_conversations("data/identity.jsonl", SFT_DIR) == checked_in_conversations()
    finally:
        frozen.chmod(0o755)
    assert (tmp_path / "arrow").is_dir() and not any(frozen.iterdir())


def test_parquet_json_and_jsonl_give_the_same_rows(tmp_path):
    rows = [{"messages": m} for m in checked_in_conversations()]
    parquet = write_parquet(tmp_path / "train.parquet", rows)
    as_json = tmp_path / "train.json"
    as_json.write_text(json.dumps(rows))
    expected = checked_in_conversations()
    assert sft.load_conversations(str(parquet)) == expected
    assert sft.load_conversations("train.json", tmp_path) == expected


def test_null_keys_that_arrow_adds_to_messages_are_dropped(tmp_path):
    rows = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        {"messages": [{"role": "user", "content": "x", "name": "ann"}]},
    ]
    parquet = write_parquet(tmp_path / "mixed.parquet", rows)
    loaded = sft.load_conversations(str(parquet))
    assert loaded[0][0] == {"role": "user", "content": "hi"}  # no "name": None
    assert loaded[1][0] == {"role": "user", "content": "x", "name": "ann"}


def test_opd_prompts_load_through_datasets_and_override_with_a_parquet(tmp_path):
    profile = load_opd_profile(OPD_CONFIG)
    prompts = profile.prompt_texts()
    lines = (profile.recipe_dir / profile.prompts).read_text().splitlines()
    assert prompts == [json.loads(line)["prompt"] for line in lines if line.strip()]
    parquet = write_parquet(tmp_path / "p.parquet", [{"prompt": "Say hi.", "extra": 1}])
    other = load_opd_profile(OPD_CONFIG, [f"prompts={parquet}"])
    assert other.prompt_texts() == ["Say hi."]


def test_a_missing_file_names_the_field_value_and_what_is_accepted(tmp_path):
    with pytest.raises(DataError) as error:
        load_records("dataset", "data/nope.parquet", tmp_path, {"messages": bool})
    message = str(error.value)
    assert "dataset='data/nope.parquet'" in message and "does not exist" in message
    assert (
        ".json, .jsonl or .parquet" in message and "hub:<owner>/<name>@<40-hex commit>" in message
    )


def test_an_unknown_file_type_is_refused(tmp_path):
    (tmp_path / "rows.csv").write_text("prompt\nhi\n")
    with pytest.raises(DataError, match=r"prompts='rows.csv': file type '.csv' is not read"):
        load_records("prompts", "rows.csv", tmp_path, {"prompt": prompt_column})


def test_a_wrong_column_names_the_columns_found_and_needed(tmp_path):
    parquet = write_parquet(tmp_path / "q.parquet", [{"question": "hi"}])
    with pytest.raises(DataError) as error:
        load_records("prompts", str(parquet), tmp_path, {"prompt": prompt_column})
    message = str(error.value)
    assert "no column 'prompt' (columns: question)" in message
    assert "accepted: rows with 'prompt'" in message


def test_a_bad_value_names_the_row_and_column(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "fine"}\n{"prompt": "  "}\n')
    with pytest.raises(DataError, match=r"row 2 column 'prompt' = '  ' is not a non-empty string"):
        load_records("prompts", "rows.jsonl", tmp_path, {"prompt": prompt_column})


def test_an_empty_dataset_is_refused(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"prompt": []}).to_parquet(str(tmp_path / "empty.parquet"))
    # datasets itself refuses a Parquet file without rows; either way the field is named.
    with pytest.raises(DataError, match=r"prompts='empty.parquet'.*(has no rows|no data)"):
        load_records("prompts", "empty.parquet", tmp_path, {"prompt": prompt_column})


@pytest.mark.parametrize(
    "value, says",
    [
        ("hub:owner/name", "has no revision"),
        ("hub:owner/name@main", "has revision 'main'"),
        ("hub:owner/name@v1.0:train", "has revision 'v1.0'"),
        (f"hub:owner/name@{COMMIT[:12]}", f"has revision '{COMMIT[:12]}'"),
    ],
)
def test_an_unpinned_hub_id_fails_closed(tmp_path, value, says):
    with pytest.raises(DataError) as error:
        parse_source("dataset", value, tmp_path)
    message = str(error.value)
    assert f"dataset={value!r}" in message and says in message
    assert "pinned to the full 40-hex commit" in message


def test_a_pinned_hub_id_parses_and_offline_it_fails_naming_it(tmp_path):
    source = parse_source("dataset", f"hub:owner/name@{COMMIT}:validation", tmp_path)
    assert (source.repo, source.revision, source.split) == ("owner/name", COMMIT, "validation")
    assert parse_source("dataset", f"hub:owner/name@{COMMIT}", tmp_path).split == "train"
    with pytest.raises(DataError) as error:
        load_records("dataset", f"hub:owner/name@{COMMIT}", tmp_path, {"messages": bool})
    assert f"owner/name@{COMMIT} split 'train' could not be loaded through datasets" in str(
        error.value
    )
    assert not (tmp_path / "cache" / "datasets" / "downloads").exists()


def test_a_malformed_hub_id_is_refused(tmp_path):
    with pytest.raises(DataError, match="is not a Hub id"):
        parse_source("dataset", "hub:justaname", tmp_path)


GRPO_CONFIG = ROOT / "recipes" / "rl" / "math_grpo" / "configs" / "local-cpu-smollm2-lora.json"
TASKS = [
    {"question": "Calculate 2 + 3.", "answer": "5", "source": "hand"},
    {"question": "Calculate 7 + 1.", "answer": "8", "source": "hand"},
    {"question": "Calculate 4 + 4.", "answer": "8", "source": "hand"},
]


def test_grpo_task_files_load_through_datasets_and_score_the_first_integer(tmp_path):
    from cortex_recipes.rl.grpo_profile import load_grpo_profile

    jsonl = write_jsonl(tmp_path / "tasks.jsonl", TASKS)
    # integer answers in the Parquet file: read as their decimal strings
    parquet = write_parquet(
        tmp_path / "eval.parquet", [{**t, "answer": int(t["answer"])} for t in TASKS[::-1]]
    )
    profile = load_grpo_profile(
        GRPO_CONFIG, [f"env.tasks={jsonl}", "env.size=2", f"eval.tasks={parquet}",
                      "eval.num_examples=3"],
    )  # fmt: skip
    env, eval_env = profile.envs()
    assert [env.task(i).question for i in range(3)] == [
        "Calculate 2 + 3.", "Calculate 7 + 1.", "Calculate 2 + 3.",  # the first env.size rows
    ]  # fmt: skip
    assert env.prompt(env.task(1)) == "Calculate 7 + 1. " + profile.env.instruction
    assert [eval_env.task(i).answer for i in range(3)] == ["8", "8", "5"]
    task = env.task(1)
    assert env.score(task, "8, since 7 + 1 = 8") == 1.0
    assert env.score(task, "7 + 1 = 8") == 0.0  # the first integer counts, as in the eval
    assert env.score(task, "eighty") == 0.0
    # without eval.tasks the eval set stays the generator's, with the eval seed
    base = load_grpo_profile(GRPO_CONFIG)
    _, generated = load_grpo_profile(GRPO_CONFIG, [f"env.tasks={jsonl}", "env.size=3"]).envs()
    _, default = base.envs()
    assert generated.size == default.size == base.eval.num_examples
    assert generated.task(0).question == default.task(0).question


def test_a_grpo_task_file_with_too_few_rows_or_a_bad_answer_is_refused(tmp_path):
    from cortex_recipes.rl.grpo_profile import load_grpo_profile

    jsonl = write_jsonl(tmp_path / "tasks.jsonl", TASKS)
    with pytest.raises(DataError, match=r"env.tasks=.* has 3 rows, fewer than the 1000"):
        load_grpo_profile(GRPO_CONFIG, [f"env.tasks={jsonl}"]).envs()
    bad = write_jsonl(tmp_path / "bad.jsonl", [*TASKS, {"question": "Halve 3.", "answer": "1.5"}])
    with pytest.raises(DataError, match=r"row 4 column 'answer' = '1.5' is not an integer"):
        load_grpo_profile(GRPO_CONFIG, [f"env.tasks={bad}", "env.size=4"]).envs()
    no_question = write_jsonl(tmp_path / "q.jsonl", [{"prompt": "x", "answer": "1"}])
    with pytest.raises(DataError, match=r"no column 'question'"):
        load_grpo_profile(GRPO_CONFIG, [f"env.tasks={no_question}", "env.size=1"]).envs()
    with pytest.raises(DataError, match=r"eval.tasks='hub:a/b' has no revision"):
        load_grpo_profile(GRPO_CONFIG, ["eval.tasks=hub:a/b"]).envs()


TITO_CONFIG = ROOT / "recipes" / "agentic" / "tito" / "configs" / "local-cpu-tiny-qwen3.json"


def test_the_tito_glossary_loads_through_datasets_and_drives_tasks_and_tool(tmp_path):
    pytest.importorskip("verifiers")
    import verifiers.v1 as vf  # noqa: F401

    from cortex_recipes.envs.glossary import (
        FACTS,
        NOT_FOUND,
        GlossaryTaskset,
        GlossaryToolset,
        call_tool,
        glossary_config,
        load_facts,
    )
    from cortex_recipes.tito.tito_profile import load_tito_profile

    default = load_tito_profile(TITO_CONFIG)
    assert load_facts("tasks", default.tasks, default.recipe_dir) == FACTS  # the checked-in file
    rows = [{"name": "Hedy  Lamarr", "fact": "co-invented frequency hopping "},
            {"name": "Katherine Johnson", "fact": "computed Apollo trajectories"}]  # fmt: skip
    parquet = write_parquet(tmp_path / "glossary.parquet", rows)
    profile = load_tito_profile(TITO_CONFIG, [f"tasks={parquet}"])
    facts = load_facts("tasks", profile.tasks, profile.recipe_dir)
    assert facts == {
        "hedy lamarr": "co-invented frequency hopping",
        "katherine johnson": "computed Apollo trajectories",
    }
    config = glossary_config(facts)
    tasks = GlossaryTaskset(config).load()
    assert [(t.data.name, t.data.answer) for t in tasks] == [
        ("Hedy Lamarr", "co-invented frequency hopping"),
        ("Katherine Johnson", "computed Apollo trajectories"),
    ]
    assert "Hedy Lamarr" in tasks[0].data.prompt
    toolset = GlossaryToolset(config.task.tools)
    assert call_tool(toolset, "facts_lookup", {"name": " katherine JOHNSON"}) == (
        "computed Apollo trajectories"
    )
    assert call_tool(toolset, "facts_lookup", {"name": "Ada Lovelace"}) == NOT_FOUND


def test_a_tito_glossary_with_a_repeated_name_or_a_missing_column_is_refused(tmp_path):
    pytest.importorskip("verifiers")
    from cortex_recipes.envs.glossary import load_facts

    twice = write_jsonl(tmp_path / "twice.jsonl", [
        {"name": "Ada Lovelace", "fact": "a"}, {"name": "ada  lovelace", "fact": "b"},
    ])  # fmt: skip
    with pytest.raises(DataError, match=r"row 2 column 'name' = 'ada  lovelace' repeats row 1"):
        load_facts("tasks", str(twice), tmp_path)
    no_fact = write_jsonl(tmp_path / "nofact.jsonl", [{"name": "Ada Lovelace", "answer": "a"}])
    with pytest.raises(DataError, match=r"tasks=.*no column 'fact'"):
        load_facts("tasks", str(no_fact), tmp_path)
    blank = write_jsonl(tmp_path / "blank.jsonl", [{"name": "Ada Lovelace", "fact": " "}])
    with pytest.raises(DataError, match=r"row 1 column 'fact' = ' ' is not a non-empty string"):
        load_facts("tasks", str(blank), tmp_path)
    with pytest.raises(DataError, match=r"tasks='missing.jsonl': .* does not exist"):
        load_facts("tasks", "missing.jsonl", tmp_path)
