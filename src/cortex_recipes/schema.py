"""A small JSON Schema (draft 2020-12) subset, enough for recipe.yaml and the model catalog.

The repository's schemas (``recipes/recipe.schema.json``, ``model-catalog/schema.json``) are
plain JSON Schema documents, so any full validator accepts them; this module checks them
without a dependency. Supported keywords: ``type``, ``enum``, ``const``, ``pattern``,
``minLength``, ``minimum``, ``minItems``, ``required``, ``properties``,
``additionalProperties``, ``items``, ``anyOf``, ``$ref`` (local ``#/$defs/...`` only) and
``format: date`` (``YYYY-MM-DD``). Anything else in a schema is an error, so a schema never
silently claims a check that is not made.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

SUPPORTED_KEYWORDS = {
    "$schema", "$id", "$defs", "$ref", "$comment", "title", "description", "type", "enum",
    "const", "pattern", "minLength", "minimum", "minItems", "required", "properties",
    "additionalProperties", "items", "anyOf", "format",
}  # fmt: skip

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


class SchemaError(ValueError):
    """The schema itself uses something this module does not check."""


def _is_type(value: Any, name: str) -> bool:
    if name not in _TYPES:
        raise SchemaError(f"unknown type {name!r}; accepted: {', '.join(_TYPES)}")
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    return isinstance(value, _TYPES[name])


def _where(path: str) -> str:
    return path or "(top level)"


def validate(value: Any, schema: dict[str, Any], root: dict[str, Any] | None = None) -> list[str]:
    """Every way ``value`` breaks ``schema``, as ``field: problem`` strings (empty if none)."""
    return _check(value, schema, root if root is not None else schema, "")


def _check(value: Any, schema: dict[str, Any], root: dict[str, Any], path: str) -> list[str]:
    unknown = sorted(set(schema) - SUPPORTED_KEYWORDS)
    if unknown:
        raise SchemaError(f"schema at {_where(path)} uses unsupported keywords {unknown}")
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            raise SchemaError(f"$ref={ref!r}: only local '#/$defs/<name>' references")
        return _check(value, root["$defs"][ref.removeprefix("#/$defs/")], root, path)
    problems: list[str] = []
    where = _where(path)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(value, t) for t in types):
            return [f"{where}: {value!r} is not of type {' or '.join(types)}"]
    if "const" in schema and value != schema["const"]:
        problems.append(f"{where}: {value!r} must be {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        accepted = ", ".join(repr(v) for v in schema["enum"])
        problems.append(f"{where}: {value!r} is not one of {accepted}")
    if isinstance(value, str):
        problems += _check_string(value, schema, where)
    if "minimum" in schema and _is_type(value, "number") and value < schema["minimum"]:
        problems.append(f"{where}: {value!r} must be >= {schema['minimum']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            problems.append(f"{where}: needs at least {schema['minItems']} item(s)")
        if "items" in schema:
            for i, item in enumerate(value):
                problems += _check(item, schema["items"], root, f"{path}[{i}]")
    if isinstance(value, dict):
        problems += _check_object(value, schema, root, path)
    if "anyOf" in schema:
        options = [_check(value, option, root, path) for option in schema["anyOf"]]
        if all(options):
            detail = " | ".join("; ".join(o) for o in options)
            problems.append(f"{where}: matches none of the accepted forms ({detail})")
    return problems


def _check_string(value: str, schema: dict[str, Any], where: str) -> list[str]:
    problems = []
    if len(value) < schema.get("minLength", 0):
        problems.append(f"{where}: {value!r} is shorter than {schema['minLength']} characters")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        problems.append(f"{where}: {value!r} does not match {schema['pattern']!r}")
    if schema.get("format") == "date":
        try:
            dt.date.fromisoformat(value)
            ok = len(value) == 10
        except ValueError:
            ok = False
        if not ok:
            problems.append(f"{where}: {value!r} is not a YYYY-MM-DD date")
    elif "format" in schema:
        raise SchemaError(f"format={schema['format']!r}: only 'date' is checked")
    return problems


def _check_object(
    value: dict[str, Any], schema: dict[str, Any], root: dict[str, Any], path: str
) -> list[str]:
    problems = []
    prefix = f"{path}." if path else ""
    for key in schema.get("required", []):
        if key not in value:
            problems.append(f"{prefix}{key}: required field is missing")
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            problems += _check(item, properties[key], root, f"{prefix}{key}")
        elif extra is False:
            accepted = ", ".join(sorted(properties))
            problems.append(f"{prefix}{key}: unknown field; accepted: {accepted}")
        elif isinstance(extra, dict):
            problems += _check(item, extra, root, f"{prefix}{key}")
    return problems
