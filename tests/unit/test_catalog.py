"""`cortex-recipes catalog validate`: the real catalog passes; dangling references and sub-jobs
the SDK rejects fail it."""

from __future__ import annotations

import json

import jsonschema
import pytest

from cortex_recipes import catalog, cli, journeys, schema
from cortex_recipes.sub_jobs import SubJobError, build_sub_job, build_sub_jobs
from tests.unit.recipe_fixtures import ROOT, SFT, copy_repository, edit

pytestmark = pytest.mark.unit

LORA = "model-catalog/profiles/sft.local-cpu-smollm2-lora.json"
TINY = "model-catalog/profiles/sft.local-cpu-tiny-qwen3.json"


@pytest.fixture
def repo(tmp_path):
    return copy_repository(tmp_path / "repo")


def _load(repo, name):
    return json.loads((repo / name).read_text())


def _save(repo, name, data):
    (repo / name).write_text(json.dumps(data, indent=2) + "\n")


def test_repository_passes_catalog_validator():
    assert catalog.validate_catalog(ROOT) == []


def test_catalog_is_in_sync_with_the_journeys(repo):
    assert catalog.sync(repo) == []


def test_copied_catalog_passes(repo):
    assert catalog.validate_catalog(repo) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("evidence", "recipes/sft/conversational/evidence/missing.json"),
        ("example", "recipes/sft/conversational/EXAMPLE.md"),
        ("config", "recipes/sft/conversational/configs/missing.json"),
        ("recipe", "recipes/sft/gone"),
    ],
)
def test_dangling_reference_fails_the_catalog(repo, field, value):
    entry = _load(repo, LORA)
    entry[field] = value
    _save(repo, LORA, entry)
    found = catalog.validate_catalog(repo)
    assert f"{LORA}: {field}={value!r} does not exist" in found


def test_referenced_file_deleted_from_the_recipe_fails_the_catalog(repo):
    (repo / SFT / "evidence" / "local-cpu-smollm2-full.json").unlink()
    found = catalog.validate_catalog(repo)
    where = "model-catalog/profiles/sft.local-cpu-smollm2-full.json"
    assert f"{where}: evidence='{SFT}/evidence/local-cpu-smollm2-full.json' does not exist" in found


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda jobs: jobs[0]["training_config"].update(n_gpus=0),
            "sub_job_configs[0]: the SDK rejects it: training.n_gpus must be > 0",
        ),
        (
            lambda jobs: jobs[0]["training_config"].pop("optimizer"),
            "sub_job_configs[0]: training_config is missing ['optimizer']",
        ),
        (
            lambda jobs: jobs[1]["inference_config"].update(max_seq_len="128"),
            "sub_job_configs[1]: the SDK rejects it:",
        ),
        (
            lambda jobs: jobs[1].update(job_type="serving"),
            "sub_job_configs[1].job_type: 'serving' is not one of",
        ),
        (
            lambda jobs: jobs.append(dict(jobs[0])),
            "sub_job_configs: 2 training sub-jobs; a job holds at most one",
        ),
        (
            lambda jobs: jobs[0].update(lora=True),
            "sub_job_configs[0]: unknown fields ['lora']",
        ),
    ],
    ids=["n_gpus", "no-optimizer", "string-length", "job-type", "two-trainers", "unknown-field"],
)
def test_sub_job_that_fails_sdk_validation_fails_the_catalog(repo, change, message):
    entry = _load(repo, TINY)
    change(entry["sub_job_configs"])
    _save(repo, TINY, entry)
    found = catalog.validate_catalog(repo)
    assert any(p.startswith(f"{TINY}: {message}") for p in found), found


def test_schema_violation_fails_the_catalog(repo):
    models = _load(repo, "model-catalog/models.json")
    del models["models"][0]["source"]
    _save(repo, "model-catalog/models.json", models)
    assert catalog.validate_catalog(repo) == [
        "model-catalog/models.json: models[0].source: required field is missing"
    ]


def test_profile_schema_violation_fails_the_catalog(repo):
    entry = _load(repo, TINY)
    entry["last_validated"] = "yesterday"
    entry["notes"] = "x"
    _save(repo, TINY, entry)
    found = catalog.validate_catalog(repo)
    assert any(p.startswith(f"{TINY}: notes: unknown field; accepted: ") for p in found)
    assert any(p.startswith(f"{TINY}: last_validated: matches none") for p in found)


def test_model_missing_from_models_json_fails_the_catalog(repo):
    models = _load(repo, "model-catalog/models.json")
    models["models"] = [m for m in models["models"] if m["name"] != "tiny-qwen3"]
    _save(repo, "model-catalog/models.json", models)
    found = catalog.validate_catalog(repo)
    assert f"{TINY}: model 'tiny-qwen3' is not in model-catalog/models.json" in found


def test_unused_or_false_fixture_model_fails_the_catalog(repo):
    models = _load(repo, "model-catalog/models.json")
    models["models"].append(dict(models["models"][0], name="tiny-llama"))
    _save(repo, "model-catalog/models.json", models)
    found = catalog.validate_catalog(repo)
    assert "model-catalog/models.json: model 'tiny-llama' is used by no catalog profile" in found
    assert any(
        p.startswith("model-catalog/models.json: models[tiny-llama]: source='fixture' but")
        for p in found
    )


def test_profile_without_a_catalog_entry_fails_the_catalog(repo):
    (repo / TINY).unlink()
    found = catalog.validate_catalog(repo)
    assert any(
        p.startswith("model-catalog/profiles: no sft.local-cpu-tiny-qwen3.json") for p in found
    )


def test_entry_that_no_longer_matches_its_config_fails_until_synced(repo):
    edit(
        repo / SFT / "configs" / "local-cpu-tiny-qwen3.json",
        '"max_seq_len": 128',
        '"max_seq_len": 256',
    )
    found = catalog.validate_catalog(repo)
    assert any(p.startswith(f"{TINY}: config_hash=") and "catalog sync" in p for p in found)
    assert any(p.startswith(f"{TINY}: sub_job_configs=") for p in found)
    assert catalog.sync(repo) == [TINY]
    assert catalog.validate_catalog(repo) == []


def test_entry_for_an_unknown_profile_fails_the_catalog(repo):
    entry = _load(repo, TINY)
    entry.update(id="sft.local-cpu-huge", profile="local-cpu-huge")
    _save(repo, "model-catalog/profiles/sft.local-cpu-huge.json", entry)
    found = catalog.validate_catalog(repo)
    assert any(
        p.startswith("model-catalog/profiles/sft.local-cpu-huge.json: ")
        and "profile='local-cpu-huge' is not listed" in p
        for p in found
    )


def test_stale_compatibility_table_fails_the_catalog(repo):
    edit(repo / "docs/model-compatibility.md", "| `tiny-qwen3` |", "| `tiny-qwen2` |")
    assert catalog.validate_catalog(repo) == [
        "docs/model-compatibility.md: table is stale; run `cortex-recipes catalog sync`"
    ]


def test_cli_catalog_validate_prints_problems_and_exits_1(repo, capsys):
    (repo / TINY).unlink()
    assert cli.main(["catalog", "validate", "--root", str(repo)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "docs/model-compatibility.md: table is stale; run `cortex-recipes catalog sync`" in lines
    assert any(
        line.startswith("model-catalog/profiles: no sft.local-cpu-tiny-qwen3.json")
        for line in lines
    )


def test_cli_catalog_sync_restores_a_deleted_entry(repo, capsys):
    (repo / TINY).unlink()
    assert cli.main(["catalog", "sync", "--root", str(repo)]) == 0
    assert capsys.readouterr().out == f"updated {TINY}\n"
    assert cli.main(["catalog", "validate", "--root", str(repo)]) == 0


# --- the SDK factory round trip -----------------------------------------------------------


def test_sub_job_round_trips_through_the_sdk_factories():
    wire = {
        "job_type": "log_probability",
        "model_name": "smollm2-135m-instruct",
        "dtype": "float32",
        "inference_config": {"max_seq_len": 128, "n_gpus": 1, "gpu_memory_utilization": 0.5},
    }
    sub_job = build_sub_job(wire, "x")
    assert sub_job.job_type.value == "log_probability" and sub_job.to_wire() == wire


def test_sub_job_with_both_blocks_is_rejected():
    wire = {
        "job_type": "sampling",
        "model_name": "m",
        "inference_config": {"max_seq_len": 1, "n_gpus": 1},
        "training_config": {},
    }
    with pytest.raises(SubJobError, match="takes inference_config, not training_config"):
        build_sub_jobs([wire], "jobs")


# --- the schema files are real JSON Schema ------------------------------------------------


def test_schema_files_agree_with_a_full_json_schema_validator():
    catalog_schema = json.loads((ROOT / "model-catalog/schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(catalog_schema)
    jsonschema.validate(
        json.loads((ROOT / "model-catalog/models.json").read_text()), catalog_schema
    )
    profile_schema = {**catalog_schema, "$ref": "#/$defs/profile"}
    profile_schema.pop("required"), profile_schema.pop("properties")
    profile_schema.pop("additionalProperties")
    for path in sorted((ROOT / "model-catalog/profiles").glob("*.json")):
        jsonschema.validate(json.loads(path.read_text()), profile_schema)
    recipe_schema = json.loads((ROOT / "recipes/recipe.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(recipe_schema)
    for folder in (SFT, "recipes/distillation/on_policy"):
        jsonschema.validate(journeys.load_recipe(ROOT / folder / "recipe.yaml"), recipe_schema)


def test_schema_that_is_not_json_schema_is_refused():
    with pytest.raises(schema.SchemaError, match="'integr' is not valid"):
        schema.validate(1, {"type": "integr"})


def test_schema_problem_names_the_json_path_the_value_and_what_is_accepted():
    item = {"type": "object", "properties": {"role": {"enum": ["policy", "teacher"]}}}
    doc = {"type": "object", "properties": {"models": {"type": "array", "items": item}}}
    assert schema.validate({"models": [{"role": "policy"}, {"role": "boss"}]}, doc) == [
        "models[1].role: 'boss' is not one of 'policy', 'teacher'"
    ]
