"""One metrics schema: what a ``metrics.jsonl`` record of each journey may hold.

``metrics_schema.json`` (shipped next to this module, JSON Schema draft 2020-12) is the one
home of the metric keys: ``$defs/keys`` names every key any journey writes with its type, unit
and meaning, and ``$defs/<journey>`` is one journey's record (the journey name ``open_run`` is
given: ``sft``, ``opd``, ``async_grpo``, ``math_grpo``, ``tito``; ``async_grpo/prime-rl`` is
``async_grpo`` run with ``runner=prime-rl``). ``docs/metrics.md`` describes the same keys, and
``tests/unit/test_metrics_schema.py`` keeps the two equal.

Invariants this module keeps:

- A record is checked before it is written (:meth:`cortex_recipes.run.Run.metrics`); a key no
  journey's schema names, a missing required key or a value of the wrong type raises
  :class:`MetricsSchemaError` naming the key and the value, and nothing is written.
- The only open namespace is ``primerl/``, in ``async_grpo/prime-rl`` records: prime-rl's own
  per-step metrics, passed through as prime-rl names them.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from cortex_recipes import schema

SCHEMA_FILE = "metrics_schema.json"


class MetricsSchemaError(ValueError):
    """A metrics record that does not match its journey's schema; the message names the key."""


@cache
def metrics_schema() -> dict[str, Any]:
    """The parsed ``metrics_schema.json``."""
    return json.loads(resources.files("cortex_recipes").joinpath(SCHEMA_FILE).read_text())


def record_kinds() -> list[str]:
    """The journeys (and runner variants) the schema has a record for."""
    return sorted(k for k in metrics_schema()["$defs"] if k != "keys")


def all_keys() -> dict[str, dict[str, Any]]:
    """Every key any journey writes -> its schema (``type``, ``unit``, ``description``)."""
    return metrics_schema()["$defs"]["keys"]["properties"]


def validate_record(journey: str, record: dict[str, Any]) -> None:
    """Raise :class:`MetricsSchemaError` unless ``record`` is a valid ``journey`` record."""
    kinds = record_kinds()
    if journey not in kinds:
        raise MetricsSchemaError(
            f"journey={journey!r} has no metrics schema in {SCHEMA_FILE}; accepted: "
            + ", ".join(kinds)
        )
    pointer = journey.replace("~", "~0").replace("/", "~1")
    problems = schema.validate(record, {"$ref": f"#/$defs/{pointer}"}, root=metrics_schema())
    if problems:
        shown = {k: record[k] for k in record if any(p.startswith(f"{k}:") for p in problems)}
        raise MetricsSchemaError(
            f"{journey} metrics record (step={record.get('step')!r}) does not match "
            f"{SCHEMA_FILE} $defs/{journey}: "
            + "; ".join(problems)
            + (f" (values: {shown!r})" if shown else "")
        )
