"""Review writes: open a gate, claim a packet (a control-plane handoff), bind a verdict, cancel a gate.

Each action validates with the pure modules first (``packets``, ``verdicts``), then runs one
``transaction.atomic()`` that locks the gate's session row first (the global lock order:
session, then its run, then everything hanging off it), writes, and appends its events last.

Events carry ids, fingerprints and states only — never packet content, calibration material,
decisions or scores — because anything in the event log can reach a websocket subscriber.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Window
from django.utils import timezone

from novelforge_sessions import events
from novelforge_sessions import event_types as ev
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.actions import idempotency
from novelforge_sessions.actions.lifecycle import (
    BIGINT_MAX, Outbox, apply_transition, check, fence_runtime, lock_session, move, move_rows, open_run,
    require_live_runtime,
)
from novelforge_sessions.actions.runtimes import wake_waiting_session
from novelforge_sessions.control import service as control
from novelforge_sessions.control.models import UNBOUND_STATES, Handoff, HandoffPurpose, HandoffState
from novelforge_sessions.errors import (
    AlreadyClaimed,
    Forbidden,
    GateClosed,
    HandoffNotClaimable,
    IndependenceViolation,
    NoLiveRuntime,
    NoOpenRun,
    NotFound,
    SessionNotRunning,
    SessionTerminated,
    StaleFingerprint,
    StaleLease,
    ValidationFailed,
    VerdictConflict,
)
from novelforge_sessions.models import (
    LIVE_RUNTIME_PARAMS, Artifact, ArtifactVersion, Event, KeyedOperation, Membership, RuntimeAttachment, Run, Session,
)
from reviews import packets, verdicts
from reviews.access import (
    REVIEW_CAPABILITY,
    ReviewerIdentity,
    assignment_for,
    check_blind,
    check_independence,
    check_reviewer_can_work,
    eligible_reviewer_sessions,
    reviewer_runtimes,
    session_key,
    user_key,
)
from reviews.models import GateCalibration, ReviewAssignment, ReviewGate, ReviewPacket, Verdict

MAX_REVIEWERS = 20
MAX_AGENT_VERDICTS = 10
MAX_ANSWER_KEY = 20_000
#: How long an agent reviewer's claim lasts without a heartbeat (the handoff's timeout).
AGENT_REVIEW_LEASE_SECONDS = 600
#: What an agent review handoff's result (the bound verdict) looks like to the control plane.
_VERDICT_RESULT_SCHEMA = {"decision": "string", "scores": "object", "findings": "array", "confidence": "number",
                          "packet_fingerprint": "string", "artifact_fingerprint": "string"}
#: Sessions that may open a gate on their own work (docs/model.md#roles-and-memory-policies: writer, or the manager).
GATE_OPENER_ROLES = frozenset({rt.SessionRole.WRITER.value, rt.SessionRole.MANAGER.value})


# ------------------------------------------------------------------------------------------
# Opening a gate
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GateSpec:
    candidate_version_id: int
    rubric: Any
    route: str
    evidence: Any = None
    required_verdicts: int | None = None
    reviewers: list[str] = field(default_factory=list)  # usernames (page/relay)
    reviewer_session_ids: list[int] = field(default_factory=list)  # agent route, optional
    calibration: dict[str, Any] | None = None
    #: the opening runtime (docs/model.md#generation-fencing): required once the session has had a
    #: second generation, checked against the live runtime whenever given
    runtime_id: int | None = None


@dataclass(frozen=True)
class _ValidGate:
    rubric: packets.Rubric
    evidence: tuple[packets.EvidenceItem, ...]
    route: str
    required: int
    reviewers: list[str]
    sessions: list[int]
    calibration: dict[str, Any] | None


def _validate_calibration(value: Any, rubric: packets.Rubric) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"expected_decision", "expected_scores", "answer_key"}:
        raise ValidationFailed("calibration is {expected_decision, expected_scores, answer_key}", field="calibration")
    decision = value.get("expected_decision") or ""
    if decision and decision not in packets.DECISIONS:
        raise ValidationFailed("expected_decision must be pass, revise or reject", field="calibration.expected_decision")
    scores = value.get("expected_scores") or {}
    if not isinstance(scores, dict):
        raise ValidationFailed("expected_scores must be an object", field="calibration.expected_scores")
    for key, score in scores.items():
        criterion = rubric.criterion(key)
        where = f"calibration.expected_scores.{key}"
        if criterion is None:
            raise ValidationFailed("not a criterion of the rubric", field=where)
        if not isinstance(score, int) or isinstance(score, bool) or not criterion.min <= score <= criterion.max:
            raise ValidationFailed(f"must be an integer from {criterion.min} to {criterion.max}", field=where)
    answer_key = value.get("answer_key") or ""
    if not isinstance(answer_key, str) or len(answer_key) > MAX_ANSWER_KEY:
        raise ValidationFailed(f"answer_key must be a string of at most {MAX_ANSWER_KEY} characters", field="calibration.answer_key")
    return {"expected_decision": decision, "expected_scores": scores, "answer_key": answer_key}


def validate_gate_spec(spec: GateSpec) -> _ValidGate:
    """Everything that needs no database: route, rubric, evidence, counts, calibration."""
    if spec.route not in packets.ROUTES:
        raise ValidationFailed("route must be page, relay or agent", field="route", allowed=list(packets.ROUTES))
    rubric = check(packets.validate_rubric, spec.rubric)
    evidence = check(packets.validate_evidence, spec.evidence, rubric)
    reviewers, sessions = list(spec.reviewers or []), list(spec.reviewer_session_ids or [])
    if len(set(reviewers)) != len(reviewers) or len(reviewers) > MAX_REVIEWERS:
        raise ValidationFailed(f"reviewers must be unique usernames (at most {MAX_REVIEWERS})", field="reviewers")
    if len(set(sessions)) != len(sessions):
        raise ValidationFailed("reviewer_session_ids must be unique", field="reviewer_session_ids")
    if spec.route == ReviewGate.Route.AGENT:
        if reviewers:
            raise ValidationFailed("the agent route takes reviewer sessions, not users", field="reviewers")
        if len(sessions) > MAX_AGENT_VERDICTS:
            raise ValidationFailed(
                f"at most {MAX_AGENT_VERDICTS} reviewer sessions (one verdict each; an agent gate takes at most "
                f"{MAX_AGENT_VERDICTS} verdicts)", field="reviewer_session_ids", limit=MAX_AGENT_VERDICTS,
            )
        required = spec.required_verdicts or max(1, len(sessions))
        if not max(1, len(sessions)) <= required <= MAX_AGENT_VERDICTS:
            raise ValidationFailed(
                f"required_verdicts must be from {max(1, len(sessions))} to {MAX_AGENT_VERDICTS}", field="required_verdicts"
            )
    else:
        if sessions:
            raise ValidationFailed("page and relay routes are reviewed by users", field="reviewer_session_ids")
        if not reviewers:
            raise ValidationFailed("name at least one reviewer (a username)", field="reviewers")
        required = spec.required_verdicts or len(reviewers)
        if not 1 <= required <= len(reviewers):
            raise ValidationFailed(
                f"required_verdicts must be from 1 to the number of reviewers ({len(reviewers)})", field="required_verdicts"
            )
    calibration = _validate_calibration(spec.calibration, rubric)
    return _ValidGate(rubric, evidence, spec.route, required, reviewers, sessions, calibration)


#: How many live agent reviewers a gate's routing record names (all of them are counted).
ROUTING_LISTED = 10


def _live_agent_reviewers(writer: Session) -> dict[str, Any]:
    """Routing (docs/model.md#runtime-routing): before a gate waits on a person, record which connected agent
    reviewers could have taken it instead — the live runtimes of eligible reviewer sessions that
    declare ``review`` (``access.reviewer_runtimes``, the rule a claim applies), never the
    writer's own. The record names up to ``ROUTING_LISTED`` and counts them all (one statement);
    readers see the names only within their reach (``api.routing_out``)."""
    rows = list(
        reviewer_runtimes([writer.project_id]).exclude(session_id=writer.id)
        .annotate(total=Window(Count("id")))
        .order_by("session_id")
        .values("session_id", "runtime_family", "total")[:ROUTING_LISTED]
    )
    return {
        "live_agent_reviewers": [{"session_id": r["session_id"], "runtime_family": r["runtime_family"]} for r in rows],
        "live_agent_reviewer_count": rows[0]["total"] if rows else 0,
    }


def open_gate(caller: Caller, session_id: int, spec: GateSpec, *, idempotency_key: str | None = None) -> ReviewGate:
    """Freeze a candidate and rubric for review, build the blind packet, assign reviewers.

    A page or relay route moves the session ``running → awaiting_user``; the agent route
    creates one control-plane handoff per required verdict and moves it ``running →
    awaiting_external``. Either way the open run stays open and continues when the required
    verdicts are bound.

    With an ``idempotency_key`` (scoped to the session), the same key and body answer the gate
    the first request opened, writing nothing; another body is ``idempotency_key_reused``
    (``novelforge_sessions/actions/idempotency.py``).
    """
    caller.require("write")
    key = idempotency.key_for(KeyedOperation.OPEN_GATE, session_id, idempotency_key, asdict(spec))

    def write() -> tuple[ReviewGate, int, idempotency.Answer]:
        gate = _open_gate(caller, session_id, spec)
        return gate, gate.session_id, idempotency.Answer(201, {"id": gate.id})

    return idempotency.once(caller, key, write, lambda first: ReviewGate.objects.get(id=first.data["id"]))


def _open_gate(caller: Caller, session_id: int, spec: GateSpec) -> ReviewGate:
    valid = validate_gate_spec(spec)
    with transaction.atomic():
        session = lock_session(caller, session_id)
        if session.role not in GATE_OPENER_ROLES:
            raise Forbidden("review gates are opened by a writer or manager session", role=session.role)
        # An agent gate only adds handoffs, so a run already awaiting external work may open one;
        # a person-routed gate moves the session to awaiting_user, which only `running` may do.
        may_open = {rt.SessionStatus.RUNNING, rt.SessionStatus.AWAITING_EXTERNAL} \
            if valid.route == ReviewGate.Route.AGENT else {rt.SessionStatus.RUNNING}
        if session.status not in may_open:
            raise SessionNotRunning("a gate is opened by the open run of a running session",
                                    status=session.status)
        # A superseded generation cannot open a gate on the run that now continues the cursor.
        fence_runtime(caller, session, spec.runtime_id)
        run = open_run(session)
        if run is None:
            raise NoOpenRun("a gate is opened by an open run", status=session.status)
        if spec.runtime_id is None:  # a named runtime that passed fencing is the live one
            require_live_runtime(caller, session)  # nor by a runtime whose lease ran out
        try:
            # Through the caller's reach (access.BOUND_TOKEN_MATRIX): a bound token reviews only
            # what it may already read, so opening a gate never grants it another artifact.
            candidate = caller.scope("artifact_version", ArtifactVersion.objects.select_related("artifact"),
                                     versions=[spec.candidate_version_id]).get(
                id=spec.candidate_version_id, artifact__project_id=session.project_id
            )
        except ArtifactVersion.DoesNotExist:
            raise NotFound("artifact version not found", field="candidate_version_id",
                           candidate_version_id=spec.candidate_version_id) from None

        users = _check_human_reviewers(valid.reviewers, session, candidate, caller.label)
        agents = _check_agent_reviewers(valid.sessions, session)
        packet = check(
            packets.build_packet, candidate_content=candidate.content, candidate_fingerprint=candidate.fingerprint,
            rubric=valid.rubric, evidence=valid.evidence,
        )
        gate = ReviewGate.objects.create(
            project_id=session.project_id, session=session, run=run, opened_by=caller.label, candidate=candidate,
            candidate_fingerprint=candidate.fingerprint, head_version_id=candidate.artifact.current_version_id,
            rubric=valid.rubric.as_dict(), evidence=[e.as_dict() for e in valid.evidence], route=valid.route,
            required_verdicts=valid.required,
            routing=_live_agent_reviewers(session) if valid.route != "agent" else {},
        )
        if valid.calibration is not None:
            GateCalibration.objects.create(gate=gate, **valid.calibration)
        stored = ReviewPacket.objects.create(gate=gate, fingerprint=packet.fingerprint, content=packet.content)
        now = timezone.now()
        slots = [
            ReviewAssignment(packet=stored, reviewer=user_key(u.pk), reviewer_user=u, state=ReviewAssignment.State.ASSIGNED,
                             assigned_at=now)
            for u in users
        ] + [
            ReviewAssignment(packet=stored, reviewer=session_key(s.pk), reviewer_session=s,
                             state=ReviewAssignment.State.ASSIGNED, assigned_at=now)
            for s in agents
        ]
        if valid.route == ReviewGate.Route.AGENT:
            slots += [ReviewAssignment(packet=stored, state=ReviewAssignment.State.OPEN)
                      for _ in range(valid.required - len(agents))]

        outbox = Outbox(caller.label)
        outbox.add(
            session, ev.REVIEW_GATE_OPENED, run_id=run.id, gate_id=gate.id, packet_id=stored.id, route=gate.route,
            required_verdicts=gate.required_verdicts, candidate_version_id=candidate.id,
            candidate_fingerprint=candidate.fingerprint, packet_fingerprint=stored.fingerprint, state=gate.state,
        )
        if valid.route == ReviewGate.Route.AGENT:
            _hand_off_slots(session, run, gate, stored, candidate, slots, actor=caller.label, outbox=outbox)
        ReviewAssignment.objects.bulk_create(slots)
        if gate.waits_on_user:
            apply_transition(
                session, rt.SessionStatus.AWAITING_USER, reason=f"review gate {gate.id} waits on a reviewer",
                outbox=outbox, current_run=run,
            )
        outbox.flush()
    return gate


def _hand_off_slots(
    session: Session, run: Run, gate: ReviewGate, packet: ReviewPacket, candidate: ArtifactVersion,
    slots: list[ReviewAssignment], *, actor: str, outbox: Outbox,
) -> None:
    """One control-plane ``review`` handoff per agent slot (the session and run are locked by
    the caller): reachable only through the review routes, never ``/handoffs/…``.

    The frozen job names the candidate (artifact ref + fingerprint) and the packet by id and
    fingerprint only: the packet's content, calibration and verdicts never enter a handoff or
    its events. ``create_job`` moves the session to ``awaiting_external``.
    """
    for n, slot in enumerate(slots, start=1):
        slot.handoff = control.create_job(
            session=session, run=run, logical_id=f"review-{gate.id}-{n}",
            inputs=[{"artifact_id": candidate.artifact_id, "fingerprint": candidate.fingerprint}],
            params={"review_packet_id": packet.id, "packet_fingerprint": packet.fingerprint},
            result_schema=_VERDICT_RESULT_SCHEMA, required_capabilities=[REVIEW_CAPABILITY],
            timeout_seconds=AGENT_REVIEW_LEASE_SECONDS, purpose=HandoffPurpose.REVIEW, actor=actor, outbox=outbox,
        ).handoff


def _check_human_reviewers(usernames: list[str], session: Session, candidate: ArtifactVersion, opener: str) -> list:
    if not usernames:
        return []
    User = get_user_model()
    found = {
        u.get_username(): u
        for u in User.objects.filter(
            username__in=usernames, is_active=True, memberships__project_id=session.project_id,
            memberships__role=Membership.Role.REVIEWER,
        )
    }
    users = []
    for i, name in enumerate(usernames):
        user = found.get(name)
        if user is None:
            raise ValidationFailed("not a reviewer in this project", field=f"reviewers[{i}]")
        if f"user:{name}" in {candidate.created_by, opener}:
            raise IndependenceViolation("a reviewer cannot review their own work", field=f"reviewers[{i}]")
        # A manager of the project, a superuser or staff with an admin view of the writer's
        # records can read past the packet: not blind, so not this gate's reviewer.
        check_blind(user, session.project_id, field=f"reviewers[{i}]")
        users.append(user)
    return users


def _check_agent_reviewers(session_ids: list[int], writer: Session) -> list[Session]:
    """The sessions a gate pre-assigns: each an eligible reviewer session of the writer's project
    (``access.eligible_reviewer_sessions``). Any other id — missing, another project's, another
    role or memory policy, a session that can never run again — gets one and the same 422 with no
    detail about the session: a token bound to a session reaches no other session
    (``access.BOUND_TOKEN_MATRIX``), so naming ids must not tell it which exist or what they are.
    Only the writer's own session, which the caller reaches, is named as such (403
    ``independence_violation``)."""
    if not session_ids:
        return []
    wanted = [sid for sid in session_ids if 0 < sid <= BIGINT_MAX]  # a larger id names no row
    found = {s.id: s for s in eligible_reviewer_sessions([writer.project_id]).filter(id__in=wanted)} if wanted else {}
    sessions = []
    for i, sid in enumerate(session_ids):
        where = f"reviewer_session_ids[{i}]"
        if sid == writer.id:
            raise IndependenceViolation("a session cannot review its own candidate", field=where)
        reviewer = found.get(sid)
        if reviewer is None:
            raise ValidationFailed(
                "not an eligible reviewer session of this project: name a semantic_reviewer session with memory "
                "policy none or bounded that can still run", field=where,
            )
        sessions.append(reviewer)
    return sessions


# ------------------------------------------------------------------------------------------
# Claiming an agent packet
# ------------------------------------------------------------------------------------------
_A, _P, _G, _V = (m._meta.db_table for m in (ReviewAssignment, ReviewPacket, ReviewGate, ArtifactVersion))
# Review eligibility, the condition the control plane's claim adds to its own claimability
# (``control.Eligibility``; the handoff row is ``h``): an agent-route slot on a pending gate that
# this reviewer is independent of, whose slot is open or pre-assigned to this reviewer (or taken
# over once its claim's lease ran out), on a packet where it holds no other slot.
_SLOT_ELIGIBLE_SQL = f"""EXISTS (
SELECT 1 FROM {_A} a
  JOIN {_P} p ON p.id = a.packet_id
  JOIN {_G} g ON g.id = p.gate_id
  JOIN {_V} v ON v.id = g.candidate_id
 WHERE a.handoff_id = h.id
   AND g.route = %(slot_agent)s AND g.state = %(slot_gate_pending)s AND a.state <> %(slot_submitted)s
   AND (a.reviewer IN ('', %(slot_reviewer)s) OR h.state = %(slot_claimed)s)
   AND g.session_id <> %(slot_reviewer_session)s
   AND g.opened_by <> ALL(%(slot_labels)s) AND v.created_by <> ALL(%(slot_labels)s)
   AND NOT EXISTS (SELECT 1 FROM {_A} b
                    WHERE b.packet_id = a.packet_id AND b.reviewer = %(slot_reviewer)s AND b.id <> a.id)
)"""
#: The state values that condition takes as parameters (never literals in the SQL).
_SLOT_PARAMS = {
    "slot_agent": ReviewGate.Route.AGENT.value, "slot_gate_pending": ReviewGate.State.PENDING.value,
    "slot_submitted": ReviewAssignment.State.SUBMITTED.value, "slot_claimed": HandoffState.CLAIMED.value,
}


@dataclass(frozen=True)
class Claim:
    assignment: ReviewAssignment
    handoff: Handoff  # the lease: id, fencing_token, lease_expires_at, attempt


# The reviewer's own session, share-locked, with its live runtime by the lease (models.live_runtime_sql's
# rule): its own transitions, closes and resumes (which lock it FOR UPDATE) wait for the claim or
# verdict that read it to commit, so none is made by a session that stopped being able to work.
_REVIEWER_SQL = f"""
SELECT s.status, lr.id, lr.capabilities FROM {Session._meta.db_table} AS s
  LEFT JOIN {RuntimeAttachment._meta.db_table} AS lr
    ON lr.session_id = s.id AND lr.state = %(runtime_live_state)s AND lr.lease_expires_at > %(now)s
 WHERE s.id = %(id)s
   FOR SHARE OF s
"""


def _lock_reviewer(identity: ReviewerIdentity) -> list[str]:
    """Under the claim's or the verdict's locks (after the writer's session: the global lock
    order), check again that the agent reviewer's session can work — not closed, a live runtime
    by its lease, declaring ``review`` (``access.check_reviewer_can_work``, nothing written
    otherwise) — and return what that runtime declares."""
    assert identity.session_id is not None
    with connection.cursor() as cur:
        cur.execute(_REVIEWER_SQL, {"id": identity.session_id, "now": timezone.now(), **LIVE_RUNTIME_PARAMS})
        row = cur.fetchone()
    if row is None:  # forgotten since the identity was built: like any session that is not there
        raise NotFound("session not found", session_id=identity.session_id)
    status, runtime_id, capabilities = row
    if isinstance(capabilities, str):  # jsonb as text (the driver's loader): decode it
        capabilities = json.loads(capabilities)
    capabilities = [c for c in capabilities or [] if isinstance(c, str)]
    check_reviewer_can_work(identity.session_id, status, runtime_id, capabilities)
    return capabilities


def claim_packet(identity: ReviewerIdentity, *, token_id: int | None = None) -> Claim | None:
    """An agent reviewer claims the handoff of the oldest agent-route slot it is independent of.

    Returns ``None`` when nothing is claimable. The claim is the control plane's
    (``control.claim`` with the review's ``Eligibility``): the lease, fencing token and attempt
    count, and its ``handoff.claimed`` event. In the same transaction the slot's assignment
    moves to this reviewer — also when it takes over an expired claim.
    """
    assert identity.is_agent
    (project_id,) = identity.project_ids
    now = timezone.now()
    eligible = control.Eligibility(
        condition=_SLOT_ELIGIBLE_SQL,
        params={**_SLOT_PARAMS, "slot_reviewer": identity.key, "slot_reviewer_session": identity.session_id,
                "slot_labels": sorted(identity.labels)},
        # The reviewer's session first (after the writer's ordering lock, before any handoff row):
        # it can still work, and the claim declares what its live runtime declares.
        prepare=lambda: _lock_reviewer(identity),
        on_claim=lambda handoff: _assign_slot(identity, handoff, now),
    )
    try:
        # Outside a transaction each try is one of its own: a claim that lost its candidate's
        # session to racing claimers tries the next oldest session's slots.
        claimed = control.claim(
            # What the runtime declared when the identity was read picks the candidate, as a job
            # worker's declaration does; each try reads it again under the reviewer's lock (prepare).
            project_ids=[project_id], capabilities=list(identity.capabilities), holder=identity.key,
            purpose=HandoffPurpose.REVIEW, token_id=token_id, actor=identity.key, now=now, eligible=eligible,
        )
    except IntegrityError:
        # The same reviewer claimed a second slot of one packet concurrently: the unique
        # (packet, reviewer) constraint refused it; the first claim stands.
        raise AlreadyClaimed("this reviewer already holds a slot on that packet") from None
    return None if claimed is None else Claim(claimed.outcome, claimed.handoff)


def _assign_slot(identity: ReviewerIdentity, handoff: Handoff, now: datetime) -> ReviewAssignment:
    """In the claim's transaction, the claimed slot's assignment moves to the reviewer, with its event."""
    slot = ReviewAssignment.objects.filter(handoff_id=handoff.id)
    if move_rows(slot, lc.REVIEW_ASSIGNMENT, ReviewAssignment.State.ASSIGNED, reviewer=identity.key,
                 reviewer_session_id=identity.session_id, assigned_at=now) != 1:
        # Unreachable while the claim holds the handoff row (a verdict takes it first too).
        check(lc.REVIEW_ASSIGNMENT.check, slot.values_list("state", flat=True).get(), ReviewAssignment.State.ASSIGNED)
    assignment = ReviewAssignment.objects.select_related("packet__gate").get(handoff_id=handoff.id)
    gate = assignment.packet.gate
    common = {"project_id": gate.project_id, "session_id": gate.session_id, "run_id": gate.run_id,
              "actor": identity.key}
    events.append(type=ev.REVIEW_PACKET_CLAIMED, payload={
        "gate_id": gate.id, "packet_id": assignment.packet_id, "assignment_id": assignment.id,
        "reviewer_session_id": identity.session_id, "state": assignment.state, "handoff_id": handoff.id,
        "attempt": handoff.attempt,
    }, **common)
    return assignment


def heartbeat_packet(identity: ReviewerIdentity, packet_id: int, *, fencing_token: Any) -> control.Lease:
    """Renew the lease on your claim of a packet (``control.renew``).

    A superseded token is 409 ``stale_lease`` — also when the slot has moved to the reviewer
    that re-claimed it after this one's lease expired; an unclaimed slot is
    ``handoff_not_claimable``, a bound one ``handoff_closed``."""
    assert identity.is_agent
    token = _fencing_token(fencing_token)
    handoff_id = _held_assignment(identity, packet_id, token).handoff_id
    return control.renew(handoff_id=handoff_id, fencing_token=token, project_ids=identity.project_ids,
                         purpose=HandoffPurpose.REVIEW)


def _answer_unless_working(
    identity: ReviewerIdentity, packet_id: int, payload: Any, fencing_token: Any,
) -> BoundVerdict | None:
    """None when the agent reviewer's session can work (``_lock_reviewer``). When it cannot
    (closed to work, no live runtime, no ``review``): the verdict it already bound here when this
    is an identical resubmission under the same claim — results are delivered at least once,
    and a retry is answered with the first answer, as a job's duplicate result is — and
    otherwise that refusal, nothing written."""
    try:
        _lock_reviewer(identity)
    except (SessionTerminated, NoLiveRuntime, HandoffNotClaimable):
        answered = _bound_already(identity, packet_id, payload, fencing_token)
        if answered is None:
            raise
        return answered
    return None


def _bound_already(identity: ReviewerIdentity, packet_id: int, payload: Any, fencing_token: Any) -> BoundVerdict | None:
    """The verdict this agent reviewer bound to the packet, when ``payload`` is the same verdict
    (same fingerprint) cited with the claim's fencing token; None otherwise. Reads only."""
    if not isinstance(fencing_token, int) or isinstance(fencing_token, bool):
        return None
    try:
        assignment = assignment_for(identity, packet_id)
    except NotFound:
        return None
    existing = Verdict.objects.filter(assignment=assignment).first()
    if existing is None or assignment.handoff_id is None:
        return None
    if not Handoff.objects.filter(id=assignment.handoff_id, fencing_token=fencing_token).exists():
        return None
    packet = assignment.packet
    try:
        data = verdicts.validate_verdict(payload, packets.rubric_from_dict(packet.content["rubric"]),
                                         candidate_lines=packet.content["candidate"]["lines"])
    except rt.RuntimeRuleError:
        return None
    if data.fingerprint() != existing.fingerprint:
        return None
    return BoundVerdict(existing, False, packet.gate)


def _fencing_token(value: Any) -> int:
    if value is None:
        raise ValidationFailed("the agent route needs the fencing_token your claim returned", field="fencing_token")
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= BIGINT_MAX:
        raise ValidationFailed("fencing_token must be the positive integer your claim returned", field="fencing_token")
    return value


def _stale(handoff: Handoff, token: int) -> StaleLease:
    return control.stale_lease(handoff=handoff, fencing_token=token)


def _held_assignment(identity: ReviewerIdentity, packet_id: int, token: int) -> ReviewAssignment:
    """The handoff of your slot on this packet; or — when the slot moved on after your lease
    expired — 409 ``stale_lease`` for the claim you held (proved by its ``handoff.claimed``
    event); otherwise 404 like any packet that is not yours."""
    try:
        assignment = assignment_for(identity, packet_id)
    except NotFound:
        held = {
            h.id: h for h in Handoff.objects.filter(review_assignment__packet_id=packet_id, project_id__in=identity.project_ids)
        }
        lost = held and Event.objects.filter(
            session_id=next(iter(held.values())).session_id, type=ev.HANDOFF_CLAIMED.name, payload__worker=identity.key,
            payload__fencing_token=token, payload__handoff_id__in=list(held),
        ).values_list("payload__handoff_id", flat=True).first()
        if not lost:
            raise
        raise _stale(held[lost], token) from None
    if assignment.handoff_id is None:
        raise HandoffNotClaimable("this packet is not claimed through a handoff", packet_id=packet_id)
    return assignment


# ------------------------------------------------------------------------------------------
# Binding a verdict
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BoundVerdict:
    verdict: Verdict
    created: bool  # False: an identical resubmission, answered with the verdict already bound
    gate: ReviewGate


def bind_verdict(
    identity: ReviewerIdentity, packet_id: int, payload: Any, *, channel: str, fencing_token: Any = None,
) -> BoundVerdict:
    """Validate a verdict against the packet's rubric and bind it to the cited fingerprints.

    Refusals, all before anything is written: 404 (not your packet), 422 (a field is wrong;
    named), 403 ``independence_violation``, 409 ``stale_fingerprint`` (the cited packet or
    artifact fingerprint is not this packet's, or the artifact moved on since the freeze),
    409 ``verdict_conflict`` (a different verdict from you is already bound here).

    An agent reviewer cites the ``fencing_token`` of its claim (422 without it; 409
    ``stale_lease`` when a later claim superseded it). Its verdict is also the result of the
    slot's handoff: the same transaction records the delivery and the consume-once receipt,
    and settles the writer's waiting run.
    """
    if identity.is_agent and (answered := _answer_unless_working(identity, packet_id, payload, fencing_token)):
        return answered
    token = _fencing_token(fencing_token) if identity.is_agent else None
    assignment = _held_assignment(identity, packet_id, token) if token is not None else assignment_for(identity, packet_id)
    packet = assignment.packet
    rubric = packets.rubric_from_dict(packet.content["rubric"])
    data = check(verdicts.validate_verdict, payload, rubric, candidate_lines=packet.content["candidate"]["lines"])
    created = True
    try:
        with transaction.atomic():
            # Lock the writer's session first (global lock order); every write to this gate
            # takes the same lock, so verdicts on one gate are serialised here.
            events.order_lock(packet.gate.session_id)
            try:
                session = Session.objects.select_for_update(of=("self",)).get(id=packet.gate.session_id)
            except Session.DoesNotExist:
                raise NotFound("review packet not found", packet_id=packet_id) from None
            # The verdict is the reviewer session's own work: it must still be able to work
            # (share-locked after the writer's session, before the slot's rows), unless this is
            # the verdict it already bound (it stopped working between the two reads).
            if identity.is_agent and (answered := _answer_unless_working(identity, packet_id, payload, fencing_token)):
                return answered
            gate = ReviewGate.objects.select_related("candidate").get(id=packet.gate_id)
            # Session, then the slot's handoff, then the assignment — a claim locks the handoff
            # before it moves the assignment, so the same order here cannot deadlock with a
            # re-claim, and the token is checked under the lock a re-claim needs.
            handoff = Handoff.objects.select_for_update().get(id=assignment.handoff_id) if token is not None else None
            assignment = ReviewAssignment.objects.select_for_update().get(id=assignment.id)
            check_independence(identity, gate, gate.candidate.created_by)
            if handoff is not None:
                if handoff.state == HandoffState.PENDING:
                    raise HandoffNotClaimable("claim this packet before submitting a verdict", handoff_id=handoff.id,
                                              state=handoff.state)
                if handoff.fencing_token != token or assignment.reviewer != identity.key:
                    raise _stale(handoff, token)
            if data.packet_fingerprint != packet.fingerprint:
                raise StaleFingerprint("the verdict cites another packet fingerprint", field="packet_fingerprint")
            if data.artifact_fingerprint != gate.candidate_fingerprint:
                raise StaleFingerprint("the verdict cites another artifact fingerprint", field="artifact_fingerprint")
            fingerprint = data.fingerprint()
            existing = Verdict.objects.filter(assignment=assignment).first()
            if existing is not None:
                if existing.fingerprint == fingerprint:
                    return BoundVerdict(existing, False, gate)
                raise VerdictConflict(
                    "you already bound a different verdict to this packet",
                    verdict_id=existing.id,
                )
            if gate.state == ReviewGate.State.CANCELLED:
                raise GateClosed("this review gate was cancelled")
            if session.status in lc.WORK_CLOSED_STATUSES:
                # Entering terminated/stale cancels the session's pending gates; this answers the
                # same for a gate such a session left open before it did (or a complete one).
                raise GateClosed(f"this review gate's session is {session.status}: it takes no more verdicts",
                                 state=gate.state, session_status=session.status)
            if handoff is not None and handoff.state != HandoffState.CLAIMED:
                raise HandoffNotClaimable("this claim takes no verdict", handoff_id=handoff.id, state=handoff.state)
            # Read, not lock: the artifact's head is changed only by approved writes, and a
            # verdict bound a moment before such a write is still a verdict on the frozen bytes.
            head = Artifact.objects.filter(id=gate.candidate.artifact_id).values_list("current_version_id", flat=True).first()
            if head not in {gate.head_version_id, gate.candidate_id}:
                raise StaleFingerprint(
                    "the candidate changed since the packet was frozen", field="artifact_fingerprint",
                    reason="candidate_changed",
                )
            verdict = Verdict.objects.create(
                packet=packet, assignment=assignment, reviewer=identity.key, channel=channel,
                decision=data.decision, scores=data.scores, findings=[f.as_dict() for f in data.findings],
                confidence=data.confidence, packet_fingerprint=data.packet_fingerprint,
                artifact_fingerprint=data.artifact_fingerprint, fingerprint=fingerprint,
            )
            move(assignment, lc.REVIEW_ASSIGNMENT, ReviewAssignment.State.SUBMITTED, submitted_at=verdict.bound_at)
            outbox = Outbox(identity.key)
            if handoff is not None:
                control.bind(session=session, handoff=handoff, fencing_token=token, result={
                    "decision": verdict.decision, "scores": verdict.scores, "findings": verdict.findings,
                    "confidence": verdict.confidence, "packet_fingerprint": verdict.packet_fingerprint,
                    "artifact_fingerprint": verdict.artifact_fingerprint,
                }, actor=identity.key, outbox=outbox)
            gate.bound_verdicts += 1
            completed = gate.state == ReviewGate.State.PENDING and gate.bound_verdicts >= gate.required_verdicts
            if completed:
                decisions = Verdict.objects.filter(packet=packet).values_list("decision", flat=True)
                move(gate, lc.REVIEW_GATE, ReviewGate.State.COMPLETE, bound_verdicts=gate.bound_verdicts,
                     outcome=verdicts.aggregate_outcome(decisions), completed_at=timezone.now())
            else:
                gate.save(update_fields=["bound_verdicts"])
            outbox.add(
                session, ev.REVIEW_VERDICT_BOUND, run_id=gate.run_id, gate_id=gate.id, packet_id=packet.id,
                verdict_id=verdict.id, assignment_id=assignment.id, packet_fingerprint=verdict.packet_fingerprint,
                artifact_fingerprint=verdict.artifact_fingerprint, verdict_fingerprint=verdict.fingerprint,
                bound_verdicts=gate.bound_verdicts, required_verdicts=gate.required_verdicts,
            )
            if completed:
                outbox.add(session, ev.REVIEW_GATE_COMPLETED, run_id=gate.run_id, gate_id=gate.id, state=gate.state)
                _resume_if_waiting(session, gate, outbox, reason=f"review gate {gate.id} bound")
            if handoff is not None:
                # The run's pending list drops this handoff; the last one returns the session to running.
                # That is the run waiting on it *now*: resume hands the gate and its handoffs to the run
                # that continues the cursor (reviews/waits.py), never leaving them on the interrupted one.
                control.settle(session=session, run_id=handoff.run_id, reason=control.RESULTS_BOUND_REASON, outbox=outbox)
            outbox.flush()
    except IntegrityError:
        # A racing identical request won (the unique (packet, reviewer) rule held). Answer
        # like the idempotent path, or refuse if what won is different.
        created = False
        verdict = Verdict.objects.get(packet_id=packet_id, reviewer=identity.key)
        if verdict.fingerprint != data.fingerprint():
            raise VerdictConflict("you already bound a different verdict to this packet",
                                  verdict_id=verdict.id) from None
        gate = ReviewGate.objects.get(id=packet.gate_id)
    return BoundVerdict(verdict, created, gate)


def _resume_if_waiting(session: Session, gate: ReviewGate, outbox: Outbox, *, reason: str) -> None:
    """Wake the session when no gate of this session waits on a person any more
    (``wake_waiting_session``): back to ``running`` if a runtime is live to run it, else
    ``failed / runtime_lost`` (resumable; the verdict stays bound).

    Only from ``awaiting_user``: a session that failed or was terminated meanwhile keeps its
    state (the verdict is still recorded)."""
    if not gate.waits_on_user or session.status != rt.SessionStatus.AWAITING_USER:
        return
    still_waiting = (
        ReviewGate.objects.filter(session=session, state=ReviewGate.State.PENDING, route__in=ReviewGate.USER_ROUTES)
        .exclude(id=gate.id)
        .exists()
    )
    if not still_waiting:
        wake_waiting_session(session, outbox, reason=reason, current_run=None)


# ------------------------------------------------------------------------------------------
# Cancelling a gate
# ------------------------------------------------------------------------------------------
def cancel_gate(caller: Caller, gate_id: int, *, reason: str = "") -> ReviewGate:
    """Withdraw a pending gate (e.g. the candidate must be re-frozen). Idempotent on a
    cancelled gate; refused on a complete one. A waiting session goes back to ``running``."""
    caller.require("write")
    try:
        session_id = ReviewGate.objects.filter(session__in=caller.sessions()).values_list("session_id", flat=True).get(id=gate_id)
    except ReviewGate.DoesNotExist:
        raise NotFound("review gate not found", gate_id=gate_id) from None
    with transaction.atomic():
        session = lock_session(caller, session_id)
        gate = ReviewGate.objects.get(id=gate_id)
        if gate.state == ReviewGate.State.CANCELLED:
            return gate
        if gate.state == ReviewGate.State.COMPLETE:
            raise GateClosed("a complete gate cannot be cancelled", state=gate.state)
        outbox = Outbox(caller.label)
        _cancel_locked(session, gate, outbox, reason=reason or f"review gate {gate.id} cancelled")
        outbox.flush()
    return gate


def _cancel_locked(session: Session, gate: ReviewGate, outbox: Outbox, *, reason: str) -> None:
    """Cancel a pending gate of the locked ``session``: ``review.gate_cancelled``, a session that
    waited on it continues (``_resume_if_waiting``), an agent gate's unbound slots are withdrawn."""
    move(gate, lc.REVIEW_GATE, ReviewGate.State.CANCELLED, completed_at=timezone.now())
    outbox.add(session, ev.REVIEW_GATE_CANCELLED, run_id=gate.run_id, gate_id=gate.id, state=gate.state)
    _resume_if_waiting(session, gate, outbox, reason=reason)
    if gate.route == ReviewGate.Route.AGENT:
        _cancel_handoffs(session, gate, outbox, reason=reason)


def withdraw_gates(session: Session, outbox: Outbox, reason: str) -> None:
    """The ``review_gate`` wait kind's ``withdraw`` (wired in ``apps.py``): a session that takes no
    more work (terminated, stale) cancels every pending gate with its review slots, as a cancel
    would. The session is locked and has already moved, so nothing continues."""
    for gate in ReviewGate.objects.select_for_update(of=("self",)).filter(
        session=session, state=ReviewGate.State.PENDING,
    ).order_by("id"):
        _cancel_locked(session, gate, outbox, reason=reason)


def _cancel_handoffs(session: Session, gate: ReviewGate, outbox: Outbox, *, reason: str) -> None:
    """A cancelled agent gate withdraws its still-unbound handoffs and settles the run (its
    status reason says the gate was cancelled)."""
    # Locked after the session (the global lock order): a racing claim or verdict waits here.
    withdrawn = list(
        Handoff.objects.select_for_update(of=("self",))
        .filter(review_assignment__packet__gate=gate, state__in=UNBOUND_STATES)
        .order_by("id")
    )
    control.cancel(session=session, handoffs=withdrawn, reason=reason, outbox=outbox, settle_reason=reason)
