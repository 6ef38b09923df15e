"""The control plane over HTTP: handoffs and leases, results and receipts, write intents and
approvals, binding invalidation, runtime routing. Thin: parse, call an action, render."""
from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Query, Router, Schema, Status

from novelforge_sessions import leases
from novelforge_sessions import tracing
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.actions.lifecycle import BIGINT_MAX
from novelforge_sessions.control import bindings as binding_actions
from novelforge_sessions.control import handoffs as handoff_actions
from novelforge_sessions.control import intents as intent_actions
from novelforge_sessions.control import result_schema as result_schemas
from novelforge_sessions.control import results as result_actions
from novelforge_sessions.control import routing as routing_actions
from novelforge_sessions.apikit.common import RUNTIME_GONE, caller, errors, get_or_404, keyset
from novelforge_sessions.api.schemas import CAPABILITIES, HandoffStateName, IntentStateName, ReasonIn, ShortNameDeclared
from novelforge_sessions.apikit.schemas import (
    Page, NON_BLANK_TEXT, Strict, X_MAX_BYTES, idempotency_key_field, max_bytes, page_after, page_limit,
)
from novelforge_sessions.control.models import (
    AuthorityChange,
    ConsumeReceipt,
    Handoff,
    IntentKind,
    ResultDelivery,
    ResultValidation,
    WriteIntent,
)
from novelforge_sessions.models import Project

handoffs_router = Router(tags=["handoffs"])
intents_router = Router(tags=["write intents"])
bindings_router = Router(tags=["bindings"])
routing_router = Router(tags=["routing"])

routers = [handoffs_router, intents_router, bindings_router, routing_router]


# ---- schemas: handoffs & results ------------------------------------------------------------
#: Fencing tokens are PostgreSQL bigints.
FENCING_TOKEN = {"maximum": BIGINT_MAX}


class InputRefIn(Strict):
    artifact_id: int
    fingerprint: str = Field(..., description="sha256:<hex> of the artifact version the job is frozen against",
                             json_schema_extra={"pattern": rt.FINGERPRINT_PATTERN})


class HandoffIn(Strict):
    logical_id: str = Field(..., max_length=200, description="unique per project: names the logical result",
                            json_schema_extra={"pattern": handoff_actions.LOGICAL_ID_RE.pattern},
                            examples=["chapter-3/continuity-check"])
    inputs: list[InputRefIn] = Field(default_factory=list, description="frozen input artifact versions",
                                     json_schema_extra={"maxItems": handoff_actions.MAX_INPUTS})
    params: dict[str, Any] = Field(default_factory=dict, description="the job's instructions",
                                   json_schema_extra=max_bytes(handoff_actions.MAX_PARAMS_BYTES))
    result_schema: dict[str, Any] = Field(
        default_factory=dict,
        json_schema_extra={X_MAX_BYTES: handoff_actions.MAX_RESULT_SCHEMA_BYTES, "anyOf": [
            {"type": "object", "not": {"required": ["$schema"]},
             "additionalProperties": {"enum": sorted(result_schemas.SHORT_TYPES)}},
            {"type": "object", "required": ["$schema"], "properties": {"$schema": {"const": result_schemas.DIALECT}}},
        ]},
        description=(
            "the result's shape, part of the frozen job: either the short form (required result keys → "
            "string|integer|number|boolean|object|array|any) or a full JSON Schema (Draft 2020-12, with "
            '"$schema": "https://json-schema.org/draft/2020-12/schema"). Results are validated with jsonschema; '
            "each problem is reported with its path (422 invalid_result)."
        ),
        examples=[{"verdict": "string", "issues": "array"},
                  {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                   "required": ["verdict"], "properties": {"verdict": {"enum": ["pass", "revise"]}}}],
    )
    required_capabilities: list[str] = Field(default_factory=list, examples=[["continuity-check"]],
                                             json_schema_extra=CAPABILITIES)
    timeout_seconds: int | None = Field(None, ge=1, le=86400, description="lease length of one attempt (default 300)")
    idempotency_key: str | None = idempotency_key_field("run")


class ReceiptOut(Schema):
    id: int
    logical_id: str
    handoff_id: int | None
    session_id: int | None
    run_id: int | None
    delivery_id: int | None
    job_fingerprint: str
    result_hash: str
    result: dict[str, Any]
    consumed_at: datetime


class HandoffOut(Schema):
    id: int
    project_id: int
    session_id: int
    run_id: int
    logical_id: str
    inputs: list[dict[str, Any]]
    params: dict[str, Any]
    result_schema: dict[str, Any]
    job_fingerprint: str = Field(..., description="server-computed sha256 of the frozen job; results must cite it")
    required_capabilities: list[str]
    timeout_seconds: int
    purpose: str = Field(..., description="`job`: for any worker through these routes; `review`: an agent-review slot, "
                         "reachable only through `/review-packets` (409 `review_route_required` here)")
    state: str
    attempt: int
    fencing_token: int = Field(..., description="the current lease's token; every lease write must carry it")
    lease_holder: str
    lease_expires_at: datetime | None
    lease_expired: bool
    claimed_at: datetime | None
    heartbeat_at: datetime | None
    bound_at: datetime | None
    conflict_at: datetime | None
    conflict_resolved_at: datetime | None
    conflict_resolution: str
    cancelled_at: datetime | None
    created_at: datetime
    receipt: ReceiptOut | None


class ClaimIn(Strict):
    worker: str = Field(..., max_length=200, json_schema_extra={"minLength": 1, "pattern": NON_BLANK_TEXT},
                        description="the claiming worker's name (lease holder), not blank")
    capabilities: list[str] = Field(default_factory=list, description="what this worker can do",
                                    json_schema_extra=CAPABILITIES)
    handoff_id: int | None = Field(None, description="claim this handoff only (409 if it cannot be claimed)")


class ClaimOut(Schema):
    handoff: HandoffOut | None = Field(None, description="null: nothing eligible to claim")


class LeaseIn(Strict):
    fencing_token: int = Field(..., ge=1, json_schema_extra=FENCING_TOKEN)


class LeaseOut(Schema):
    handoff_id: int
    attempt: int
    fencing_token: int
    lease_expires_at: datetime


class ResultIn(Strict):
    fencing_token: int = Field(..., ge=1, description="the token of your claim", json_schema_extra=FENCING_TOKEN)
    job_fingerprint: str = Field(..., max_length=80, description="must cite the frozen job's fingerprint",
                                 json_schema_extra={"pattern": rt.FINGERPRINT_PATTERN})
    result: dict[str, Any] = Field(..., json_schema_extra=max_bytes(result_actions.MAX_RESULT_BYTES))
    result_hash: str | None = Field(None, max_length=80, description="optional: sha256 of the canonical result, checked",
                                    json_schema_extra={"pattern": rt.FINGERPRINT_PATTERN})


class OriginalOut(Schema):
    outcome: str
    delivery_id: int | None
    consumed_at: datetime


class DeliveryOut(Schema):
    outcome: Literal["consumed", "already_consumed"]
    delivery_id: int
    handoff_id: int
    logical_id: str
    result_hash: str
    handoff_state: str
    session_status: str
    receipt: ReceiptOut
    original: OriginalOut = Field(..., description="the outcome of the delivery that was consumed")


class ValidationOut(Schema):
    valid: bool
    cites_job_fingerprint: bool
    errors: list[dict[str, Any]]
    validated_at: datetime


class DeliveryLogOut(Schema):
    id: int
    handoff_id: int
    attempt: int
    fencing_token: int
    result_hash: str
    outcome: str
    delivered_by: str
    received_at: datetime
    validation: ValidationOut | None


class ResolveIn(Strict):
    resolution: str = Field(..., min_length=1, max_length=200, json_schema_extra={"pattern": NON_BLANK_TEXT},
                            description="what was decided, not blank")


def _receipt_out(receipt: ConsumeReceipt | None) -> dict | None:
    if receipt is None:
        return None
    return {
        "id": receipt.id, "logical_id": receipt.logical_id, "handoff_id": receipt.handoff_id,
        "session_id": receipt.session_id, "run_id": receipt.run_id, "delivery_id": receipt.delivery_id,
        "job_fingerprint": receipt.job_fingerprint, "result_hash": receipt.result_hash, "result": receipt.result,
        "consumed_at": receipt.consumed_at,
    }


def _handoff_out(h: Handoff, *, receipt: ConsumeReceipt | None | bool = True) -> dict:
    if receipt is True:
        receipt = result_actions._receipt_of(h) if lc.handoff_consumed(h.state) else None
    now = timezone.now()
    return {
        **{f: getattr(h, f) for f in (
            "id", "project_id", "session_id", "run_id", "logical_id", "inputs", "params", "result_schema",
            "job_fingerprint", "required_capabilities", "timeout_seconds", "purpose", "state", "attempt", "fencing_token",
            "lease_holder", "lease_expires_at", "claimed_at", "heartbeat_at", "bound_at", "conflict_at",
            "conflict_resolved_at", "conflict_resolution", "cancelled_at", "created_at",
        )},
        "lease_expired": leases.handoff_lease_expired(h.state, h.lease_expires_at, now),
        "receipt": _receipt_out(receipt or None),
    }


# ---- routes: handoffs ------------------------------------------------------------------------------
@handoffs_router.post(
    "/runs/{run_id}/handoffs", response={200: HandoffOut, 201: HandoffOut, **errors(403, 404, 409, 413)},
    summary="Hand off a frozen job (the session goes awaiting_external)",
    description="201 new; 200 an identical replay (same logical id, same job). With an `idempotency_key` (scoped "
    "to the run) the same key and body answer the first answer again (its status, the same handoff), the same key "
    "with another body is 409 `idempotency_key_reused`. 409 `logical_id_taken`, "
    "`already_consumed` (the logical id was consumed before), `session_not_running`, `run_not_open`. "
    + RUNTIME_GONE,
)
def create_handoff(request: HttpRequest, run_id: int, body: HandoffIn) -> Status:
    made = handoff_actions.create_handoff(
        caller(request), run_id, logical_id=body.logical_id, inputs=[i.model_dump() for i in body.inputs],
        params=body.params, result_schema=body.result_schema, required_capabilities=body.required_capabilities,
        timeout_seconds=body.timeout_seconds, idempotency_key=body.idempotency_key,
    )
    return Status(201 if made.created else 200, _handoff_out(made.handoff, receipt=None if made.created else True))


@handoffs_router.post(
    "/handoffs/claim", response={200: ClaimOut, **errors(403, 404, 409)},
    summary="Claim an eligible handoff under a lease (permission `work`)",
    description="Eligible: a `job` handoff, pending, or claimed with an expired lease (attempt + 1); its required "
    "capabilities ⊆ yours. Returns the handoff with its fencing token, or `null` when nothing is eligible. With "
    "`handoff_id`, 409 `handoff_not_claimable` explains why that one cannot be claimed, and 409 "
    "`review_route_required` refuses an agent-review slot (claim those with `POST /review-packets/claim`).",
)
def claim(request: HttpRequest, body: ClaimIn) -> dict:
    with tracing.span("claim", handoff_id=body.handoff_id) as span:
        handoff = handoff_actions.claim_handoff(
            caller(request), worker=body.worker, capabilities=body.capabilities, handoff_id=body.handoff_id,
        )
        if handoff is None:
            span.set(outcome="none_eligible")
        else:
            span.set(outcome="claimed", handoff_id=handoff.id, session_id=handoff.session_id, run_id=handoff.run_id,
                     attempt=handoff.attempt)
    return {"handoff": _handoff_out(handoff, receipt=None) if handoff else None}


@handoffs_router.get("/handoffs", response={200: Page[HandoffOut], **errors(403)}, summary="List handoffs")
def list_handoffs(
    request: HttpRequest, session_id: int | None = None, state: HandoffStateName | None = None,
    logical_id: str | None = None, after: int | None = page_after(), limit: int = page_limit(),
) -> dict:
    who = caller(request)
    who.require("read")
    qs = handoff_actions.visible_handoffs(who).select_related("receipt")
    if session_id is not None:
        qs = qs.filter(session_id=session_id)
    if state:
        qs = qs.filter(state=state)
    if logical_id:
        qs = qs.filter(logical_id=logical_id)
    page = keyset(qs, after=after, limit=limit)
    return {"items": [_handoff_out(h) for h in page["items"]], "next_after": page["next_after"]}


@handoffs_router.get("/handoffs/{handoff_id}", response={200: HandoffOut, **errors(403, 404)}, summary="Get a handoff")
def get_handoff(request: HttpRequest, handoff_id: int) -> dict:
    who = caller(request)
    who.require("read")
    return _handoff_out(get_or_404(handoff_actions.visible_handoffs(who).select_related("receipt"), "handoff", id=handoff_id))


@handoffs_router.post(
    "/handoffs/{handoff_id}/heartbeat", response={200: LeaseOut, **errors(403, 404, 409)},
    summary="Extend your lease (409 `stale_lease` if your fencing token was superseded)",
    description="409 `review_route_required` for an agent-review slot (renew it with `POST /review-packets/{id}/heartbeat`). "
    "409 `handoff_closed` once the handoff is bound, conflicted or cancelled — also when its session was terminated or "
    "went stale, which withdraws the session's unbound handoffs.",
)
def heartbeat(request: HttpRequest, handoff_id: int, body: LeaseIn) -> dict:
    lease = handoff_actions.heartbeat_handoff(caller(request), handoff_id, fencing_token=body.fencing_token)
    return {"handoff_id": lease.handoff_id, "attempt": lease.attempt, "fencing_token": lease.fencing_token,
            "lease_expires_at": lease.lease_expires_at}


@handoffs_router.post(
    "/handoffs/{handoff_id}/results", response={200: DeliveryOut, **errors(403, 404, 409, 413)},
    summary="Deliver a result (at-least-once safe: consumed once per logical id)",
    description="Every arrival is logged. 200 `consumed` (this one was consumed) or `already_consumed` (same "
    "logical id, same hash: the original outcome, nothing new). 409 `conflicting_result` (different hash: hard "
    "stop, the session fails or carries `open_conflict`), `stale_lease` (superseded token), "
    "`handoff_not_claimable`/`handoff_closed` (also for a session terminated or stale: nothing is consumed into it), "
    "`review_route_required` (an agent-review slot takes a typed verdict "
    "through `POST /review-packets/{id}/verdicts`; nothing is logged). 422 `invalid_result` (logged; does not fit the "
    "result schema or does not cite the job fingerprint), `result_hash_mismatch`.",
)
def deliver(request: HttpRequest, handoff_id: int, body: ResultIn) -> dict:
    with tracing.span("deliver", handoff_id=handoff_id) as span:
        done = result_actions.deliver_result(
            caller(request), handoff_id, fencing_token=body.fencing_token, job_fingerprint=body.job_fingerprint,
            result=body.result, result_hash=body.result_hash,
        )
        span.set(outcome=done.outcome, session_id=done.handoff.session_id, run_id=done.handoff.run_id,
                 delivery_id=done.delivery.id)
    receipt = done.receipt
    return {
        "outcome": done.outcome, "delivery_id": done.delivery.id, "handoff_id": done.handoff.id,
        "logical_id": done.handoff.logical_id, "result_hash": done.delivery.result_hash,
        "handoff_state": done.handoff.state, "session_status": done.session_status, "receipt": _receipt_out(receipt),
        "original": {"outcome": "consumed", "delivery_id": receipt.delivery_id, "consumed_at": receipt.consumed_at},
    }


@handoffs_router.get(
    "/handoffs/{handoff_id}/deliveries", response={200: Page[DeliveryLogOut], **errors(403, 404)},
    summary="The delivery log of a handoff (every arrival, with its validation)",
)
def list_deliveries(request: HttpRequest, handoff_id: int, after: int | None = page_after(),
                    limit: int = page_limit()) -> dict:
    who = caller(request)
    who.require("read")
    handoff = get_or_404(handoff_actions.visible_handoffs(who), "handoff", id=handoff_id)
    page = keyset(ResultDelivery.objects.filter(handoff=handoff).select_related("validation"), after=after, limit=limit)
    return {"items": [_delivery_out(d) for d in page["items"]], "next_after": page["next_after"]}


def _delivery_out(d: ResultDelivery) -> dict:
    try:
        validation = d.validation
    except ResultValidation.DoesNotExist:  # duplicates and lease refusals are not validated
        validation = None
    return {
        **{f: getattr(d, f) for f in ("id", "handoff_id", "attempt", "fencing_token", "result_hash", "outcome",
                                      "delivered_by", "received_at")},
        "validation": validation,
    }


@handoffs_router.post(
    "/handoffs/{handoff_id}/cancel", response={200: HandoffOut, **errors(403, 404, 409)},
    summary="Cancel a handoff still waiting for its result",
    description="The session's status reason (and its `session.transitioned` event, when the run waited on nothing "
    "else) says `handoff <logical id> cancelled`. 409 `handoff_closed` once bound; 409 `review_route_required` for an "
    "agent-review slot (withdraw it with its gate: `POST /review-gates/{id}/cancel`).",
)
def cancel(request: HttpRequest, handoff_id: int, body: ReasonIn | None = None) -> dict:
    return _handoff_out(handoff_actions.cancel_handoff(caller(request), handoff_id, reason=body.reason if body else ""))


@handoffs_router.post(
    "/handoffs/{handoff_id}/resolve-conflict", response={200: HandoffOut, **errors(403, 404, 409)},
    summary="Resolve a conflicting result (permission `approve`): the consumed result stands",
)
def resolve_conflict(request: HttpRequest, handoff_id: int, body: ResolveIn) -> dict:
    return _handoff_out(result_actions.resolve_conflict(caller(request), handoff_id, resolution=body.resolution))


@handoffs_router.get(
    "/receipts", response={200: Page[ReceiptOut], **errors(403)},
    summary="Consume-once receipts (one per logical id)",
)
def list_receipts(request: HttpRequest, logical_id: str | None = None, after: int | None = page_after(),
                  limit: int = page_limit()) -> dict:
    who = caller(request)
    who.require("read")
    qs = who.scope("receipt", ConsumeReceipt.objects.filter(project_id__in=who.project_ids))
    if logical_id:
        qs = qs.filter(logical_id=logical_id)
    return keyset(qs, after=after, limit=limit)


# ---- schemas & routes: write intents ------------------------------------------------------------------
KindName = Literal[tuple(IntentKind.values)]  # type: ignore[valid-type]


class BeforeStateOut(Schema):
    kind: str
    artifact_id: int | None
    state: dict[str, Any]
    before_fingerprint: str


class WriteIntentIn(Strict):
    kind: KindName
    idempotency_key: str = Field(..., max_length=200, json_schema_extra={"pattern": rt.IDEMPOTENCY_KEY_PATTERN},
                                 description="1–200 printable ASCII characters, no spaces")
    before_fingerprint: str = Field(..., max_length=80, description="from GET /write-intents/before-state",
                                    json_schema_extra={"pattern": rt.FINGERPRINT_PATTERN})
    artifact_id: int | None = Field(None, description="artifact.make_current: the artifact")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description='artifact.make_current: {"version_id"}; authority.settle: {"artifacts": [{"artifact_id", '
        '"fingerprint"}], "note"}; framework.change: {"framework_version"}',
        json_schema_extra=max_bytes(intent_actions.MAX_PARAMS_BYTES),
    )
    session_id: int | None = Field(None, description="provenance only: grants nothing")
    run_id: int | None = None

    # artifact.make_current names its artifact; each kind takes its own params.
    json_schema_rules: ClassVar[dict[str, Any]] = {"allOf": [
        {
            "if": {"properties": {"kind": {"const": "artifact.make_current"}}, "required": ["kind"]},
            "then": {"properties": {"artifact_id": {"type": "integer"}, "params": {
                "type": "object", "required": ["version_id"], "additionalProperties": False,
                "properties": {"version_id": {"type": "integer"}}}}, "required": ["artifact_id", "params"]},
        },
        {
            "if": {"properties": {"kind": {"const": "authority.settle"}}, "required": ["kind"]},
            "then": {"properties": {"params": {
                "type": "object", "required": ["artifacts"], "additionalProperties": False, "properties": {
                    "artifacts": {"type": "array", "minItems": 1, "maxItems": 200, "items": {
                        "type": "object", "required": ["artifact_id", "fingerprint"], "additionalProperties": False,
                        "properties": {"artifact_id": {"type": "integer"},
                                       "fingerprint": {"type": "string", "pattern": rt.FINGERPRINT_PATTERN}}}},
                    "note": {"type": "string", "maxLength": 500, "pattern": r"^[^\u0000]*$"}}}}, "required": ["params"]},
        },
        {
            "if": {"properties": {"kind": {"const": "framework.change"}}, "required": ["kind"]},
            "then": {"properties": {"params": {
                "type": "object", "required": ["framework_version"], "additionalProperties": False,
                "properties": {"framework_version": {"type": "string", "pattern": intent_actions.FRAMEWORK_RE.pattern}}}},
                "required": ["params"]},
        },
    ]}


class ApprovalOut(Schema):
    id: int
    decision: str
    approver: str
    before_fingerprint: str
    authority_version: int
    note: str
    revoked_at: datetime | None
    revoked_by: str
    created_at: datetime


class WriteIntentOut(Schema):
    id: int
    project_id: int
    session_id: int | None
    run_id: int | None
    kind: str
    artifact_id: int | None
    params: dict[str, Any]
    before_fingerprint: str
    before_state: dict[str, Any]
    idempotency_key: str
    state: str
    requires_approval: bool
    approval: ApprovalOut | None = Field(None, description="the standing (unrevoked) decision")
    approval_valid: bool
    outcome: dict[str, Any] | None = Field(None, description="the first outcome; replays return it verbatim")
    after_fingerprint: str
    postcondition: dict[str, Any] | None
    refusal_code: str
    executed_at: datetime | None
    executed_by: str
    created_by: str
    created_at: datetime
    replayed: bool = False


class NoteIn(Strict):
    note: str = Field("", max_length=500)


class AuthorityChangeOut(Schema):
    id: int
    intent_id: int
    kind: str
    before: dict[str, Any]
    after: dict[str, Any]
    created_at: datetime


def _intent_out(intent: WriteIntent, *, replayed: bool = False, project: Project | None = None) -> dict:
    project = project or Project.objects.get(id=intent.project_id)
    standing = intent_actions.standing_approval(intent)
    return {
        **{f: getattr(intent, f) for f in (
            "id", "project_id", "session_id", "run_id", "kind", "artifact_id", "params", "before_fingerprint",
            "before_state", "idempotency_key", "state", "outcome", "after_fingerprint", "postcondition", "refusal_code",
            "executed_at", "executed_by", "created_by", "created_at",
        )},
        "requires_approval": project.requires_write_approval,
        "approval": standing,
        "approval_valid": intent_actions.approval_problem(intent, standing, project) is None,
        "replayed": replayed,
    }


@intents_router.get(
    "/write-intents/before-state", response={200: BeforeStateOut, **errors(403, 404)},
    summary="The current before-state (and its fingerprint) a write intent must name",
)
def before_state(request: HttpRequest, kind: KindName, artifact_id: int | None = None) -> dict:
    state = intent_actions.read_before_state(caller(request), kind=kind, artifact_id=artifact_id)
    return {"kind": state.kind, "artifact_id": state.artifact_id, "state": state.state, "before_fingerprint": state.fingerprint}


@intents_router.post(
    "/write-intents", response={200: WriteIntentOut, 201: WriteIntentOut, **errors(403, 404, 409, 413)},
    summary="Propose a consequential write (201; 200 replays the same idempotency key)",
    description="409 `stale_precondition` (the before-state you saw is not current), `idempotency_key_reused`.",
)
def create_intent(request: HttpRequest, body: WriteIntentIn) -> Status:
    made = intent_actions.create_intent(
        caller(request), kind=body.kind, idempotency_key=body.idempotency_key, before_fingerprint=body.before_fingerprint,
        params=body.params, artifact_id=body.artifact_id, session_id=body.session_id, run_id=body.run_id,
    )
    return Status(201 if made.created else 200, _intent_out(made.intent, replayed=not made.created))


@intents_router.get("/write-intents", response={200: Page[WriteIntentOut], **errors(403)}, summary="List write intents")
def list_intents(request: HttpRequest, state: IntentStateName | None = None, session_id: int | None = None,
                 after: int | None = page_after(), limit: int = page_limit()) -> dict:
    who = caller(request)
    who.require("read")
    qs = who.scope("write_intent", WriteIntent.objects.filter(project_id__in=who.project_ids))
    if state:
        qs = qs.filter(state=state)
    if session_id is not None:
        qs = qs.filter(session_id=session_id)
    page = keyset(qs, after=after, limit=limit)
    project = who.single_project()
    return {"items": [_intent_out(i, project=project) for i in page["items"]], "next_after": page["next_after"]}


@intents_router.get("/write-intents/{intent_id}", response={200: WriteIntentOut, **errors(403, 404)}, summary="Get a write intent")
def get_intent(request: HttpRequest, intent_id: int) -> dict:
    who = caller(request)
    who.require("read")
    qs = who.scope("write_intent", WriteIntent.objects.filter(project_id__in=who.project_ids))
    return _intent_out(get_or_404(qs, "write intent", id=intent_id))


@intents_router.post(
    "/write-intents/{intent_id}/approve", response={200: WriteIntentOut, **errors(403, 404, 409)},
    summary="Approve (or re-approve) a write intent (permission `approve`)",
)
def approve(request: HttpRequest, intent_id: int, body: NoteIn | None = None) -> dict:
    return _intent_out(intent_actions.approve_intent(caller(request), intent_id, note=body.note if body else ""))


@intents_router.post(
    "/write-intents/{intent_id}/reject", response={200: WriteIntentOut, **errors(403, 404, 409)},
    summary="Reject a write intent (permission `approve`; final)",
)
def reject(request: HttpRequest, intent_id: int, body: NoteIn | None = None) -> dict:
    return _intent_out(intent_actions.reject_intent(caller(request), intent_id, note=body.note if body else ""))


@intents_router.post(
    "/write-intents/{intent_id}/revoke-approval", response={200: WriteIntentOut, **errors(403, 404, 409)},
    summary="Revoke the standing approval (permission `approve`)",
)
def revoke(request: HttpRequest, intent_id: int, body: NoteIn | None = None) -> dict:
    return _intent_out(intent_actions.revoke_approval(caller(request), intent_id, note=body.note if body else ""))


@intents_router.post(
    "/write-intents/{intent_id}/execute", response={200: WriteIntentOut, **errors(403, 404, 409, 500)},
    summary="Execute: compare-and-swap on the before-state; replays return the first outcome",
    description="409 `approval_required` (the project requires a standing, current approval — nothing else counts), "
    "`stale_precondition` (recorded: the intent is refused for good), `intent_closed`. "
    "500 `postcondition_failed` (rolled back).",
)
def execute(request: HttpRequest, intent_id: int) -> dict:
    done = intent_actions.execute_intent(caller(request), intent_id)
    return _intent_out(done.intent, replayed=done.replayed)


@intents_router.get(
    "/authority/changes", response={200: Page[AuthorityChangeOut], **errors(403)},
    summary="History of the project's authority and framework changes",
)
def authority_changes(request: HttpRequest, after: int | None = page_after(), limit: int = page_limit()) -> dict:
    who = caller(request)
    who.require("read")
    qs = who.scope("authority_change", AuthorityChange.objects.filter(project_id__in=who.project_ids))
    return keyset(qs, after=after, limit=limit)


# ---- bindings ------------------------------------------------------------------------------------------
class BindingOut(Schema):
    session_id: int
    status: str
    checkpoint_id: int
    bound: dict[str, Any]
    changed: dict[str, Any]
    markable: bool = Field(..., description="idle/completed: mark-stale moves it to stale")


class MarkStaleIn(Strict):
    session_ids: list[int] | None = Field(None, description="default: every eligible session of the project",
                                          json_schema_extra={"maxItems": binding_actions.MAX_MARK_STALE})


class MarkStaleOut(Schema):
    marked: list[BindingOut]
    skipped: list[dict[str, Any]]


def _binding_out(b: binding_actions.Binding) -> dict:
    return {"session_id": b.session.id, "status": b.session.status, "checkpoint_id": b.checkpoint_id, "bound": b.bound,
            "changed": b.changed, "markable": b.markable}


@bindings_router.get(
    "/bindings/invalidated", response={200: list[BindingOut], **errors(403)},
    summary="Sessions whose latest checkpoint binds outdated authority or framework",
)
def invalidated(request: HttpRequest) -> list[dict]:
    return [_binding_out(b) for b in binding_actions.invalidated_bindings(caller(request))]


@bindings_router.post(
    "/bindings/mark-stale", response={200: MarkStaleOut, **errors(403)},
    summary="Mark idle/completed sessions bound to outdated authority `stale` (permission `approve`)",
)
def mark_stale(request: HttpRequest, body: MarkStaleIn | None = None) -> dict:
    done = binding_actions.mark_stale(caller(request), session_ids=body.session_ids if body else None)
    return {"marked": [_binding_out(b) for b in done.marked], "skipped": done.skipped}


# ---- routing -------------------------------------------------------------------------------------------
class RoutedRuntimeOut(Schema):
    runtime_id: int
    session_id: int
    session_role: str
    session_status: str
    runtime_family: str
    generation: int
    capabilities: list[str]
    lease_expires_at: datetime


@routing_router.get(
    "/routing/runtimes", response={200: list[RoutedRuntimeOut], **errors(403)},
    summary="Live runtimes of your project that declare every given capability",
)
def route(request: HttpRequest, capability: list[ShortNameDeclared] = Query(..., description="repeat for several",
                                                                      max_length=rt.MAX_CAPABILITIES)) -> list[dict]:  # noqa: B008
    found = routing_actions.eligible_runtimes(caller(request), capability)
    return [
        {"runtime_id": r.id, "session_id": r.session_id, "session_role": r.session.role,
         "session_status": r.session.status, "runtime_family": r.runtime_family, "generation": r.generation,
         "capabilities": r.capabilities, "lease_expires_at": r.lease_expires_at}
        for r in found
    ]
