"""Request and response schemas of the agent API (pydantic, via django-ninja)."""
from __future__ import annotations

import json
import math
import sys
import types
import typing
from datetime import datetime
from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar

from django.conf import settings
from ninja import Field, Query, Schema
from pydantic import ConfigDict, ModelWrapValidatorHandler, WithJsonSchema, model_validator

from novelforge_sessions import event_types as ev
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.errors import MalformedBody, ValidationFailed, from_rule_error

T = TypeVar("T")

StatusName = Literal[tuple(s.value for s in rt.SessionStatus)]  # type: ignore[valid-type]
RunStateName = Literal[tuple(s.value for s in rt.RunState)]  # type: ignore[valid-type]
HandoffStateName = Literal[tuple(s.value for s in lc.HandoffState)]  # type: ignore[valid-type]
IntentStateName = Literal[tuple(s.value for s in lc.IntentState)]  # type: ignore[valid-type]
Role = Literal[tuple(r.value for r in rt.SessionRole)]  # type: ignore[valid-type]
Memory = Literal[tuple(m.value for m in rt.MemoryPolicy)]  # type: ignore[valid-type]
Boundary = Literal[tuple(b.value for b in rt.CheckpointBoundary)]  # type: ignore[valid-type]
#: The catalog's event type names (``GET /events?type=``): an unknown type is a 422 naming ``type``.
EventTypeName = Literal[tuple(sorted(ev.CATALOG))]  # type: ignore[valid-type]
#: Ending a run (``lifecycles.RUN_OUTCOMES``): the outcome, and the statuses the session may go to.
RunOutcome = Literal[tuple(o.value for o in lc.RUN_OUTCOMES)]  # type: ignore[valid-type]
RunEndStatus = Literal[tuple(dict.fromkeys(  # type: ignore[valid-type]
    s.value for default, allowed in lc.RUN_OUTCOMES.values() for s in (default, *sorted(allowed, key=list(rt.SessionStatus).index))
))]


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
#: On every request body (``novelforge_sessions.api._Api``): the whole body's bound, in bytes as sent.
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
#: components by ``novelforge_sessions.api._Api``.
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


#: The pure core's short names (``session_runtime.NAME_PATTERN``): task modes, runtime families,
#: capabilities, role extensions, resume policies.
NAME_PATTERN = rt.NAME_PATTERN
#: Declared in the schema only (``json_schema_extra``): the pure core enforces them, with its own
#: messages and field names, so clients generated from the schema send what the core accepts.
SHORT_NAME = {"pattern": NAME_PATTERN}
SHORT_NAMES = {"items": {"type": "string", "pattern": NAME_PATTERN, "maxLength": 64}}
#: A list of capabilities (declared, required, or asked for): at most ``rt.MAX_CAPABILITIES``.
CAPABILITIES = {**SHORT_NAMES, "maxItems": rt.MAX_CAPABILITIES}
#: A short name as a type (query parameters): validated as a plain string, declared with the pattern.
ShortNameDeclared = Annotated[str, WithJsonSchema(SHORT_NAMES["items"])]
#: A JSON object with at least one key (a cursor names the workflow step).
NON_EMPTY_OBJECT = {"minProperties": 1}


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
#: The event log's cursor: gap-free (``events.visible``: ids are visible in commit order).
EVENTS_AFTER_DOC = (
    "keyset cursor: the previous page's `next_after` (or the last event id you have); events with a "
    "larger id, oldest first. Gap-free: an event is listed only once every event with a smaller id has "
    "committed or rolled back, so following `next_after` never skips one, also while events are written"
)

#: A transcript's cursor: entries are numbered under the session's lock, so in commit order.
TRANSCRIPT_AFTER_DOC = (
    "the previous page's `next_after` (a `seq`); entries with a larger `seq`, in order. Gap-free: each "
    "entry's `seq` is given under its session's lock, so entries become visible in `seq` order"
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


# ---- projects & artifacts -------------------------------------------------------------
class ProjectOut(Schema):
    id: int
    slug: str
    name: str
    authority_version: int
    lock_fingerprint: str
    framework_version: str
    requires_write_approval: bool


class ArtifactIn(Strict):
    name: str = Field(..., max_length=200, json_schema_extra={"minLength": 1, "pattern": NON_BLANK_TEXT},
                      description="1–200 characters, not all of them whitespace")
    kind: str = Field("document", max_length=64)
    content: str


class ArtifactVersionIn(Strict):
    content: str


class ArtifactVersionOut(Schema):
    id: int
    artifact_id: int
    number: int
    fingerprint: str
    created_at: datetime


class ArtifactVersionContentOut(ArtifactVersionOut):
    content: str


class ArtifactOut(Schema):
    id: int
    name: str
    kind: str
    current_version_id: int | None
    current_fingerprint: str | None = None
    created_at: datetime


# ---- sessions ---------------------------------------------------------------------------
#: Generation fencing (docs/api.md#generation-fencing): the runtime a write comes from.
RUNTIME_ID_DOC = (
    "the runtime this write comes from (the id create-with-runtime, attach and resume return): refused "
    "409 `stale_runtime` unless it is the session's live runtime. Token writes to a session that has had more "
    "than one generation must name it (409 `runtime_required`)"
)
class RuntimeIn(Strict):
    runtime_family: str = Field(..., max_length=64, json_schema_extra=SHORT_NAME, examples=["claude-code"])
    capabilities: list[str] = Field(default_factory=list, json_schema_extra=CAPABILITIES, examples=[["draft", "review"]])
    provider_metadata: dict[str, Any] | None = Field(None, description="metadata only; never a key, never authority",
                                                     json_schema_extra=max_bytes(rt.MAX_METADATA_BYTES))
    lease_seconds: int | None = Field(None, ge=1, le=3600)


class SessionIn(Strict):
    role: Role
    role_extension: str = Field("", max_length=64, description="required with role `other`, forbidden otherwise")
    memory_policy: Memory
    task_mode: str = Field(..., max_length=64, json_schema_extra=SHORT_NAME, examples=["drafting"])
    runtime_family: str = Field(..., max_length=64, json_schema_extra=SHORT_NAME, examples=["claude-code"])
    provider_metadata: dict[str, Any] | None = Field(None, description="provider thread ids etc.: metadata only",
                                                     json_schema_extra=max_bytes(rt.MAX_METADATA_BYTES))
    runtime: RuntimeIn | None = Field(None, description="attach runtime generation 1 in the same transaction")

    # role `other` needs a role_extension (a short name); every other role takes none.
    json_schema_rules: ClassVar[dict[str, Any]] = {
        "if": {"properties": {"role": {"const": "other"}}, "required": ["role"]},
        "then": {"properties": {"role_extension": {"pattern": NAME_PATTERN}}, "required": ["role_extension"]},
        "else": {"properties": {"role_extension": {"const": ""}}},
    }


class SessionOut(Schema):
    id: int
    project_id: int
    role: str
    role_extension: str
    memory_policy: str
    task_mode: str
    runtime_family: str
    provider_metadata: dict[str, Any]
    status: str
    status_reason: str
    version: int
    generation: int
    run_count: int
    transcript_length: int
    open_conflict: str
    created_at: datetime
    updated_at: datetime
    allowed_transitions: list[str]

    @staticmethod
    def resolve_allowed_transitions(obj: Any) -> list[str]:
        return sorted(t.value for t in rt.allowed_targets(obj.status))


class SessionCreatedOut(SessionOut):
    runtime_id: int | None = Field(
        None, description="runtime generation 1's id when created with `runtime`: name it as `runtime_id` in its writes"
    )

    @staticmethod
    def resolve_runtime_id(obj: Any) -> int | None:
        return getattr(obj, "created_runtime_id", None)


class TransitionIn(Strict):
    to: StatusName
    reason: str = Field("", max_length=200)
    expected_version: int | None = Field(None, description="refuse with version_conflict if the session moved on")
    runtime_id: int | None = Field(None, ge=1, description=RUNTIME_ID_DOC)


class ReasonIn(Strict):
    reason: str = Field("", max_length=200)


class CloseIn(Strict):
    reason: str = Field("", max_length=64, description="recorded as the closed runtime's end reason")
    runtime_id: int | None = Field(None, ge=1, description=RUNTIME_ID_DOC)


class AbortIn(ReasonIn):
    runtime_id: int | None = Field(None, ge=1, description=RUNTIME_ID_DOC)


class CloseOut(Schema):
    session: SessionOut
    already_closed: bool
    closed_runtime_id: int | None


class AbortOut(Schema):
    session: SessionOut
    run_id: int
    already_requested: bool


class ResumeIn(Strict):
    runtime: RuntimeIn
    checkpoint_id: int | None = Field(None, description="default: the session's latest checkpoint")
    dry_run: bool = False


class ResumeStepOut(Schema):
    step: str
    ok: bool
    detail: str
    data: dict[str, Any]
    repair: str | None


class ResumeReportOut(Schema):
    ok: bool
    dry_run: bool
    session_id: int
    checkpoint_id: int | None
    steps: list[ResumeStepOut]
    repairs: list[str]
    generation: int | None
    runtime_id: int | None
    run_id: int | None


# ---- runtimes -----------------------------------------------------------------------------
class RuntimeOut(Schema):
    id: int
    session_id: int
    generation: int
    runtime_family: str
    capabilities: list[str]
    provider_metadata: dict[str, Any]
    state: str
    lease_seconds: int
    lease_expires_at: datetime
    heartbeat_at: datetime
    attached_at: datetime
    ended_at: datetime | None
    end_reason: str
    live: bool = Field(..., description="live by its lease: `state` is `live` and the lease has not run out")
    lease_expired: bool = Field(
        ..., description="`state` still says `live` but the lease ran out: the runtime is gone (not live), "
        "recorded `lost` by the next reconciler pass or by the next resume/attach/forget",
    )


class HeartbeatIn(Strict):
    lease_seconds: int | None = Field(None, ge=1, le=3600)


class HeartbeatOut(Schema):
    runtime_id: int
    session_id: int
    lease_expires_at: datetime
    open_run_id: int | None
    abort_requested: bool = Field(..., description="the open run was asked to stop: end it with outcome `aborted`")


# ---- runs & checkpoints -------------------------------------------------------------------
class RunIn(Strict):
    task_mode: str | None = Field(None, max_length=64, json_schema_extra=SHORT_NAME)
    target: str = Field("", max_length=200)
    cursor: dict[str, Any] | None = Field(None, json_schema_extra=max_bytes(rt.MAX_CURSOR_BYTES, **NON_EMPTY_OBJECT))
    frozen_inputs: list[Any] | None = Field(None, json_schema_extra=max_bytes(rt.MAX_FROZEN_INPUTS_BYTES))
    runtime_id: int | None = Field(None, ge=1, description=RUNTIME_ID_DOC)


class RunOut(Schema):
    id: int
    session_id: int
    seq: int
    generation: int
    task_mode: str
    target: str
    cursor: dict[str, Any]
    frozen_inputs: list[Any]
    state: str
    end_reason: str
    abort_requested_at: datetime | None
    resumed_from_id: int | None
    checkpoint_count: int
    started_at: datetime
    ended_at: datetime | None


RUN_RUNTIME_ID_DOC = "optional: the runtime this write comes from; refused 409 `stale_runtime` unless it is the session's live runtime"


class CursorIn(Strict):
    cursor: dict[str, Any] = Field(..., json_schema_extra=max_bytes(rt.MAX_CURSOR_BYTES, **NON_EMPTY_OBJECT))
    runtime_id: int | None = Field(None, ge=1, description=RUN_RUNTIME_ID_DOC)


class RunEndIn(Strict):
    outcome: RunOutcome
    session_status: RunEndStatus | None = None
    reason: str = Field("", max_length=200)
    runtime_id: int | None = Field(None, ge=1, description=RUN_RUNTIME_ID_DOC)

    # Each outcome lets the session go only to some statuses (lifecycles.RUN_OUTCOMES).
    json_schema_rules: ClassVar[dict[str, Any]] = {"allOf": [
        {
            "if": {"properties": {"outcome": {"const": outcome.value}}, "required": ["outcome"]},
            "then": {"properties": {"session_status": {"enum": [
                *[s.value for s in rt.SessionStatus if s == default or s in allowed], None,
            ]}}},
        }
        for outcome, (default, allowed) in lc.RUN_OUTCOMES.items()
    ]}


class ArtifactRefIn(Strict):
    artifact_id: int
    fingerprint: str = Field(..., description="sha256:<64 hex> of the cited artifact version",
                             json_schema_extra={"pattern": rt.FINGERPRINT_PATTERN})


#: ``authority`` of a checkpoint: the keys and types ``rt.validate_authority_refs`` takes.
AUTHORITY_REFS: dict[str, Any] = {
    "anyOf": [
        {"type": "object", "additionalProperties": False, "properties": {
            "authority_version": {"type": "integer"},
            "lock_fingerprint": {"type": "string", "pattern": STORABLE_TEXT},
            "framework_version": {"type": "string", "pattern": STORABLE_TEXT},
        }},
        {"type": "null"},
    ],
}
assert set(AUTHORITY_REFS["anyOf"][0]["properties"]) == set(rt.AUTHORITY_REF_TYPES)


#: A checkpoint is bounded as a whole (``rt.validate_checkpoint``: 422 ``checkpoint_not_bounded``).
CHECKPOINT_BYTES_DOC = (
    f"The whole checkpoint is at most {settings.CHECKPOINT_MAX_BYTES} bytes as compact UTF-8 JSON (`x-max-bytes`; "
    "the server's CHECKPOINT_MAX_BYTES): over it, 422 `checkpoint_not_bounded`."
)


class _CheckpointBody(Input):
    """A checkpoint's fields (``CheckpointIn`` and a batch's ``BatchCheckpointIn``)."""

    boundary: Boundary
    cursor: dict[str, Any] = Field(..., json_schema_extra=NON_EMPTY_OBJECT)
    artifacts: list[ArtifactRefIn] = Field(
        default_factory=list,
        description="the artifact versions the checkpoint froze: each a version of this project within your reach "
                    "(else 422 unknown_artifact_version, the same answer as for a version that does not exist)",
    )
    authority: Annotated[dict[str, Any] | None, WithJsonSchema(AUTHORITY_REFS)] = Field(
        None, description="the refs you froze against (any of them); each must equal the project's current one",
    )
    pending: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "typed references to what the run waits on, resolved when written (422 naming the field when "
            'unknown or unresolvable): "handoffs": [logical id | {"logical_id"} | {"handoff_id"}] of this '
            'session, "gates": [{"gate_id"}] review gates of this session. Stored normalised; resume '
            "revalidates each."
        ),
        examples=[{"handoffs": ["chapter-3/continuity-check"], "gates": [{"gate_id": 12}]}],
    )
    approvals: list[Any] = Field(
        default_factory=list,
        description=(
            'write intents the cursor is about to execute: [{"write_intent_id", "approval_id"?}] of this '
            "project, resolved when written (the standing approval and before-state are recorded); resume fails "
            "the approvals step when an approval was revoked or went stale, or the before-state moved."
        ),
        examples=[[{"write_intent_id": 7}]],
    )
    resume_policy: str = Field("revalidate", json_schema_extra=SHORT_NAME)

    # Unknown keys reach the pure core (extra="allow"), which checks them for transcript content
    # and then refuses them: so the schema declares none.
    model_config = ConfigDict(extra="allow", json_schema_extra={
        "additionalProperties": False, X_MAX_BYTES: settings.CHECKPOINT_MAX_BYTES,
    })


class CheckpointIn(_CheckpointBody):
    __doc__ = "Validated by the pure core; unknown keys are checked for transcript content, then refused. " \
        + CHECKPOINT_BYTES_DOC

    idempotency_key: str | None = Field(
        None, max_length=200, json_schema_extra={"pattern": rt.IDEMPOTENCY_KEY_PATTERN},
        description=(
            "makes the write safe to retry (single writes only; refused inside a batch): the same key and body "
            "replay the first checkpoint (200), the same key with another body is 409 idempotency_key_reused"
        ),
    )


class BatchCheckpointIn(_CheckpointBody):
    __doc__ = "A checkpoint inside a batch: the single write's fields but `idempotency_key` (the batch is one " \
        "transaction; retry it whole). " + CHECKPOINT_BYTES_DOC


class BatchCheckpointItem(Strict):
    kind: Literal["checkpoint"]
    checkpoint: BatchCheckpointIn


class BatchCursorItem(Strict):
    kind: Literal["cursor"]
    cursor: dict[str, Any] = Field(..., json_schema_extra=max_bytes(rt.MAX_CURSOR_BYTES, **NON_EMPTY_OBJECT))


class BatchIn(Strict):
    """Several durable steps of one run, written in one transaction, all or nothing."""

    items: list[Annotated[BatchCheckpointItem | BatchCursorItem, Field(discriminator="kind")]] = Field(
        min_length=1, max_length=rt.MAX_BATCH_ITEMS,
        description=f"1..{rt.MAX_BATCH_ITEMS} steps, applied in order: checkpoints (numbered consecutively) and cursor advances",
    )


class CheckpointOut(Schema):
    id: int
    session_id: int
    run_id: int
    seq: int
    boundary: str
    cursor: dict[str, Any]
    artifacts: list[dict[str, Any]] = Field(
        ..., description="as given, each with head_version_id: its artifact's current version when the checkpoint was "
                         "written (resume fails a ref only if that head moved since, other than to the cited version "
                         "or by a write intent the checkpoint cites)",
    )
    authority: dict[str, Any]
    pending: dict[str, Any]
    approvals: list[Any]
    resume_policy: str
    schema_version: int
    size_bytes: int
    created_at: datetime


class BatchItemOut(Schema):
    kind: Literal["checkpoint", "cursor"]
    checkpoint: CheckpointOut | None = Field(None, description="the checkpoint written (kind checkpoint)")
    cursor: dict[str, Any] | None = Field(None, description="the cursor set (kind cursor)")


class BatchOut(Schema):
    run_id: int
    checkpoint_count: int = Field(description="the run's checkpoint count after the batch")
    items: list[BatchItemOut] = Field(description="one typed result per item, in item order")


class TranscriptIn(Strict):
    role: Literal["user", "assistant", "system", "tool"]
    # The bound is in bytes (UTF-8), which JSON Schema cannot count: maxLength declares it in
    # characters, the most a string of that many bytes can have (the core refuses by bytes).
    content: str = Field(..., json_schema_extra=max_bytes(
        settings.TRANSCRIPT_ENTRY_MAX_BYTES, maxLength=settings.TRANSCRIPT_ENTRY_MAX_BYTES,
    ), description="the server's TRANSCRIPT_ENTRY_MAX_BYTES; `maxLength` states the same number in characters")
    runtime_id: int | None = Field(None, ge=1, description=RUNTIME_ID_DOC)


class TranscriptOut(Schema):
    seq: int
    role: str
    content: str
    created_at: datetime


# ---- events -----------------------------------------------------------------------------------
class EventOut(Schema):
    id: int
    project_id: int
    session_id: int | None
    run_id: int | None
    type: str
    #: What the event is about (``session``, ``run``, ``runtime``, ``handoff``, …; ``event_types.family_of``).
    family: str
    payload: dict[str, Any]
    actor: str
    created_at: datetime

    @staticmethod
    def resolve_family(obj: Any) -> str:
        return ev.family_of(obj.type)
