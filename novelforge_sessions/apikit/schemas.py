"""The API's generic schema kit, shared by every app's routers (``novelforge_sessions.api``,
``reviews.api``): JSON body parsing (``loads_json``), strict inputs (``Input``, ``Strict``),
storable-text and byte-bound declarations, pagination parameters, the error and page shapes.
The apps' own request and response schemas live with their routers."""
from __future__ import annotations

import json
import math
import sys
import types
import typing
from typing import Any, Generic, TypeVar

from ninja import Field, Query, Schema
from pydantic import ConfigDict, ModelWrapValidatorHandler, model_validator

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.errors import MalformedBody, ValidationFailed, from_rule_error

T = TypeVar("T")



#: Where a value holds text PostgreSQL cannot store (the pure core's rule, shared with the actions).
unstorable_text_at = rt.unstorable_text_at


#: JSON bodies nest at most this deep. json.loads itself gives up near 1,000 levels; a few hundred
#: still parse but then fail to re-encode (RecursionError: a 500) when stored or sized.
MAX_BODY_DEPTH = 100


def nested_deeper_than(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def refuse_unstorable_text(value: Any, *, where: str = "body") -> None:
    """The edge's copy of the actions' check (``session_runtime.check_storable_text``): every body
    and query string is refused here before it is parsed into a schema, naming the path."""
    try:
        rt.check_storable_text(value, where)
    except rt.RuntimeRuleError as exc:
        raise from_rule_error(exc) from None


class _Refused(ValueError):
    """Raised by the fast parse's hooks: the body holds a duplicate key or a number the service
    cannot store faithfully. ``loads_json`` then parses again, recording, to name the path."""


#: The largest finite double as an integer (``1.7976931348623157e308``, 309 digits): a JSON integer
#: beyond it is a number beyond a double's range, refused like ``1e999``.
_DOUBLE_MAX_INT = int(sys.float_info.max)
_DOUBLE_MAX_DIGITS = len(str(_DOUBLE_MAX_INT))
_NONZERO_DIGITS = frozenset("123456789")
_BOM = b"\xef\xbb\xbf"


def _unstorable_number(literal: str, value: float | None = None) -> bool:
    """A number literal the service would not store as written: non-finite (``NaN``,
    ``Infinity``, ``1e999``), an integer beyond a double's range (its digits are counted before
    any conversion, so Python's 4,300-digit limit never fires), or a non-zero literal that
    underflows to 0.0 (``1e-999``)."""
    if value is None:  # an integer literal (the scanner's grammar: an optional minus, digits, no leading zero)
        if not literal.lstrip("-").isdigit():
            return True
        digits = len(literal) - literal.startswith("-")
        return digits > _DOUBLE_MAX_DIGITS or (digits == _DOUBLE_MAX_DIGITS and abs(int(literal)) > _DOUBLE_MAX_INT)
    if not math.isfinite(value):
        return True
    return value == 0.0 and not _NONZERO_DIGITS.isdisjoint(literal.lower().partition("e")[0])


def _fast_int(literal: str) -> int:
    if len(literal) < _DOUBLE_MAX_DIGITS or not _unstorable_number(literal):
        return int(literal)
    raise _Refused(literal)


def _fast_float(literal: str) -> float:
    value = float(literal)
    if value and value - value == 0.0:  # finite and non-zero: the common case, no more checks
        return value
    if _unstorable_number(literal, value):
        raise _Refused(literal)
    return value


def _fast_constant(literal: str) -> Any:
    raise _Refused(literal)


def _fast_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Refused("duplicate key")
    return obj


#: One decoder for every body (``json.loads`` with hooks builds a decoder and its scanner per call).
_DECODER = json.JSONDecoder(
    object_pairs_hook=_fast_object, parse_float=_fast_float, parse_int=_fast_int, parse_constant=_fast_constant,
)


class _Mark:
    """Stands where the JSON text had a refused number, so its path can be named."""

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


_printable = rt.printable_path


def _refusal(text: str) -> ValidationFailed:
    """The typed refusal of a body the fast parse refused: parsed again, recording where.

    Only bad bodies pay for this. Returns the first refusal in document order; raises
    ``ValueError`` if the body is also malformed (a syntax error is the more fundamental one).
    """
    duplicates: dict[int, tuple[dict[str, Any], str]] = {}  # id → (the object, kept alive; its duplicate key)

    def obj(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found = dict(pairs)
        if len(found) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    duplicates[id(found)] = (found, key)
                    break
                seen.add(key)
        return found

    def integer(literal: str) -> int | _Mark:
        return _Mark(literal) if _unstorable_number(literal) else int(literal)

    def number(literal: str) -> float | _Mark:
        value = float(literal)
        return _Mark(literal) if _unstorable_number(literal, value) else value

    data = json.JSONDecoder(object_pairs_hook=obj, parse_int=integer, parse_float=number, parse_constant=_Mark).decode(text)
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, _Mark):
            field = _printable(path or "body")
            # NaN, ±Infinity, 1e999, 10**400, 1e-999: Python's json reads them; none is stored as written.
            return ValidationFailed(
                f"{field}: numbers must be finite and stored as written (NaN, Infinity, numbers beyond a double's "
                "range such as 1e999 or a 310-digit integer, and non-zero numbers that round to 0 such as 1e-999 "
                "are refused)", field=field, value=item.literal[:40],
            )
        if isinstance(item, dict):
            if id(item) in duplicates:
                key = duplicates[id(item)][1]
                field = _printable(f"{path}.{key}" if path else key)
                return ValidationFailed(
                    f"{field}: duplicate key {_printable(key)[:80]!r} (the keys of a JSON object must be unique)",
                    field=field, key=_printable(key)[:80],
                )
            stack.extend(reversed([(f"{path}.{key}" if path else str(key), child) for key, child in item.items()]))
        elif isinstance(item, list):
            stack.extend(reversed([(f"{path}[{i}]", child) for i, child in enumerate(item)]))
    return ValidationFailed("the body holds a number or key that cannot be stored as written", field="body")


def loads_json(raw: bytes | str) -> Any:
    """Parse a JSON body as JSON (RFC 8259) defines it: the one parser of every body and paste.

    Bytes must be UTF-8 without a byte order mark (RFC 8259 §8.1; ``json.loads`` would guess
    UTF-16 or UTF-32 and skip nothing): else 400 ``malformed_body``. Python's json accepts
    ``NaN``, ``Infinity`` and ``-Infinity``, reads ``1e999`` as an infinite float, ``1e-999``
    as 0.0 and integers of any length up to its 4,300-digit limit (then a ``ValueError`` that
    looks like malformed JSON), and keeps the last of duplicate keys: each is refused here with
    422 ``validation_error`` naming the field's path (``_unstorable_number``, ``_fast_object``).
    Malformed JSON raises ``ValueError`` (or ``RecursionError``) as ``json.loads`` does.
    """
    if isinstance(raw, str):
        text = raw
    else:
        if raw[:3] == _BOM:
            raise MalformedBody("the request body starts with a byte order mark: JSON is UTF-8 without one (RFC 8259 §8.1)")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedBody("the request body is not UTF-8 (RFC 8259 §8.1)", offset=exc.start) from None
    try:
        return _DECODER.decode(text)
    except _Refused:
        raise _refusal(text) from None


class Input(Schema):
    """Every JSON body, validated as the JSON object it is.

    Replaces (same name) ninja's root validator, which wraps the input in a ``DjangoGetter`` for
    reading ORM objects: that wrapper hides the keys a model does not declare, so an
    ``extra="allow"`` body (a checkpoint) lost its unknown keys before the pure core could refuse
    them. Strings must be storable; the refusal is a ServiceError (pydantic lets it through),
    so the 422 names the exact path, as the actions' own refusals do.
    """

    @model_validator(mode="wrap")
    @classmethod
    def _run_root_validator(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        refuse_unstorable_text(data)
        return handler(data)


class Strict(Input):
    """Inputs refuse unknown fields: a typo is an error, not a silently ignored value. And they
    take JSON types as the schema states them: `true` or `"7"` is not an integer id, `"false"`
    is not a boolean (pydantic's lax coercion would accept both behind the schema's back).
    A JSON number with no fractional part (``7.0``) *is* an integer to JSON Schema, so an
    integer field takes it as that integer; ``7.5`` is still refused."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=lambda schema, cls: _declare(schema, cls))

    @model_validator(mode="before")
    @classmethod
    def _integral_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = _integer_fields(cls)
        fixed = None
        for name in fields.intersection(data):
            value = data[name]
            if type(value) is float and value.is_integer():
                fixed = fixed or dict(data)
                fixed[name] = int(value)
            elif isinstance(value, list) and any(type(v) is float and v.is_integer() for v in value):
                fixed = fixed or dict(data)
                fixed[name] = [int(v) if type(v) is float and v.is_integer() else v for v in value]
        return fixed if fixed is not None else data


#: Text PostgreSQL can store: no U+0000 (``refuse_unstorable_text``), declared on every string field.
STORABLE_TEXT = r"^[^\u0000]*$"
#: Storable text that is not blank: at least one character that is not whitespace. Declared where
#: the core strips a value and refuses what is left empty (names, labels, notes): ``minLength``
#: alone would call ``"   "`` valid.
NON_BLANK_TEXT = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"
#: An OpenAPI extension for the byte bounds JSON Schema cannot count: the value's size in UTF-8
#: bytes — of the text itself for a string, of its compact JSON (``session_runtime.json_size``: no
#: spaces, non-ASCII written as itself) for anything else. Over it: 422 naming the field.
X_MAX_BYTES = "x-max-bytes"
#: On every request body (``novelforge_sessions.apikit.base._Api``): the whole body's bound, in bytes as sent.
X_MAX_BODY_BYTES = "x-max-body-bytes"


def max_bytes(limit: int, **extra: Any) -> dict[str, Any]:
    """``json_schema_extra`` of a field the core bounds in bytes (``X_MAX_BYTES``); ``_declare``
    states the bound in the field's description too."""
    return {X_MAX_BYTES: limit, **extra}


def bytes_doc(limit: int) -> str:
    """The sentence every byte-bounded field's description carries."""
    return (f"at most {limit} bytes as UTF-8 (`x-max-bytes`; a string's own bytes, any other value's compact JSON): "
            "over it, 422 naming the field")


#: Any JSON value whose strings and keys are storable text, at any depth: the schema of every
#: free-form object or list of an input (cursor, params, metadata…). Added to the OpenAPI
#: components by ``novelforge_sessions.apikit.base._Api``.
STORABLE_JSON_REF = "#/components/schemas/StorableJson"
#: Stands for that reference while pydantic builds a model's schema (pydantic resolves every
#: ``$ref`` it sees against its own definitions); ``_Api`` swaps it for the ``$ref``.
STORABLE_JSON_MARK = "x-storable-json"
STORABLE_JSON: dict[str, Any] = {
    "description": "any JSON value; no string or key contains U+0000 (PostgreSQL cannot store it)",
    "anyOf": [
        {"type": "string", "pattern": STORABLE_TEXT},
        {"type": "number"}, {"type": "boolean"}, {"type": "null"},
        {"type": "array", "items": {"$ref": STORABLE_JSON_REF}},
        {"type": "object", "propertyNames": {"pattern": STORABLE_TEXT}, "additionalProperties": {"$ref": STORABLE_JSON_REF}},
    ],
}


def _declare(schema: dict[str, Any], model: type) -> None:
    """What the schema says beyond pydantic's own: storable text on every string property, and
    the model's cross-field rules (``json_schema_rules``: if/then, required-with)."""
    def storable(node: dict[str, Any]) -> None:
        if node.get("type") == "string" and "pattern" not in node and "enum" not in node and "const" not in node:
            node["pattern"] = STORABLE_TEXT
        for key in ("anyOf", "oneOf"):
            for option in node.get(key, []):
                storable(option)
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            storable(node["items"])

    def free_json(node: dict[str, Any]) -> None:
        # dict[str, Any] / list[Any]: any JSON, but storable all the way down (StorableJson)
        if node.get("type") == "object" and node.get("additionalProperties") is True and "properties" not in node:
            node["propertyNames"] = {"pattern": STORABLE_TEXT}
            node["additionalProperties"] = {STORABLE_JSON_MARK: True}
        elif node.get("type") == "array" and node.get("items") in ({}, None):
            node["items"] = {STORABLE_JSON_MARK: True}
        for key in ("anyOf", "oneOf"):
            for option in node.get(key, []):
                free_json(option)

    def state_bytes(node: dict[str, Any]) -> None:
        # A byte bound is stated in words as well as in the extension most tools ignore.
        limit = node.get(X_MAX_BYTES)
        if limit is not None and bytes_doc(limit) not in node.get("description", ""):
            node["description"] = "; ".join(filter(None, [node.get("description"), bytes_doc(limit)]))

    for prop in schema.get("properties", {}).values():
        storable(prop)
        free_json(prop)
        state_bytes(prop)
    schema.update(getattr(model, "json_schema_rules", {}))


_INTEGER_FIELDS: dict[type, frozenset[str]] = {}


def _integer_fields(model: type) -> frozenset[str]:
    """The model's fields typed int, int | None or list[int] (never bool: it is not an int here).
    A field that takes a float too (``int | float | str``: a graph channel version) keeps ``7.0``
    as the number it was sent as: it is stored as written."""
    found = _INTEGER_FIELDS.get(model)
    if found is None:
        names = set()
        for name, info in model.model_fields.items():
            ann = info.annotation
            options = typing.get_args(ann) if typing.get_origin(ann) in (typing.Union, types.UnionType) else (ann,)
            if float in options:
                continue
            if any(a is int or (typing.get_origin(a) is list and typing.get_args(a) == (int,)) for a in options):
                names.add(name)
        found = _INTEGER_FIELDS[model] = frozenset(names)
    return found


#: Every list's page size (``?limit=``): 1..MAX_PAGE. Out of range is 422 ``validation_error``
#: naming ``limit`` (pydantic's bound, like any other query parameter), never clamped.
MAX_PAGE = 200
LIMIT_DOC = f"page size, 1..{MAX_PAGE} (out of range: 422 `validation_error`, field `limit`)"


def page_limit(default: int = 50) -> Any:
    """The ``limit`` query parameter of a list route, declared and enforced as 1..MAX_PAGE."""
    return Query(default, ge=1, le=MAX_PAGE, description=LIMIT_DOC)


def page_limit_field(default: int = 50) -> Any:
    """The same, as a field of a query schema (``Query[SessionFilters]``)."""
    return Field(default, ge=1, le=MAX_PAGE, description=LIMIT_DOC)


#: Every list's cursor (``?after=``) but the event log's: what it does and does not promise.
AFTER_DOC = (
    "keyset cursor: the previous page's `next_after`; items with a larger id, in id order. Ids are given "
    "when a row is inserted, not when it commits, so a row whose transaction commits after one with a "
    "larger id can appear below a cursor already passed and be skipped by a reader following new rows: "
    "a walk of rows that are no longer being created is complete, a poll for new ones is not. To follow "
    "new objects without gaps, read `GET /events?after=` (every creation is an event; its ids are "
    "visible in commit order)"
)

def page_after(description: str = AFTER_DOC) -> Any:
    """The ``after`` query parameter of a list route (keyset on the primary key)."""
    return Query(None, description=description)


def page_after_field() -> Any:
    """The same, as a field of a query schema (``Query[SessionFilters]``)."""
    return Field(None, description=AFTER_DOC)


class ErrorBody(Schema):
    code: str
    message: str
    details: dict[str, Any] = {}


class ErrorOut(Schema):
    error: ErrorBody


class Page(Schema, Generic[T]):
    items: list[T]
    next_after: int | None = Field(None, description="pass as `after` to get the next page; null at the end")


def idempotency_key_field(scope: str) -> Any:
    """The optional ``idempotency_key`` of a write that creates something (docs/agents.md#idempotency-keys):
    declared with its limit and pattern, scoped to ``scope`` (the parent in the path)."""
    return Field(
        None, max_length=200, json_schema_extra={"pattern": rt.IDEMPOTENCY_KEY_PATTERN},
        description=(
            f"makes the write safe to retry (scoped to the {scope}): the same key and body replay the first answer "
            "(same status, the same object, nothing written again); the same key with another body is 409 "
            "idempotency_key_reused"
        ),
    )
