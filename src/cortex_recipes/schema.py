"""recipe.yaml and the model catalog checked against their JSON Schema (draft 2020-12).

The repository's schemas (``recipes/recipe.schema.json``, ``model-catalog/schema.json``) are
plain JSON Schema documents; ``jsonschema`` checks them, with its format checker on (so
``format: date`` is enforced as ``YYYY-MM-DD``). This module only turns ``jsonschema``'s
errors into ``field: problem`` lines that name the field as a JSON path (``models[0].role``),
the value and what is accepted. A schema that is not itself valid JSON Schema raises
:class:`SchemaError` before anything is checked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError, ValidationError

__all__ = ["SchemaError", "validate"]

_FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


def validate(value: Any, schema: dict[str, Any], root: dict[str, Any] | None = None) -> list[str]:
    """Every way ``value`` breaks ``schema``, as ``field: problem`` strings (empty if none).

    ``root`` is the document ``schema``'s local ``#/$defs/...`` references point into, when
    ``schema`` is a part of it (``{"$ref": "#/$defs/profile"}``).
    """
    if root is not None:
        schema = {"$defs": root.get("$defs", {}), **schema}
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema, format_checker=_FORMATS)
    return _unique(line for error in validator.iter_errors(value) for line in _lines(error))


def _unique(lines: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(lines))


def _path(parts: Sequence[str | int]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def _where(parts: Sequence[str | int]) -> str:
    return _path(parts) or "(top level)"


def _lines(error: ValidationError) -> list[str]:
    parts = list(error.absolute_path)
    where, value, expected = _where(parts), error.instance, error.validator_value
    match error.validator:
        case "required":
            return [
                f"{_path([*parts, key])}: required field is missing"
                for key in expected
                if key not in value
            ]
        case "additionalProperties":
            properties = error.schema.get("properties", {})
            patterns = list(error.schema.get("patternProperties", {}))
            accepted = ", ".join([*sorted(properties), *(f"/{p}/" for p in patterns)])
            return [
                f"{_path([*parts, key])}: unknown field; accepted: {accepted}"
                for key in value
                if key not in properties and not any(re.search(p, key) for p in patterns)
            ]
        case "type":
            types = expected if isinstance(expected, list) else [expected]
            return [f"{where}: {value!r} is not of type {' or '.join(types)}"]
        case "enum":
            accepted = ", ".join(repr(v) for v in expected)
            return [f"{where}: {value!r} is not one of {accepted}"]
        case "const":
            return [f"{where}: {value!r} must be {expected!r}"]
        case "pattern":
            return [f"{where}: {value!r} does not match {expected!r}"]
        case "minLength":
            return [f"{where}: {value!r} is shorter than {expected} characters"]
        case "minimum":
            return [f"{where}: {value!r} must be >= {expected}"]
        case "minItems":
            return [f"{where}: needs at least {expected} item(s)"]
        case "format" if expected == "date":
            return [f"{where}: {value!r} is not a YYYY-MM-DD date"]
        case "anyOf" | "oneOf":
            options: dict[int, list[str]] = {}
            for sub in error.context or []:
                options.setdefault(sub.relative_schema_path[0], []).extend(_lines(sub))
            detail = " | ".join("; ".join(_unique(o)) for _, o in sorted(options.items()))
            return [f"{where}: matches none of the accepted forms ({detail})"]
    return [f"{where}: {value!r}: {error.message}"]
