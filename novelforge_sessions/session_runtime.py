"""The Session Runtime's deterministic core: the validation of session, run and checkpoint payloads
(docs/model.md#checkpoints), beside the lifecycles (docs/model.md#session-lifecycle).

This module owns the validation of session, run and checkpoint payloads; the session's
lifecycle table, like every record's, is :mod:`novelforge_sessions.lifecycles`' (every write of a
session status goes through ``lifecycles.SESSION.check``). It imports nothing from Django and does
no I/O, so every rule here is testable in microseconds and the same input always yields the same
result or the same typed error.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

# The states and the pure refusals are the lifecycles'; the service reads them here too (``rt.SessionStatus``).
from novelforge_sessions.lifecycles import (  # noqa: F401 (re-exported)
    IllegalTransition, InvalidPayload, RunState, RuntimeRuleError, RuntimeState, SessionStatus,
)


class SessionRole(StrEnum):
    MANAGER = "manager"
    WRITER = "writer"
    SPECIALIST = "specialist"
    SEMANTIC_REVIEWER = "semantic_reviewer"
    HUMAN_REVIEWER = "human_reviewer"
    OTHER = "other"


class MemoryPolicy(StrEnum):
    NONE = "none"
    BOUNDED = "bounded"
    SESSION = "session"
    EXTERNAL = "external"
    CHECKPOINT_ONLY = "checkpoint_only"


class CheckpointBoundary(StrEnum):
    """docs/model.md#checkpoints: the places where repeating or forgetting work would be dangerous."""

    CONTEXT_FREEZE = "context_freeze"
    CANDIDATE_FROZEN = "candidate_frozen"
    USER_WAIT = "user_wait"
    EXTERNAL_WAIT = "external_wait"
    BEFORE_CONSEQUENTIAL_WRITE = "before_consequential_write"
    AFTER_EXTERNAL_RESULT = "after_external_result"
    BEFORE_CANON_SETTLEMENT = "before_canon_settlement"
    BEFORE_LONG_HANDOFF = "before_long_handoff"


CHECKPOINT_SCHEMA_VERSION = 1
#: The most steps one batch write may carry (POST /runs/{id}/batch; OpenAPI maxItems).
MAX_BATCH_ITEMS = 100


# --------------------------------------------------------------------------------------
# Session payloads
# --------------------------------------------------------------------------------------
class CheckpointNotBounded(RuntimeRuleError):
    code = "checkpoint_not_bounded"


#: Short machine names (task modes, runtime families, capabilities, role extensions, resume
#: policies); the API schema declares this pattern (``api.schemas.NAME_PATTERN``).
NAME_PATTERN = r"^[a-z][a-z0-9_.:-]{0,63}$"
_NAME_RE = re.compile(NAME_PATTERN)
#: A runtime or worker declares at most this many capabilities (a handoff requires at most as many).
MAX_CAPABILITIES = 64


@dataclass(frozen=True)
class SessionSpec:
    role: SessionRole
    role_extension: str
    memory_policy: MemoryPolicy
    task_mode: str
    runtime_family: str


def validate_session_spec(
    *, role: str, role_extension: str | None, memory_policy: str, task_mode: str, runtime_family: str
) -> SessionSpec:
    try:
        role_v = SessionRole(role)
    except ValueError:
        raise InvalidPayload(
            f"role {role!r} is not a session role", field="role", allowed=[r.value for r in SessionRole]
        ) from None
    try:
        memory_v = MemoryPolicy(memory_policy)
    except ValueError:
        raise InvalidPayload(
            f"memory_policy {memory_policy!r} is not a memory policy",
            field="memory_policy",
            allowed=[m.value for m in MemoryPolicy],
        ) from None
    ext = (role_extension or "").strip()
    if role_v is SessionRole.OTHER and not ext:
        raise InvalidPayload("role 'other' needs an explicit role_extension name", field="role_extension")
    if role_v is not SessionRole.OTHER and ext:
        raise InvalidPayload("role_extension is only allowed with role 'other'", field="role_extension")
    if ext and not _NAME_RE.match(ext):
        raise InvalidPayload(
            "role_extension must be a short lowercase name ([a-z][a-z0-9_.:-]*)", field="role_extension"
        )
    validate_name(task_mode, "task_mode")
    validate_name(runtime_family, "runtime_family")
    return SessionSpec(role_v, ext, memory_v, task_mode, runtime_family)


def validate_name(value: Any, field_name: str) -> str:
    """Short machine names: task modes, runtime families, capabilities, policies."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise InvalidPayload(f"{field_name} must be a short lowercase name ([a-z][a-z0-9_.:-]*)", field=field_name)
    return value


def validate_capabilities(capabilities: Iterable[str], field_name: str = "capabilities") -> list[str]:
    """Sorted, without duplicates. ``field_name``: the field or query parameter as the caller sent
    it (``required_capabilities`` of a handoff, ``capability`` of the routing query)."""
    given = list(capabilities)
    # Counted as given (duplicates included), as the schema's maxItems counts them.
    if len(given) > MAX_CAPABILITIES:
        raise InvalidPayload(f"at most {MAX_CAPABILITIES} capabilities", field=field_name, limit=MAX_CAPABILITIES)
    caps = sorted(set(given))
    for cap in caps:
        if not isinstance(cap, str) or not _NAME_RE.match(cap):
            raise InvalidPayload(f"capability {cap!r} must be a short lowercase name", field=field_name)
    return caps


# --------------------------------------------------------------------------------------
# Storable text: what PostgreSQL's text and jsonb can hold
# --------------------------------------------------------------------------------------
#: Why a text is refused (the API's body check, the actions', the pages' plain words key on it).
UNSTORABLE_TEXT = "text cannot contain NUL (U+0000) or unpaired surrogates"


def is_storable_text(text: str) -> bool:
    """PostgreSQL's text and jsonb refuse U+0000, and an unpaired surrogate (legal in JSON's
    ``\\uXXXX`` escapes) has no UTF-8 form: either would fail in the database (a 500)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # an unpaired surrogate
        return False
    return True


def printable_path(path: str) -> str:
    """A field path that is itself safe to store and render (escapes instead of NUL or surrogates)."""
    return path.encode("ascii", "backslashreplace").decode().replace("\x00", "\\x00")


def unstorable_text_at(value: Any) -> str | None:
    """Where ``value`` holds a string or object key PostgreSQL cannot store (``is_storable_text``),
    as a path (``""`` for ``value`` itself); else None. Iterative, so a deeply nested value
    cannot exhaust the stack."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if not is_storable_text(item):
                return path
        elif isinstance(item, Mapping):
            for key, child in item.items():
                child_path = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and not is_storable_text(key):
                    return child_path
                stack.append((child_path, child))
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{path}[{i}]", child) for i, child in enumerate(item))
    return None


def check_storable_text(value: Any, where: str = "body") -> None:
    """Refuse (``InvalidPayload``, 422 ``validation_error`` naming the path) a value holding text
    PostgreSQL cannot store. Every action that stores caller text calls it, so the API, the pages
    and the relay get the same refusal; ``where`` names ``value`` itself (``note``, ``query``)."""
    path = unstorable_text_at(value)
    if path is not None:
        field = printable_path(path or where)
        raise InvalidPayload(f"{field}: {UNSTORABLE_TEXT}", field=field)


def json_size(value: Any) -> int:
    """A value's size as the byte bounds count it: UTF-8 bytes of its compact JSON (the API
    schema states these bounds as ``x-max-bytes``)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode())


#: Byte bounds of free-form values (``json_size``), declared in the API schema from these names.
#: Provider metadata (sessions, runtimes): execution metadata, never a document.
MAX_METADATA_BYTES = 8 * 1024
#: A run's workflow cursor, however it is set (start, advance, batch).
MAX_CURSOR_BYTES = 8 * 1024
#: What a run starts from (``frozen_inputs``): references and small values, not documents.
MAX_FROZEN_INPUTS_BYTES = 16 * 1024


def validate_size(value: Any, field_name: str, max_bytes: int) -> None:
    """Refuse a value over ``max_bytes`` as ``json_size`` counts it, naming ``field_name``."""
    size = json_size(value)
    if size > max_bytes:
        raise InvalidPayload(
            f"{field_name} is {size} bytes; at most {max_bytes}", field=field_name, size=size, limit=max_bytes
        )


def validate_metadata(value: Mapping[str, Any] | None, field_name: str, max_bytes: int = MAX_METADATA_BYTES) -> dict:
    """Provider metadata and similar free-form maps: bounded, JSON objects, stored as-is."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidPayload(f"{field_name} must be a JSON object", field=field_name)
    validate_size(value, field_name, max_bytes)
    return dict(value)


# --------------------------------------------------------------------------------------
# Checkpoints (docs/model.md#checkpoints: bounded resume state, never a transcript)
# --------------------------------------------------------------------------------------
#: Keys that mean "a copy of the conversation or of private reasoning" wherever they appear.
TRANSCRIPT_KEYS = frozenset(
    {
        "transcript",
        "messages",
        "chat",
        "chat_history",
        "history",
        "conversation",
        "dialogue",
        "turns",
        "reasoning",
        "private_reasoning",
        "chain_of_thought",
        "thoughts",
        "scratchpad",
    }
)
#: A single string longer than this is prose, not a cursor or a reference.
MAX_CHECKPOINT_STRING = 2048
_MESSAGE_ROLES = {"user", "assistant", "system", "tool", "human", "ai", "model"}
#: Speaker tokens that make even a two-turn list a conversation.
_SPEAKER_WORDS = frozenset(_MESSAGE_ROLES | {"bot", "agent", "me", "you"})
#: A speaker-like value: a short label of a few words on one line ("user", "Mara", "Dr. Voss").
MAX_SPEAKER_CHARS = 40
MAX_SPEAKER_WORDS = 3


@dataclass(frozen=True)
class ArtifactRef:
    artifact_id: int
    fingerprint: str


@dataclass(frozen=True)
class ApprovalRef:
    """A write-intent ref of ``approvals``: the write the cursor is about to make, and
    optionally the approval it relies on (resolved against the database at write time)."""

    write_intent_id: int
    approval_id: int | None = None


@dataclass(frozen=True)
class CheckpointSpec:
    boundary: CheckpointBoundary
    cursor: dict[str, Any]
    artifacts: tuple[ArtifactRef, ...]
    #: ``{pending key: [refs as the client wrote them]}``; each key's refs are typed and
    #: resolved by the wait kind registered for it (``control/waits.py``).
    pending: dict[str, list[Any]]
    approvals: tuple[ApprovalRef, ...]
    resume_policy: str
    size_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)
    #: The client's key for this write (a retry with the same key and body replays the first
    #: checkpoint; the same key with another body is ``idempotency_key_reused``).
    idempotency_key: str | None = None
    #: The authority refs the client froze against, typed (``validate_authority_refs``); None
    #: when it stated none. The service compares them with the project's current ones.
    authority: dict[str, Any] | None = None


#: What a client sends. Not ``schema_version``: the server stamps each checkpoint with
#: ``CHECKPOINT_SCHEMA_VERSION`` (the contract's "timestamp/version" is recorded, not stated).
CHECKPOINT_FIELDS = frozenset(
    {"boundary", "cursor", "artifacts", "authority", "pending", "approvals", "resume_policy", "idempotency_key"}
)
#: The authority refs a checkpoint may state (the project's ``authority_ref()``: the service
#: checks the two agree) and each one's JSON type.
AUTHORITY_REF_TYPES: dict[str, type] = {"authority_version": int, "lock_fingerprint": str, "framework_version": str}
#: A client-chosen idempotency key: 1–200 printable ASCII characters, no spaces (write intents and
#: checkpoints share it).
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,200}$"
IDEMPOTENCY_KEY_RE = re.compile(IDEMPOTENCY_KEY_PATTERN)
APPROVAL_REF_FIELDS = frozenset({"write_intent_id", "approval_id"})
#: The one content-fingerprint pattern, ``sha256:<64 lowercase hex digits>``. Validators, JSON
#: Schemas and the database's check constraints all use this string (never a copy of it).
FINGERPRINT_PATTERN = r"^sha256:[0-9a-f]{64}$"
FINGERPRINT_RE = re.compile(FINGERPRINT_PATTERN)
_ID_MAX = 2**63 - 1


def _looks_like_message(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and "content" in value
        and str(value.get("role", "")).lower() in _MESSAGE_ROLES
    )


def _is_speaker(value: Any) -> bool:
    return (
        isinstance(value, str) and 0 < len(value) <= MAX_SPEAKER_CHARS and "\n" not in value
        and len(value.split()) <= MAX_SPEAKER_WORDS
    )


def _is_free_text(value: Any) -> bool:
    return isinstance(value, str) and len(value.split()) >= 2


def _is_chat(speakers: list[str], texts: list[Any]) -> bool:
    """Turns by shape: ≥ 2 items; the speakers a small set that repeats (or conversational
    roles), changing along the list on more than half the steps; at least half the texts free
    text (whitespace inside), and at least one longer than a label."""
    n = len(speakers)
    if n < 2:
        return False
    distinct = {s.casefold() for s in speakers}
    if len(distinct) > max(3, n // 2):
        return False
    if len(distinct) == n and not distinct & _SPEAKER_WORDS:
        return False  # nothing repeats and nobody is a conversational role: labels, not speakers
    changes = sum(1 for a, b in zip(speakers, speakers[1:]) if a.casefold() != b.casefold())
    if 2 * changes <= n - 1:
        return False  # sorted categories (done, done, todo, todo), not turns
    free = [t for t in texts if _is_free_text(t)]
    return 2 * len(free) >= n and not all(_is_speaker(t) for t in free)


def _looks_like_turns(items: list[Any]) -> bool:
    """A list of chat turns whatever its key names: ``[{speaker, text}, …]``, ``[{who, said}, …]``,
    ``[[speaker, text], …]``."""
    if len(items) < 2:
        return False
    if all(isinstance(i, (list, tuple)) and len(i) >= 2 for i in items):
        speakers = [i[0] for i in items]
        return all(_is_speaker(s) for s in speakers) and _is_chat(speakers, [i[1] for i in items])
    if not all(isinstance(i, Mapping) for i in items):
        return False
    shared = set(items[0]).intersection(*items[1:])
    for key in shared:
        speakers = [i[key] for i in items]
        if not all(_is_speaker(s) for s in speakers):
            continue
        text_keys = set().union(*items) - {key}
        if any(_is_chat(speakers, [i.get(other) for i in items]) for other in text_keys):
            return True
    return False


def find_transcript_content(value: Any, path: str = "$") -> str | None:
    """Return the JSON path of the first transcript-like part of ``value``, or None.

    Transcript-like: a key named like a transcript (``TRANSCRIPT_KEYS``), a list holding a
    ``{role, content}`` message, a list of chat turns by shape (``_looks_like_turns``), or a
    string longer than ``MAX_CHECKPOINT_STRING``.
    """
    if isinstance(value, Mapping):
        for key, sub in value.items():
            sub_path = f"{path}.{key}"
            if str(key).lower() in TRANSCRIPT_KEYS:
                return sub_path
            found = find_transcript_content(sub, sub_path)
            if found:
                return found
        return None
    if isinstance(value, list):
        if any(_looks_like_message(item) for item in value) or _looks_like_turns(value):
            return path
        for index, sub in enumerate(value):
            found = find_transcript_content(sub, f"{path}[{index}]")
            if found:
                return found
        return None
    if isinstance(value, str) and len(value) > MAX_CHECKPOINT_STRING:
        return path
    return None


def _ref_id(value: Any, field_name: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= _ID_MAX:
        raise InvalidPayload(f"{field_name} must be a positive integer id", field=field_name)
    return value


def validate_authority_refs(value: Any) -> dict[str, Any] | None:
    """``authority``: the refs the checkpoint froze against, a subset of ``AUTHORITY_REF_TYPES``,
    each of its type. Strict, as the schemas are: ``true`` and ``"1"`` are not integers (``1.0``
    is 1, the integer JSON Schema says it is), ``5`` is not a fingerprint. Only well-typed refs
    are compared with the current ones, so a wrong type is a 422 here, never ``stale_authority``."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidPayload("authority must be an object of authority refs", field="authority",
                             allowed=sorted(AUTHORITY_REF_TYPES))
    refs: dict[str, Any] = {}
    for key, ref in value.items():
        kind = AUTHORITY_REF_TYPES.get(key)
        if kind is None:
            raise InvalidPayload(f"unknown authority ref {key!r}", field=f"authority.{key}",
                                 allowed=sorted(AUTHORITY_REF_TYPES))
        if kind is int and type(ref) is float and ref.is_integer():
            ref = int(ref)
        if type(ref) is not kind:  # bool is a subclass of int: not an integer here
            raise InvalidPayload(f"authority.{key} must be {'an integer' if kind is int else 'a string'}",
                                 field=f"authority.{key}")
        refs[key] = ref
    return refs


def validate_approval_refs(value: Any) -> tuple[ApprovalRef, ...]:
    """``approvals``: ``[{"write_intent_id": int, "approval_id"?: int}]``, each intent once."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidPayload("approvals must be a list of {write_intent_id, approval_id?} refs", field="approvals")
    refs: list[ApprovalRef] = []
    seen: set[int] = set()
    for index, ref in enumerate(value):
        where = f"approvals[{index}]"
        if not isinstance(ref, Mapping):
            raise InvalidPayload("an approval ref is an object {write_intent_id, approval_id?}", field=where)
        unknown = sorted(str(k) for k in set(ref) - APPROVAL_REF_FIELDS)
        if unknown:
            raise InvalidPayload(f"unknown approval ref field {unknown[0]!r}", field=f"{where}.{unknown[0]}",
                                 allowed=sorted(APPROVAL_REF_FIELDS))
        intent_id = _ref_id(ref.get("write_intent_id"), f"{where}.write_intent_id")
        if intent_id in seen:
            raise InvalidPayload("each write intent is referenced once", field=f"{where}.write_intent_id")
        seen.add(intent_id)
        refs.append(ApprovalRef(intent_id, _ref_id(ref.get("approval_id"), f"{where}.approval_id", optional=True)))
    return tuple(refs)


def validate_pending(value: Any, keys: Iterable[str] | None = None) -> dict[str, list[Any]]:
    """``pending``: an object of ref lists, one per thing a run waits on. With ``keys`` (the
    registered wait kinds' pending keys), any other key is refused."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidPayload("pending must be an object of reference lists (e.g. handoffs, gates)", field="pending")
    allowed = None if keys is None else frozenset(keys)
    pending: dict[str, list[Any]] = {}
    for key, refs in value.items():
        where = f"pending.{key}"
        if allowed is not None and key not in allowed:
            raise InvalidPayload(f"unknown pending key {key!r}", field=where, allowed=sorted(allowed))
        if not isinstance(refs, list):
            raise InvalidPayload(f"{where} must be a list of references", field=where)
        pending[str(key)] = list(refs)
    return pending


def is_fingerprint(value: Any) -> bool:
    """Whether ``value`` is a fingerprint. ``fullmatch``: Python's ``$`` also matches before a
    trailing newline, which the database's regex (same pattern) refuses."""
    return isinstance(value, str) and FINGERPRINT_RE.fullmatch(value) is not None


def validate_fingerprint(value: Any, field_name: str) -> str:
    if not is_fingerprint(value):
        raise InvalidPayload(f"{field_name} must look like sha256:<64 hex digits>", field=field_name)
    return value


def validate_checkpoint(
    payload: Mapping[str, Any], *, max_bytes: int, pending_keys: Iterable[str] | None = None,
) -> CheckpointSpec:
    """Validate a checkpoint body; refuse anything unbounded with ``checkpoint_not_bounded``.

    The refs' *shapes* are checked here (``approvals``, the ``pending`` keys when
    ``pending_keys`` is given); whether they resolve is the service's business.
    """
    size = json_size(payload)
    if size > max_bytes:
        raise CheckpointNotBounded(
            f"checkpoint is {size} bytes; the cap is {max_bytes}", size=size, limit=max_bytes
        )
    where = find_transcript_content(payload)
    if where:
        raise CheckpointNotBounded(
            "checkpoints hold a cursor and references, never transcript, chat or private reasoning",
            path=where,
        )
    unknown = sorted(set(payload) - CHECKPOINT_FIELDS)
    if unknown:
        note = " (the server stamps each checkpoint's schema_version)" if unknown[0] == "schema_version" else ""
        raise InvalidPayload(f"unknown checkpoint field {unknown[0]!r}{note}", field=unknown[0],
                             allowed=sorted(CHECKPOINT_FIELDS))
    try:
        boundary = CheckpointBoundary(payload.get("boundary"))
    except ValueError:
        raise InvalidPayload(
            "boundary is not a checkpoint boundary",
            field="boundary",
            allowed=[b.value for b in CheckpointBoundary],
        ) from None
    cursor = payload.get("cursor")
    if not isinstance(cursor, Mapping) or not cursor:
        raise InvalidPayload("cursor must be a non-empty JSON object (the workflow step)", field="cursor")
    refs: list[ArtifactRef] = []
    for index, ref in enumerate(payload.get("artifacts") or []):
        if not isinstance(ref, Mapping) or not isinstance(ref.get("artifact_id"), int):
            raise InvalidPayload("each artifact ref needs an integer artifact_id", field=f"artifacts[{index}]")
        refs.append(
            ArtifactRef(ref["artifact_id"], validate_fingerprint(ref.get("fingerprint"), f"artifacts[{index}].fingerprint"))
        )
    authority = validate_authority_refs(payload.get("authority"))
    pending = validate_pending(payload.get("pending"), pending_keys)
    approvals = validate_approval_refs(payload.get("approvals"))
    resume_policy = payload.get("resume_policy")
    if resume_policy is None:  # not sent; an empty name is refused like any other non-name
        resume_policy = "revalidate"
    if not isinstance(resume_policy, str) or not _NAME_RE.match(resume_policy):
        raise InvalidPayload("resume_policy must be a short lowercase name", field="resume_policy")
    key = payload.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not IDEMPOTENCY_KEY_RE.fullmatch(key)):
        raise InvalidPayload("idempotency_key must be 1–200 printable ASCII characters, no spaces", field="idempotency_key")
    return CheckpointSpec(
        boundary=boundary,
        cursor=dict(cursor),
        artifacts=tuple(refs),
        pending=pending,
        approvals=approvals,
        resume_policy=resume_policy,
        size_bytes=size,
        idempotency_key=key,
        authority=authority,
    )


def validate_transcript_entry(*, role: str, content: str, max_bytes: int) -> None:
    if role not in {"user", "assistant", "system", "tool"}:
        raise InvalidPayload("role must be user, assistant, system or tool", field="role")
    size = len(content.encode())
    if size > max_bytes:
        raise InvalidPayload(f"entry is {size} bytes; at most {max_bytes}", field="content", size=size, limit=max_bytes)
