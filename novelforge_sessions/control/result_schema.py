"""Handoff result schemas as JSON Schema, checked by ``jsonschema`` (pure: no Django, no I/O).

A handoff freezes the shape of the result it expects (part of its job fingerprint). Two
spellings are accepted in ``result_schema``:

* the short form, a map of required result keys to JSON type names
  (``{"verdict": "string", "score": "integer"}``; ``"any"`` accepts any value), which this
  module translates into the equivalent JSON Schema object; and
* a full JSON Schema (Draft 2020-12), recognised by its ``"$schema"`` key, for everything the
  short form cannot say (enums, ranges, nested objects, optional keys).

Either way a result is validated by ``jsonschema``'s Draft 2020-12 validator, and each error
becomes one ``{"path": "result.<json path>", "message": …}`` item of the typed 422 that names
where the result went wrong.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

#: JSON type names of the short form.
SHORT_TYPES = frozenset({"string", "integer", "number", "boolean", "object", "array", "any"})
DIALECT = "https://json-schema.org/draft/2020-12/schema"


class ResultSchemaError(ValueError):
    """The result schema itself is malformed; ``field`` names where."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def is_full_schema(result_schema: Mapping[str, Any]) -> bool:
    return "$schema" in result_schema


def as_json_schema(result_schema: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON Schema a result must satisfy (raises ``ResultSchemaError`` when malformed)."""
    if is_full_schema(result_schema):
        if result_schema["$schema"] != DIALECT:
            raise ResultSchemaError(f"$schema must be {DIALECT}", "result_schema.$schema")
        try:
            Draft202012Validator.check_schema(result_schema)
        except SchemaError as exc:
            where = "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in exc.path)
            raise ResultSchemaError(f"not a valid JSON Schema: {exc.message}", f"result_schema{where}") from None
        return dict(result_schema)
    properties: dict[str, Any] = {}
    for key, kind in result_schema.items():
        if not isinstance(kind, str) or kind not in SHORT_TYPES:
            raise ResultSchemaError(f"result_schema[{key!r}] must be one of {sorted(SHORT_TYPES)}", f"result_schema.{key}")
        properties[key] = {} if kind == "any" else {"type": kind}
    return {"type": "object", "required": sorted(properties), "properties": properties}


def _path(parts: Any) -> str:
    return "result" + "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in parts)


@lru_cache(maxsize=256)
def _validator(frozen_schema: str) -> Draft202012Validator:
    """One compiled validator per distinct schema (handoffs of one kind share theirs)."""
    return Draft202012Validator(as_json_schema(json.loads(frozen_schema)))


def result_problems(result_schema: Mapping[str, Any], result: Any) -> list[dict[str, str]]:
    """Every way ``result`` fails the schema, as ``{"path", "message"}``, in a stable order."""
    short = not is_full_schema(result_schema)
    validator = _validator(json.dumps(result_schema, sort_keys=True))
    problems: list[dict[str, str]] = []
    for error in validator.iter_errors(result):
        if error.validator == "required":
            present = error.instance if isinstance(error.instance, Mapping) else {}
            for name in error.validator_value:
                if name not in present:
                    message = "required by the job's result schema" if short else "is a required property"
                    problems.append({"path": _path([*error.absolute_path, name]), "message": message})
        elif error.validator == "type" and short:
            problems.append({"path": _path(error.absolute_path), "message": f"must be of type {error.validator_value}"})
        else:
            problems.append({"path": _path(error.absolute_path), "message": error.message[:300]})
    unique = {(p["path"], p["message"]): p for p in problems}
    return [unique[k] for k in sorted(unique)]
