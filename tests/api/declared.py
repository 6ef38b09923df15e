"""What the served OpenAPI schema declares, as a client generated from it would check it.

Tests of the contract ask the same body two questions: does the schema call it valid
(``jsonschema``, Draft 2020-12, components and ``if/then`` rules resolved, as a generated
client or schemathesis reads them, plus the ``x-max-bytes`` extension), and does the server
accept it? Each must answer as the other does, in both directions (declared = enforced).
:func:`byte_bounds` lists the ``x-max-bytes`` bounds so a test can prove each one enforced.
"""
from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators

from novelforge_sessions.session_runtime import json_size

#: The extension's public name (``novelforge_sessions.api.schemas.X_MAX_BYTES``), as clients read it.
X_MAX_BYTES = "x-max-bytes"


def _max_bytes(validator: Any, limit: int, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    """``x-max-bytes`` as the schema describes it: a string's own UTF-8 bytes, any other value's
    compact JSON (what a client that honours the extension checks)."""
    size = len(instance.encode("utf-8", "surrogatepass")) if isinstance(instance, str) else json_size(instance)
    if size > limit:
        yield ValidationError(f"{size} bytes is over x-max-bytes {limit}")


#: Draft 2020-12 plus the extension: "declared valid" includes the declared byte bounds.
Declared = validators.extend(Draft202012Validator, {X_MAX_BYTES: _max_bytes})


@cache
def served() -> dict[str, Any]:
    """The schema as ``/api/openapi.json`` serves it (through JSON, as a client reads it)."""
    import json

    from novelforge_sessions.routers import api

    return json.loads(json.dumps(api.get_openapi_schema(), default=str))


def validator(component: str | None = None, *, schema: dict[str, Any] | None = None) -> Any:
    """A validator of one component (``GateIn``) or of an inline ``schema``, refs resolved."""
    root = {"components": served()["components"]}
    root.update(schema if schema is not None else {"$ref": f"#/components/schemas/{component}"})
    return Declared(root)


def declared_valid(component: str, body: Any) -> bool:
    return validator(component).is_valid(body)


def body_schema(method: str, path: str) -> dict[str, Any]:
    """An operation's request body schema (``path`` as the schema spells it: ``/api/v1/…``)."""
    return served()["paths"][path][method.lower()]["requestBody"]["content"]["application/json"]["schema"]


def byte_bounds() -> Iterator[tuple[str, int]]:
    """Every ``x-max-bytes`` the schema declares: (where, limit), ``where`` as
    ``Component.field`` (``Component`` alone for a bound on the whole object)."""
    def walk(node: Any, where: str) -> Iterator[tuple[str, int]]:
        if isinstance(node, dict):
            if X_MAX_BYTES in node:
                yield where, node[X_MAX_BYTES]
            for key, value in node.get("properties", {}).items():
                yield from walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for value in node:
                yield from walk(value, where)

    for name, component in served()["components"]["schemas"].items():
        yield from walk(component, name)
    for path, item in served()["paths"].items():
        for method, op in item.items():
            schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if "$ref" not in schema:  # an inline body (the verdict's)
                yield from walk(schema, f"{method.upper()} {path}")
