"""The one metrics schema (cortex_recipes.metrics): docs/metrics.md and metrics_schema.json name
the same keys, unknown keys are refused by name, ``primerl/*`` passes, and Run.metrics checks
every record before it is written."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import jsonschema
import pytest

from cortex_recipes.metrics import (
    MetricsSchemaError,
    all_keys,
    metrics_schema,
    record_kinds,
    validate_record,
)
from cortex_recipes.run import open_run
from tests.helpers import ROOT

pytestmark = pytest.mark.unit

DOC = ROOT / "docs" / "metrics.md"
# The run-folder journey each recipe folder writes its metrics under.
RECIPE_JOURNEY = {
    "sft/conversational": "sft",
    "distillation/on_policy": "opd",
    "rl/async_grpo": "async_grpo/prime-rl",
    "rl/math_grpo": "math_grpo",
    "agentic/tito": "tito",
}
# The metric keys each qualify.py reads back from a run's metrics.jsonl.
QUALIFY_READS = {
    "async_grpo/prime-rl": ["step", "time/step"],
    "math_grpo": ["rollouts/sha256"],
}  # fmt: skip


def example(journey: str) -> dict:
    """A record with every required key of ``journey``, each a value of its type."""
    by_type = {"integer": 1, "number": 0.5, "string": "abc", "null": None}
    record = {}
    for key in metrics_schema()["$defs"][journey]["required"]:
        spec = all_keys()[key]
        if spec["type"] == "array":
            record[key] = [by_type[spec["items"]["type"]]]
        else:
            types = spec["type"] if isinstance(spec["type"], list) else [spec["type"]]
            record[key] = by_type[types[0]]
    return record


def doc_keys() -> set[str]:
    return set(re.findall(r"^\| `([^`]+)` \|", DOC.read_text(), flags=re.MULTILINE))


def test_the_schema_is_valid_json_schema_and_every_record_refers_to_the_key_list():
    schema = metrics_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert record_kinds() == sorted(["sft", "opd", "async_grpo/prime-rl", "math_grpo", "tito"])
    used = set()
    for journey in record_kinds():
        record = schema["$defs"][journey]
        assert record["additionalProperties"] is False, journey
        assert set(record["required"]) <= set(record["properties"]), journey
        used |= set(record["properties"])
    assert used == set(all_keys())  # no key listed that no journey writes
    for key, spec in all_keys().items():
        assert spec.get("unit") and spec.get("description"), key


def test_docs_metrics_md_names_exactly_the_schema_keys():
    documented = doc_keys()
    assert documented - set(all_keys()) == set(), "documented, not in the schema"
    assert set(all_keys()) - documented == set(), "in the schema, not documented"
    assert "`primerl/" in DOC.read_text()  # the pass-through namespace is described


@pytest.mark.parametrize("journey", sorted(RECIPE_JOURNEY.values()))
def test_a_record_with_the_required_keys_validates(journey):
    validate_record(journey, example(journey))


def test_an_unknown_key_is_refused_with_its_name_and_value():
    with pytest.raises(MetricsSchemaError, match=r"time_s: unknown field.*'time_s': 3\.5"):
        validate_record("sft", {**example("sft"), "time_s": 3.5})


def test_a_missing_key_and_a_wrong_type_are_refused_by_name():
    record = example("tito")
    del record["reward/mean"]
    with pytest.raises(MetricsSchemaError, match="reward/mean: required field is missing"):
        validate_record("tito", record)
    with pytest.raises(MetricsSchemaError, match="step: '2' is not of type integer"):
        validate_record("tito", {**example("tito"), "step": "2"})


def test_an_unknown_journey_is_refused_naming_the_accepted_ones():
    with pytest.raises(MetricsSchemaError, match="journey='grpo'.*accepted: async_grpo/prime-rl"):
        validate_record("grpo", {"step": 1})


def test_primerl_keys_pass_through_only_on_the_prime_rl_runner():
    record = {**example("async_grpo/prime-rl"), "primerl/off_policy/max": 1,
              "primerl/reward/mean": [0.5]}  # fmt: skip
    validate_record("async_grpo/prime-rl", record)
    with pytest.raises(MetricsSchemaError, match="not_primerl: unknown field"):
        validate_record("async_grpo/prime-rl", {**record, "not_primerl": 1})
    with pytest.raises(MetricsSchemaError, match="primerl/reward/mean: unknown field"):
        validate_record("math_grpo", {**example("math_grpo"), "primerl/reward/mean": 0.5})


def test_optional_keys_are_accepted_on_the_steps_that_write_them():
    validate_record("async_grpo/prime-rl", {**example("async_grpo/prime-rl"),
                                            "eval/accuracy": 0.5, "time/save_ckpt": 0.2})  # fmt: skip
    validate_record("opd", {**example("opd"), "eval/teacher_reverse_kl": 4.4})


@pytest.mark.parametrize("journey", sorted(QUALIFY_READS))
def test_the_keys_qualify_reads_back_are_in_the_journey_schema(journey):
    required = metrics_schema()["$defs"][journey]["required"]
    assert set(QUALIFY_READS[journey]) <= set(required)


def _step_records(value):
    """Objects in an evidence record that look like per-step metrics (a step and a loss)."""
    if isinstance(value, dict):
        if "step" in value and "loss" in value:
            yield value
        else:
            for item in value.values():
                yield from _step_records(item)
    elif isinstance(value, list):
        for item in value:
            yield from _step_records(item)


def test_per_step_records_in_checked_in_evidence_validate():
    # Today's evidence records keep summaries (eval curves, losses), not metrics.jsonl lines;
    # any per-step record one adds must match its journey's schema.
    for area_name, journey in RECIPE_JOURNEY.items():
        for path in sorted((ROOT / "recipes" / area_name / "evidence").glob("*.json")):
            for record in _step_records(json.loads(path.read_text())):
                validate_record(journey, record)


@dataclass(frozen=True)
class Profile:
    name: str = "p"
    config_hash: str = "hash-a"
    raw: dict = field(default_factory=lambda: {"name": "p"})


def test_run_metrics_refuses_a_bad_record_and_keeps_what_was_written(tmp_path):
    run = open_run("sft", Profile(), {}, log_path=str(tmp_path))
    run.metrics(**example("sft"))
    with pytest.raises(MetricsSchemaError, match="time_s: unknown field"):
        run.metrics(**{**example("sft"), "step": 2, "time_s": 1.0})
    assert run.read_metrics() == [example("sft")]
    run.record_metrics(example("async_grpo/prime-rl"), schema="async_grpo/prime-rl")
    assert len(run.read_metrics()) == 2
