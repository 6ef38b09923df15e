"""Request and response schemas of the sessions' and control plane's routes (pydantic, via
django-ninja), on the generic kit of :mod:`novelforge_sessions.apikit.schemas`."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from django.conf import settings
from ninja import Field, Schema
from pydantic import ConfigDict, WithJsonSchema

from novelforge_sessions import event_types as ev
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.apikit.schemas import (
    NON_BLANK_TEXT, STORABLE_TEXT, X_MAX_BYTES, Input, Strict, idempotency_key_field, max_bytes,
)

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
    kind: str = Field("document", max_length=64, description="free-form, except `graph-blob`: reserved for graph state "
                      "blobs (422)")
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


class AttachIn(RuntimeIn):
    """A runtime to attach, with an optional idempotency key."""

    idempotency_key: str | None = idempotency_key_field("session")


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
        return sorted(t.value for t in lc.SESSION.targets(obj.status))


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
    idempotency_key: str | None = idempotency_key_field("session")


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
    idempotency_key: str | None = idempotency_key_field("run")


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
