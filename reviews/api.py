"""Review API: writers/managers open and read gates; agent reviewers claim packets and bind verdicts.

Two audiences, two scopes:

* gates (``/sessions/{id}/review-gates``, ``/review-gates/{id}``) are read through
  ``caller.sessions()``: a token bound to a reviewer session never sees the writer's gates;
* packets (``/review-packets…``) are read through the reviewer's own assignments: a packet
  that is not assigned to the calling reviewer session is 404.

Packet and verdict outputs are built from the stored packet and the caller's own verdict only;
calibration material and other reviewers' verdicts have no field to travel in.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

from django.db.models import Prefetch, QuerySet
from django.http import HttpRequest
from ninja import Field, Router, Schema, Status

from novelforge_sessions.access import Caller
from novelforge_sessions.actions.lifecycle import BIGINT_MAX
from novelforge_sessions.apikit.common import RUNTIME_GONE, caller, errors, get_or_404, keyset, require_json_media_type
from novelforge_sessions.apikit.schemas import (
    MAX_BODY_DEPTH, NON_BLANK_TEXT, Page, Strict, idempotency_key_field, loads_json, max_bytes, nested_deeper_than, page_after, page_limit,
    refuse_unstorable_text,
)
from novelforge_sessions.errors import MalformedBody
from novelforge_sessions.session_runtime import FINGERPRINT_PATTERN
from reviews import actions, packets
from reviews.access import assignment_for, assignments_for, reviewer_for_caller
from reviews.models import ReviewAssignment, ReviewGate, Verdict
from reviews.packets import DECISIONS, SEVERITIES

router = Router(tags=["reviews"])

#: The states a reviewer's own assignment can be in (an ``open`` slot is nobody's yet).
QueueState = Literal[tuple(s.value for s in ReviewAssignment.State if s != ReviewAssignment.State.OPEN)]  # type: ignore[valid-type]


# ---- schemas ---------------------------------------------------------------------------
class ScaleIn(Strict):
    # min < max and max - min <= MAX_SCALE_SPAN compare the two fields: JSON Schema cannot state
    # it, so the description does (422 names `rubric.criteria[i].scale.max`).
    __doc__ = (f"An integer scale: `min < max` and `max - min <= {packets.MAX_SCALE_SPAN}` (at most "
               f"{packets.MAX_SCALE_SPAN + 1} scores); else 422 naming `rubric.criteria[i].scale.max`.")

    min: int
    max: int


class CriterionIn(Strict):
    key: str = Field(..., examples=["clarity"], json_schema_extra={"pattern": packets.KEY_PATTERN})
    label: str = Field(..., examples=["Clarity"], description="not blank",
                       json_schema_extra={"minLength": 1, "maxLength": packets.MAX_LABEL, "pattern": NON_BLANK_TEXT})
    scale: ScaleIn
    description: str = Field("", json_schema_extra={"maxLength": packets.MAX_DESCRIPTION})
    anchors: dict[str, str] = Field(
        default_factory=dict, examples=[{"1": "Confusing", "5": "Crystal clear"}],
        json_schema_extra={
            "propertyNames": {"pattern": packets.SCORE_KEY_PATTERN},
            "additionalProperties": {"type": "string", "minLength": 1, "maxLength": packets.MAX_ANCHOR,
                                     "pattern": NON_BLANK_TEXT},
        },
        description="optional: what scores mean, for some or all scores of the scale (e.g. its ends). Keys are scores "
        "written as integers (JSON keys are strings), within the scale; labels are 1–80 characters, not blank. Shown to reviewers "
        "beside the score buttons and in the relay prompt; 422 names the anchor (`rubric.criteria[i].anchors.<score>`).",
    )


class RubricIn(Strict):
    criteria: list[CriterionIn] = Field(..., json_schema_extra={"minItems": 1, "maxItems": packets.MAX_CRITERIA})
    evidence: list[str] = Field(default_factory=list, description="evidence keys the rubric allows",
                                json_schema_extra={"items": {"type": "string", "pattern": packets.KEY_PATTERN},
                                                   "uniqueItems": True, "maxItems": packets.MAX_EVIDENCE_ITEMS})


class EvidenceIn(Strict):
    key: str = Field(..., description="must be one of the rubric's evidence keys")
    label: str = Field(..., description="not blank", json_schema_extra={
        "minLength": 1, "maxLength": packets.MAX_EVIDENCE_LABEL, "pattern": NON_BLANK_TEXT})
    # Bounded in bytes (UTF-8); maxLength states the same number in characters, the most that many bytes hold.
    content: str = Field(..., description="not blank; `maxLength` states the byte bound in characters",
                         json_schema_extra=max_bytes(packets.MAX_EVIDENCE_BYTES, maxLength=packets.MAX_EVIDENCE_BYTES,
                                                     minLength=1, pattern=NON_BLANK_TEXT))


class CalibrationIn(Strict):
    expected_decision: Literal["pass", "revise", "reject"] | None = None
    expected_scores: dict[str, int] = Field(default_factory=dict)
    answer_key: str = Field("", json_schema_extra={"maxLength": actions.MAX_ANSWER_KEY})


class GateIn(Strict):
    candidate_version_id: int = Field(..., description="an artifact version of this project; its server fingerprint is frozen")
    rubric: RubricIn
    evidence: list[EvidenceIn] = Field(
        default_factory=list, json_schema_extra={"maxItems": packets.MAX_EVIDENCE_ITEMS},
        description=f"the evidence the rubric declares, each item at most {packets.MAX_EVIDENCE_BYTES} bytes; all of it "
        "travels in this one body, which is bounded as a whole (`x-max-body-bytes`): items at their maximum do not "
        "all fit (413 `payload_too_large`)",
    )
    route: Literal["page", "relay", "agent"]
    required_verdicts: int | None = Field(
        None, ge=1, le=actions.MAX_REVIEWERS,
        description=f"default: every named reviewer (page, relay) or reviewer session (agent, at least 1). Page and "
        f"relay: at most the number of `reviewers`; agent: from the number of `reviewer_session_ids` to "
        f"{actions.MAX_AGENT_VERDICTS}",
    )
    reviewers: list[str] = Field(default_factory=list, description="usernames with the reviewer role (page/relay)",
                                 json_schema_extra={"maxItems": actions.MAX_REVIEWERS, "uniqueItems": True})
    reviewer_session_ids: list[int] = Field(
        default_factory=list, description="agent route: semantic_reviewer sessions to assign (one verdict each, at "
        f"most {actions.MAX_AGENT_VERDICTS}); other slots are claimable",
        json_schema_extra={"maxItems": actions.MAX_AGENT_VERDICTS, "uniqueItems": True},
    )
    calibration: CalibrationIn | None = Field(
        None, description="hidden: scores reviewers afterwards; never in a packet, a page for reviewers or an event"
    )
    runtime_id: int | None = Field(
        None, ge=1, description="the opening runtime (generation fencing): required once the session has had a "
        "second runtime generation; 409 stale_runtime when it is not the live one",
    )
    idempotency_key: str | None = idempotency_key_field("session")

    # Each route takes its own reviewers: page and relay name users (at least one), the agent
    # route reviewer sessions and at most MAX_AGENT_VERDICTS verdicts (actions.validate_gate_spec).
    json_schema_rules: ClassVar[dict[str, Any]] = {
        "if": {"properties": {"route": {"const": "agent"}}, "required": ["route"]},
        "then": {"properties": {
            "required_verdicts": {"maximum": actions.MAX_AGENT_VERDICTS},
            "reviewer_session_ids": {"maxItems": actions.MAX_AGENT_VERDICTS},
            "reviewers": {"maxItems": 0},
        }},
        "else": {"properties": {"reviewer_session_ids": {"maxItems": 0}, "reviewers": {"minItems": 1}},
                 "required": ["reviewers"]},
    }


class AssignmentOut(Schema):
    id: int
    reviewer: str
    state: str


class FindingOut(Schema):
    location: str
    severity: str
    note: str


class VerdictOut(Schema):
    id: int
    packet_id: int
    reviewer: str
    channel: str
    decision: str
    scores: dict[str, int]
    findings: list[FindingOut]
    confidence: float
    packet_fingerprint: str
    artifact_fingerprint: str
    fingerprint: str
    bound_at: datetime


class GateOut(Schema):
    id: int
    session_id: int
    run_id: int
    route: str
    state: str
    outcome: str
    required_verdicts: int
    bound_verdicts: int
    candidate_version_id: int
    candidate_fingerprint: str
    packet_id: int
    packet_fingerprint: str
    has_calibration: bool
    routing: dict[str, Any] = Field(
        ..., description="page and relay routes: what routing saw when the gate was opened — "
        "`live_agent_reviewer_count`, the live agent reviewers (eligible reviewer sessions whose live runtime declares "
        "`review`) that could have taken it, and `live_agent_reviewers` (`session_id`, `runtime_family`; at most 10), "
        "listing only sessions within the caller's reach: a token bound to a session sees the count, not other "
        "sessions' ids",
    )
    assignments: list[AssignmentOut]
    verdicts: list[VerdictOut]
    created_at: datetime
    completed_at: datetime | None


class PacketSummaryOut(Schema):
    packet_id: int
    assignment_id: int
    fingerprint: str
    route: str
    state: str
    assigned_at: datetime | None


class PacketOut(Schema):
    id: int
    fingerprint: str
    route: str
    assignment_id: int
    state: str
    content: dict[str, Any] = Field(..., description="the blind packet: instructions, candidate, rubric, evidence, verdict_schema")
    verdict: VerdictOut | None = Field(None, description="your own verdict, once bound")


class PacketLeaseOut(Schema):
    handoff_id: int
    fencing_token: int = Field(..., description="cite it in your verdict and heartbeats; a later claim supersedes it")
    lease_expires_at: datetime
    attempt: int


class PacketClaimOut(Schema):
    packet: PacketOut | None = Field(None, description="null when no packet is waiting for you")
    lease: PacketLeaseOut | None = Field(None, description="your claim of the packet's control-plane handoff")


class PacketHeartbeatIn(Strict):
    fencing_token: int = Field(..., ge=1, json_schema_extra={"maximum": BIGINT_MAX})


_VERDICT_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "description": "A typed verdict. The exact schema for a packet (criteria and scales) is in the packet's "
                "`content.verdict_schema`; it is enforced field by field (422 names the field).",
                "required": ["fencing_token", "packet_fingerprint", "artifact_fingerprint", "decision", "scores", "findings",
                             "confidence"],
                "properties": {
                    "fencing_token": {"type": "integer", "minimum": 1, "maximum": BIGINT_MAX,
                                      "description": "the fencing token of your claim (agent route)"},
                    "packet_fingerprint": {"type": "string", "pattern": FINGERPRINT_PATTERN},
                    "artifact_fingerprint": {"type": "string", "pattern": FINGERPRINT_PATTERN},
                    "decision": {"enum": list(DECISIONS)},
                    "scores": {"type": "object", "additionalProperties": {"type": "integer"}},
                    "findings": {
                        "type": "array",
                        "maxItems": packets.MAX_FINDINGS,
                        "description": "the body is bounded as a whole (`x-max-body-bytes`): "
                        f"{packets.MAX_FINDINGS} findings with notes at their maximum do not all fit "
                        "(413 `payload_too_large`)",
                        "items": {
                            "type": "object",
                            "properties": {
                                "location": {"type": "string", "minLength": 1, "maxLength": packets.MAX_LOCATION,
                                             "pattern": NON_BLANK_TEXT,
                                             "description": "line(s) of the candidate: `L3`, `L3-5` "
                                             "or `L3, L7`; 422 `findings[i].location` when a line is outside the candidate"},
                                "severity": {"enum": list(SEVERITIES)},
                                "note": {"type": "string", "minLength": 1, "maxLength": packets.MAX_NOTE,
                                         "pattern": NON_BLANK_TEXT},
                            },
                        },
                    },
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                },
            }
        }
    },
}


# ---- renderers -------------------------------------------------------------------------
def verdict_out(v: Verdict) -> dict[str, Any]:
    return {
        "id": v.id, "packet_id": v.packet_id, "reviewer": v.reviewer, "channel": v.channel, "decision": v.decision,
        "scores": v.scores, "findings": v.findings, "confidence": v.confidence,
        "packet_fingerprint": v.packet_fingerprint, "artifact_fingerprint": v.artifact_fingerprint,
        "fingerprint": v.fingerprint, "bound_at": v.bound_at,
    }


def routing_out(routing: dict[str, Any], who: Caller) -> dict[str, Any]:
    """A gate's routing record as far as ``who`` reaches (``access.BOUND_TOKEN_MATRIX``,
    ``routing``): a token bound to a session reaches only its own session's runtimes, so it learns
    how many live agent reviewers could have taken the gate, never which sessions they are."""
    listed = routing.get("live_agent_reviewers")
    if not isinstance(listed, list):
        return routing
    if who.bound_for("routing") is not None:
        listed = [r for r in listed if isinstance(r, dict) and r.get("session_id") == who.session_id]
    # A record written before the count was stored: it listed them all (up to its limit).
    count = routing.get("live_agent_reviewer_count", len(routing["live_agent_reviewers"]))
    return {**routing, "live_agent_reviewers": listed, "live_agent_reviewer_count": count}


def gate_out(g: ReviewGate, who: Caller) -> dict[str, Any]:
    packet = g.packet
    return {
        "id": g.id, "session_id": g.session_id, "run_id": g.run_id, "route": g.route, "state": g.state,
        "outcome": g.outcome, "required_verdicts": g.required_verdicts, "bound_verdicts": g.bound_verdicts,
        "candidate_version_id": g.candidate_id, "candidate_fingerprint": g.candidate_fingerprint,
        "packet_id": packet.id, "packet_fingerprint": packet.fingerprint,
        "has_calibration": hasattr(g, "calibration"), "routing": routing_out(g.routing, who),
        "assignments": [{"id": a.id, "reviewer": a.reviewer, "state": a.state} for a in packet.assignments.all()],
        "verdicts": [verdict_out(v) for v in packet.verdicts.all()],
        "created_at": g.created_at, "completed_at": g.completed_at,
    }


def _gates(qs: QuerySet[ReviewGate]) -> QuerySet[ReviewGate]:
    return qs.select_related("packet", "calibration").prefetch_related(
        Prefetch("packet__assignments", queryset=ReviewAssignment.objects.order_by("id")),
        Prefetch("packet__verdicts", queryset=Verdict.objects.order_by("id")),
    )


def packet_out(a: ReviewAssignment) -> dict[str, Any]:
    packet = a.packet
    verdict = Verdict.objects.filter(assignment=a).first()
    return {
        "id": packet.id, "fingerprint": packet.fingerprint, "route": packet.gate.route, "assignment_id": a.id,
        "state": a.state, "content": packet.content, "verdict": verdict_out(verdict) if verdict else None,
    }


# ---- gates (writers and managers) ------------------------------------------------------
@router.post(
    "/sessions/{session_id}/review-gates", response={201: GateOut, **errors(403, 404, 409)},
    summary="Open a review gate: freeze a candidate + rubric, build the blind packet, route it",
    description="Needs the open run of a `running` writer/manager session. A `page` or `relay` route moves the "
    "session to `awaiting_user` until the required verdicts are bound. Reviewers must be independent "
    "(403 `independence_violation`). With an `idempotency_key` (scoped to the session) the same key and body "
    "answer 201 with the gate the first request opened, writing nothing; another body is 409 "
    "`idempotency_key_reused`. " + RUNTIME_GONE,
)
def open_gate(request: HttpRequest, session_id: int, body: GateIn):
    spec = actions.GateSpec(
        candidate_version_id=body.candidate_version_id, rubric=body.rubric.model_dump(),
        evidence=[e.model_dump() for e in body.evidence], route=body.route, required_verdicts=body.required_verdicts,
        reviewers=body.reviewers, reviewer_session_ids=body.reviewer_session_ids,
        calibration=body.calibration.model_dump() if body.calibration else None, runtime_id=body.runtime_id,
    )
    who = caller(request)
    gate = actions.open_gate(who, session_id, spec, idempotency_key=body.idempotency_key)
    return Status(201, gate_out(_gates(ReviewGate.objects).get(id=gate.id), who))


@router.get(
    "/sessions/{session_id}/review-gates", response={200: Page[GateOut], **errors(403, 404)},
    summary="A session's review gates, with their bound verdicts",
)
def list_gates(request: HttpRequest, session_id: int, after: int | None = page_after(), limit: int = page_limit()):
    who = caller(request)
    who.require("read")
    session = get_or_404(who.sessions(), "session", id=session_id)
    page = keyset(_gates(ReviewGate.objects.filter(session=session)), after=after, limit=limit)
    return {"items": [gate_out(g, who) for g in page["items"]], "next_after": page["next_after"]}


@router.get("/review-gates/{gate_id}", response={200: GateOut, **errors(403, 404)}, summary="Get a review gate")
def get_gate(request: HttpRequest, gate_id: int):
    who = caller(request)
    who.require("read")
    qs = who.scope("review_gate", ReviewGate.objects.filter(project_id__in=who.project_ids))
    return gate_out(get_or_404(_gates(qs), "review gate", id=gate_id), who)


@router.post(
    "/review-gates/{gate_id}/cancel", response={200: GateOut, **errors(403, 404, 409)},
    summary="Withdraw a pending gate (a waiting session goes back to running)",
)
def cancel_gate(request: HttpRequest, gate_id: int):
    who = caller(request)
    gate = actions.cancel_gate(who, gate_id)
    return gate_out(_gates(ReviewGate.objects).get(id=gate.id), who)


# ---- packets (agent reviewers) ---------------------------------------------------------
#: Claim, heartbeat and verdict are the reviewer session's own work (reviews.access.check_reviewer_can_work).
REVIEWER_AT_WORK = (
    "Your session must be able to work: 409 `session_terminated` when it can never run again (`completed`, `stale`, "
    "`terminated`), 409 `no_live_runtime` when it has no live runtime by its lease, 409 `handoff_not_claimable` "
    "(`details.missing_capabilities`) when that runtime does not declare `review`; nothing is written."
)


@router.post(
    "/review-packets/claim", response={200: PacketClaimOut, **errors(403, 404, 409)},
    summary="Claim the oldest open agent-route packet you are independent of, under a lease",
    description="Needs a token with the `review` permission bound to your own `semantic_reviewer` session "
    "(memory `none` or `bounded`). Claims the packet slot's control-plane handoff: `lease` carries its "
    "`handoff_id`, `fencing_token` and `lease_expires_at` (renew with `…/heartbeat`). A claim whose lease "
    "expired is claimable again by another eligible reviewer (attempt + 1, a new fencing token). "
    "`packet` and `lease` are null when nothing is waiting; 409 `already_claimed` when you already hold a "
    "slot on that packet. " + REVIEWER_AT_WORK,
)
def claim_packet(request: HttpRequest):
    who = caller(request)
    identity = reviewer_for_caller(who, working=True)
    claim = actions.claim_packet(identity, token_id=who.token_id)
    if claim is None:
        return {"packet": None, "lease": None}
    h = claim.handoff
    return {"packet": packet_out(claim.assignment),
            "lease": {"handoff_id": h.id, "fencing_token": h.fencing_token, "lease_expires_at": h.lease_expires_at,
                      "attempt": h.attempt}}


@router.post(
    "/review-packets/{packet_id}/heartbeat", response={200: PacketLeaseOut, **errors(403, 404, 409)},
    summary="Renew the lease of your claim on a packet",
    description="409 `stale_lease` when a later claim superseded your fencing token (your lease expired and "
    "another reviewer took the packet); 409 `handoff_not_claimable`/`handoff_closed` when the claim takes no "
    "more heartbeats (e.g. your verdict is bound). " + REVIEWER_AT_WORK,
)
def heartbeat_packet(request: HttpRequest, packet_id: int, body: PacketHeartbeatIn):
    identity = reviewer_for_caller(caller(request), working=True)
    lease = actions.heartbeat_packet(identity, packet_id, fencing_token=body.fencing_token)
    return {"handoff_id": lease.handoff_id, "fencing_token": lease.fencing_token,
            "lease_expires_at": lease.lease_expires_at, "attempt": lease.attempt}


@router.get(
    "/review-packets", response={200: Page[PacketSummaryOut], **errors(403)},
    summary="Packets assigned to you (oldest first)",
)
def list_packets(request: HttpRequest, state: QueueState | None = None,
                 after: int | None = page_after(), limit: int = page_limit()):
    identity = reviewer_for_caller(caller(request))
    qs = assignments_for(identity).select_related("packet__gate")
    if state:
        qs = qs.filter(state=state)
    page = keyset(qs, after=after, limit=limit)
    items = [
        {"packet_id": a.packet_id, "assignment_id": a.id, "fingerprint": a.packet.fingerprint,
         "route": a.packet.gate.route, "state": a.state, "assigned_at": a.assigned_at}
        for a in page["items"]
    ]
    return {"items": items, "next_after": page["next_after"]}


@router.get(
    "/review-packets/{packet_id}", response={200: PacketOut, **errors(403, 404)},
    summary="Read a packet assigned to you",
)
def get_packet(request: HttpRequest, packet_id: int):
    identity = reviewer_for_caller(caller(request))
    return packet_out(assignment_for(identity, packet_id))


@router.post(
    "/review-packets/{packet_id}/verdicts", response={200: VerdictOut, 201: VerdictOut, **errors(400, 403, 404, 409)},
    summary="Bind your typed verdict (201; an identical resubmission is 200 with the same verdict)",
    description="Cite your claim's `fencing_token` (422 `fencing_token` without it). 409 `stale_lease` when a later "
    "claim superseded it (nothing stored); 409 `stale_fingerprint` when the cited packet/artifact fingerprint is "
    "not this packet's or the candidate changed; 409 `verdict_conflict` for a different second verdict; 422 names "
    "the offending field (a finding whose location names no line of the candidate: `findings[i].location`). Binding also records the handoff's delivery and consume-once receipt. " + REVIEWER_AT_WORK
    + " The one exception: an identical resubmission of the verdict you bound, under the same claim, is answered "
    "200 with that verdict even when your session can no longer work (a retried delivery gets the first answer).",
    openapi_extra={"requestBody": _VERDICT_BODY},
)
def submit_verdict(request: HttpRequest, packet_id: int):
    # Whether an agent reviewer can still work is checked by the action: an identical
    # resubmission of its bound verdict is answered even when it no longer can.
    identity = reviewer_for_caller(caller(request))
    if request.body:
        require_json_media_type(request)
    try:
        payload = loads_json(request.body or b"null")  # NaN/Infinity/1e999: a typed 422 naming the field
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested ~1,000 levels deep
        raise MalformedBody("the request body is not valid JSON") from None
    # Parsed by hand, so neither the API's parser nor schemas.Input checked it: the same checks here.
    if nested_deeper_than(payload, MAX_BODY_DEPTH):
        raise MalformedBody(f"the request body nests deeper than {MAX_BODY_DEPTH} levels",
                            max_depth=MAX_BODY_DEPTH)
    refuse_unstorable_text(payload)
    # The lease's token travels with the verdict but is not part of it (nor of its fingerprint).
    token = payload.pop("fencing_token", None) if isinstance(payload, dict) else None
    bound = actions.bind_verdict(identity, packet_id, payload, channel=Verdict.Channel.API, fencing_token=token)
    return Status(201 if bound.created else 200, verdict_out(bound.verdict))
