"""Handoffs: frozen external jobs, claimed under leases with fencing tokens (docs/model.md#handoffs).

* ``create_handoff`` — an open run of a ``running`` (or already ``awaiting_external``) session
  freezes a job: input artifact refs + fingerprints → server-computed job fingerprint, a
  logical id unique per project, required capabilities, a timeout. The session goes
  ``awaiting_external``; its run stays open and lists the logical id in ``pending_external``.
* ``claim_handoff`` — a worker (token permission ``work``) declares its capabilities and gets
  the oldest eligible handoff: one conditional ``UPDATE`` (``FOR UPDATE SKIP LOCKED``), so two
  racing claims never both win. The lease lasts ``timeout_seconds``; the attempt and the
  fencing token advance by one per claim. A claim whose lease ran out can be claimed again.
* ``heartbeat_handoff`` — extends the lease of the current token holder; a superseded token
  is refused with ``stale_lease``. No event: liveness is not a state change.
* ``cancel_handoff`` — the run gives up on a job it no longer needs.

Every handoff has a ``purpose``: ``job`` handoffs are what these plain actions (and the
``/handoffs`` routes) claim, renew, answer and cancel; ``review`` handoffs are agent-review
slots, reached only through the review app via ``control.service`` — the plain actions
refuse them with 409 ``review_route_required`` and write nothing.

Lock order everywhere: session row, then handoff/run rows. Claims and heartbeats touch only
the handoff row (one statement), so they never wait on a session lock while holding one.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, NoReturn

from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from novelforge_sessions import events
from novelforge_sessions import leases
from novelforge_sessions import event_types as ev
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.actions import idempotency
from novelforge_sessions.actions.artifacts import require_versions
from novelforge_sessions.actions.lifecycle import (
    BIGINT_MAX, Outbox, apply_transition, check, lock_session, move, require_live_runtime,
)
from novelforge_sessions.actions.runtimes import wake_waiting_session
from novelforge_sessions.control import result_schema as result_schemas
from novelforge_sessions.control.fingerprints import job_fingerprint
from novelforge_sessions.control.models import UNBOUND_STATES, ConsumeReceipt, Handoff, HandoffPurpose, HandoffState
from novelforge_sessions.errors import (
    AlreadyConsumed,
    HandoffClosed,
    HandoffNotClaimable,
    LogicalIdTaken,
    NotFound,
    ReviewRouteRequired,
    RunNotOpen,
    ServiceError,
    SessionNotRunning,
    StaleLease,
    ValidationFailed,
)
from novelforge_sessions.models import KeyedOperation, Run, RuntimeAttachment, Session

LOGICAL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@#+=-]{0,199}$")
RESULT_TYPES = result_schemas.SHORT_TYPES
DEFAULT_TIMEOUT_SECONDS = 300
MAX_TIMEOUT_SECONDS = 24 * 3600
MAX_INPUTS = 100
MAX_PARAMS_BYTES = 16 * 1024
MAX_RESULT_SCHEMA_BYTES = 4096


# ---- pure validation ------------------------------------------------------------------------
@dataclass(frozen=True)
class JobSpec:
    logical_id: str
    inputs: list[dict[str, Any]]
    params: dict[str, Any]
    result_schema: dict[str, Any]  # the short form or a full JSON Schema (control/result_schema.py)
    required_capabilities: list[str]
    timeout_seconds: int
    job_fingerprint: str


def validate_logical_id(value: Any) -> str:
    if not isinstance(value, str) or not LOGICAL_ID_RE.match(value):
        raise ValidationFailed(
            "logical_id must be 1–200 characters of [A-Za-z0-9_.:/@#+=-], starting with a letter or digit",
            field="logical_id",
        )
    return value


def validate_job(
    *, logical_id: Any, inputs: Any, params: Any, result_schema: Any, required_capabilities: Any, timeout_seconds: Any,
) -> JobSpec:
    """Validate a job body and compute its fingerprint (pure)."""
    validate_logical_id(logical_id)
    if not isinstance(inputs, list) or len(inputs) > MAX_INPUTS:
        raise ValidationFailed(f"inputs must be a list of at most {MAX_INPUTS} artifact refs", field="inputs")
    refs: set[tuple[int, str]] = set()
    for index, ref in enumerate(inputs):
        if not isinstance(ref, dict) or not isinstance(ref.get("artifact_id"), int) or isinstance(ref.get("artifact_id"), bool):
            raise ValidationFailed("each input needs an integer artifact_id", field=f"inputs[{index}]")
        if set(ref) - {"artifact_id", "fingerprint"}:
            raise ValidationFailed("an input ref has only artifact_id and fingerprint", field=f"inputs[{index}]")
        fp = check(rt.validate_fingerprint, ref.get("fingerprint"), f"inputs[{index}].fingerprint")
        refs.add((ref["artifact_id"], fp))
    frozen = [{"artifact_id": a, "fingerprint": f} for a, f in sorted(refs)]
    params = check(rt.validate_metadata, params, "params", MAX_PARAMS_BYTES)
    schema = check(rt.validate_metadata, result_schema, "result_schema", MAX_RESULT_SCHEMA_BYTES)
    try:
        result_schemas.as_json_schema(schema)  # the short form, or a full Draft 2020-12 JSON Schema
    except result_schemas.ResultSchemaError as exc:
        raise ValidationFailed(exc.message, field=exc.field) from None
    caps = check(rt.validate_capabilities, required_capabilities or [], "required_capabilities")
    timeout = DEFAULT_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= MAX_TIMEOUT_SECONDS:
        raise ValidationFailed(f"timeout_seconds must be between 1 and {MAX_TIMEOUT_SECONDS}", field="timeout_seconds")
    return JobSpec(
        logical_id=logical_id, inputs=frozen, params=params, result_schema=schema, required_capabilities=caps,
        timeout_seconds=timeout, job_fingerprint=job_fingerprint(inputs=frozen, params=params, result_schema=schema),
    )


# ---- shared with results/resume ----------------------------------------------------------------
def visible_handoffs(caller: Caller) -> QuerySet[Handoff]:
    return caller.scope("handoff", Handoff.objects.filter(project_id__in=caller.project_ids))


#: The session's status reason when the last awaited result of its run was bound.
RESULTS_BOUND_REASON = "external results bound"


def cancelled_reason(handoff: Handoff) -> str:
    """The session's status reason when cancelling ``handoff`` ended the wait."""
    return f"handoff {handoff.logical_id} cancelled"[:200]


def settle_waiting_run(session: Session, run_id: int, outbox: Outbox, *, reason: str = RESULTS_BOUND_REASON) -> list[str]:
    """After a handoff of ``run_id`` stopped waiting (bound or cancelled): refresh the run's
    ``pending_external`` and, if nothing of the open run is pending any more, wake a session
    that was ``awaiting_external`` (``wake_waiting_session``): back to ``running`` (its run
    continues) with ``reason`` as its status reason — say why the wait ended ("external results
    bound", "handoff X cancelled") — if a runtime is live to run it; else ``failed /
    runtime_lost``, resumable. Expects the session row lock."""
    remaining = list(
        Handoff.objects.filter(run_id=run_id, state__in=UNBOUND_STATES).order_by("id").values_list("logical_id", flat=True)
    )
    Run.objects.filter(id=run_id).update(pending_external=remaining)
    if not remaining and session.status == rt.SessionStatus.AWAITING_EXTERNAL:
        now = timezone.now()
        # The session's liveness rides along with the run (no statement of its own).
        live = Exists(RuntimeAttachment.objects.live(now).filter(session_id=OuterRef("session_id")))
        waiting_run = (
            Run.objects.filter(id=run_id, state=rt.RunState.OPEN).only("id").annotate(runtime_live=live).first()
        )
        if waiting_run is not None:
            wake_waiting_session(
                session, outbox, reason=reason[:200], current_run=waiting_run, runtime_live=waiting_run.runtime_live,
                now=now,
            )
    return remaining


# ---- create -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CreatedHandoff:
    handoff: Handoff
    created: bool  # False: an identical request was replayed and the first handoff returned


def create_handoff(
    caller: Caller, run_id: int, *, logical_id: str, inputs: list[dict[str, Any]] | None = None,
    params: dict[str, Any] | None = None, result_schema: dict[str, Any] | None = None,
    required_capabilities: list[str] | None = None, timeout_seconds: int | None = None,
    idempotency_key: str | None = None,
) -> CreatedHandoff:
    """Hand a frozen job off from the open run. Refusals, most fundamental first: not found →
    the logical id names another job (an identical request is replayed, writing nothing) →
    ``run_not_open`` → ``session_not_running`` → ``no_live_runtime`` (the session's runtime is
    gone: its lease ran out, reconciled or not) → ``already_consumed`` and the inputs.

    With an ``idempotency_key`` (scoped to the run), the same key and body answer what the first
    request answered (its handoff, ``created`` as it was then), writing nothing; another body is
    ``idempotency_key_reused`` (``actions/idempotency.py``)."""
    caller.require("write")
    spec = validate_job(
        logical_id=logical_id, inputs=inputs or [], params=params, result_schema=result_schema,
        required_capabilities=required_capabilities, timeout_seconds=timeout_seconds,
    )
    key = idempotency.key_for(KeyedOperation.HAND_OFF, run_id, idempotency_key, {
        "logical_id": logical_id, "inputs": inputs or [], "params": params, "result_schema": result_schema,
        "required_capabilities": required_capabilities, "timeout_seconds": timeout_seconds,
    })

    def write() -> tuple[CreatedHandoff, int, idempotency.Answer]:
        made = _create_handoff(caller, run_id, spec)
        return made, made.handoff.session_id, idempotency.Answer(201 if made.created else 200, {"id": made.handoff.id})

    return idempotency.once(caller, key, write, lambda first: CreatedHandoff(
        Handoff.objects.get(id=first.data["id"]), first.status == 201))


def _create_handoff(caller: Caller, run_id: int, spec: JobSpec) -> CreatedHandoff:
    try:
        session_id = Run.objects.filter(session__in=caller.sessions()).values_list("session_id", flat=True).get(id=run_id)
    except Run.DoesNotExist:
        raise NotFound("run not found", run_id=run_id) from None
    with transaction.atomic():
        # Session first, then its run (the global lock order): the status check, the
        # transition and the run's pending list are decided under these locks.
        session = lock_session(caller, session_id)
        run = Run.objects.select_for_update().get(id=run_id)
        existing = Handoff.objects.filter(project_id=session.project_id, logical_id=spec.logical_id).first()
        if existing is not None:
            if existing.session_id == session.id and existing.job_fingerprint == spec.job_fingerprint \
                    and existing.required_capabilities == spec.required_capabilities \
                    and existing.purpose == HandoffPurpose.JOB:
                return CreatedHandoff(existing, False)
            raise LogicalIdTaken(
                "this logical id already names another job in the project", logical_id=spec.logical_id,
                handoff_id=existing.id if existing.session_id == session.id else None,
            )
        if run.state != rt.RunState.OPEN:
            raise RunNotOpen("handoffs are created by an open run", state=run.state)
        if session.status not in (rt.SessionStatus.RUNNING, rt.SessionStatus.AWAITING_EXTERNAL):
            raise SessionNotRunning(
                "only a running session hands off work", status=session.status,
            )
        require_live_runtime(caller, session)  # a runtime whose lease ran out hands nothing off
        outbox = Outbox(caller.label)
        handoff = insert_handoff(session, run, spec, actor=caller.label, outbox=outbox, reach=caller)
        outbox.flush()
    return CreatedHandoff(handoff, True)


def insert_handoff(
    session: Session, run: Run, spec: JobSpec, *, actor: str, outbox: Outbox, reach: Caller | None,
    purpose: HandoffPurpose = HandoffPurpose.JOB,
) -> Handoff:
    """Insert one handoff for an already-locked ``running``/``awaiting_external`` session and
    its open run (the caller holds both locks and owns the transaction): the run lists the
    logical id as pending, ``handoff.created`` goes to the caller's outbox and a ``running``
    session moves to ``awaiting_external``. The caller flushes the outbox. The inputs must name
    versions within ``reach``'s reach (``require_versions``; None: the caller resolved them in
    its own caller's reach, as a review gate's candidate is)."""
    if ConsumeReceipt.objects.filter(project_id=session.project_id, logical_id=spec.logical_id).exists():
        raise AlreadyConsumed(
            "a result for this logical id was already consumed; it is not handed off again",
            logical_id=spec.logical_id,
        )
    require_versions(reach, session.project_id, ((r["artifact_id"], r["fingerprint"]) for r in spec.inputs), what="inputs")
    try:
        # A savepoint: another session of the project may race us to the same logical id.
        with transaction.atomic():
            handoff = Handoff.objects.create(
                project_id=session.project_id, session=session, run=run, logical_id=spec.logical_id,
                inputs=spec.inputs, params=spec.params, result_schema=spec.result_schema,
                job_fingerprint=spec.job_fingerprint, required_capabilities=spec.required_capabilities,
                timeout_seconds=spec.timeout_seconds, purpose=HandoffPurpose(purpose).value, created_by=actor,
            )
    except IntegrityError:
        raise LogicalIdTaken("this logical id already names another job in the project", logical_id=spec.logical_id) from None
    run.pending_external = [*run.pending_external, spec.logical_id]
    run.save(update_fields=["pending_external"])
    outbox.add(
        session, ev.HANDOFF_CREATED, run_id=run.id, handoff_id=handoff.id, logical_id=handoff.logical_id,
        job_fingerprint=handoff.job_fingerprint, required_capabilities=handoff.required_capabilities,
        timeout_seconds=handoff.timeout_seconds, inputs=handoff.inputs, purpose=handoff.purpose,
    )
    if session.status == rt.SessionStatus.RUNNING:
        apply_transition(
            session, rt.SessionStatus.AWAITING_EXTERNAL, reason=f"waiting on handoff {handoff.logical_id}",
            outbox=outbox, current_run=run,
        )
    return handoff


# ---- claim -------------------------------------------------------------------------------------------
_H = Handoff._meta.db_table
_S = Session._meta.db_table

#: Status values the lease statements take as parameters (never literals in the SQL).
_LEASE_PARAMS = {
    "pending": HandoffState.PENDING.value,
    "claimed": HandoffState.CLAIMED.value,
    # The states a claim may move (lifecycles.HANDOFF): pending, or claimed with its lease run out.
    "claim_from": lc.HANDOFF.sources(HandoffState.CLAIMED),
    # A job of a session that can never run again is not worth a worker's time.
    "closed_statuses": sorted(s.value for s in lc.WORK_CLOSED_STATUSES),
}

# Private: the review app claims its slots through ``control.service.claim``, which runs it with
# the app's own condition (``Eligibility``) in place of ``__ELIGIBLE__``.
_CLAIM_SQL_TEMPLATE = f"""
WITH candidate AS (
    SELECT h.id, h.lease_holder AS previous_holder
      FROM {_H} h JOIN {_S} s ON s.id = h.session_id
     WHERE h.project_id = ANY(%(projects)s)
       AND (%(bound)s::bigint IS NULL OR h.session_id = %(bound)s::bigint)
       AND (%(handoff)s::bigint IS NULL OR h.id = %(handoff)s::bigint)
       AND h.purpose = %(purpose)s
       AND h.state = ANY(%(claim_from)s) AND (h.state <> %(claimed)s OR h.lease_expires_at <= %(now)s)
       AND h.required_capabilities <@ %(caps)s::jsonb
       AND s.status <> ALL(%(closed_statuses)s)
       AND (__ELIGIBLE__)
       AND h.session_id = %(order_session)s::bigint
     ORDER BY h.id
     LIMIT 1
       FOR UPDATE OF h SKIP LOCKED
)
UPDATE {_H} h
   SET state = %(claimed)s, attempt = h.attempt + 1, fencing_token = h.fencing_token + 1,
       lease_holder = %(holder)s, lease_token_id = %(token)s, claimed_at = %(now)s, heartbeat_at = %(now)s,
       lease_expires_at = %(now)s + make_interval(secs => h.timeout_seconds)
  FROM candidate c
 WHERE h.id = c.id
RETURNING h.*, c.previous_holder
"""


@functools.lru_cache(maxsize=16)
def _claim_statements(condition: str) -> tuple[str, str]:
    """The claim statement with ``condition`` (an ``Eligibility``'s, or ``TRUE``) in its WHERE,
    and its first step, without any lock: the session of the oldest candidate
    (events.order_lock_candidate takes its ordering lock). The claim then takes a row FOR UPDATE
    SKIP LOCKED within that session only: racing claimers of one session queue on its ordering
    lock, then each takes the next row."""
    claim_sql = _CLAIM_SQL_TEMPLATE.replace("__ELIGIBLE__", condition)
    candidate_session_sql = (
        "SELECT h.session_id" + claim_sql.split("SELECT h.id, h.lease_holder AS previous_holder", 1)[1]
        .split("AND h.session_id = %(order_session)s::bigint", 1)[0]
        + "AND h.session_id <> ALL(%(tried)s::bigint[])\n ORDER BY h.id LIMIT 1"
    )
    return claim_sql, candidate_session_sql


#: A job claim's statements (no condition of an app's).
_CLAIM_SQL, _CANDIDATE_SESSION_SQL = _claim_statements("TRUE")


@dataclass(frozen=True)
class Eligibility:
    """An app's own rule on top of claimability, for the handoffs of its purpose (``reviews``:
    the slots this reviewer may take). What is claimable stays the control plane's (scope,
    purpose, state and lease, capabilities, the session's status) and so does the claim itself;
    an eligibility only narrows which of the claimable rows a claim may take.

    * ``condition`` — a boolean SQL expression on the candidate handoff row, aliased ``h`` (the
      app's own tables through its own subqueries), its values in ``params``: pyformat
      placeholders under names the claim's own do not use;
    * ``prepare`` — called in each try under the candidate session's ordering lock, before any
      row lock: the app's own locks and checks (a ``ServiceError`` refuses, nothing written). It
      may return the capabilities the claim declares, as read under those locks (``None``: the
      ``capabilities`` the claim was given, which picked the candidate's session);
    * ``on_claim`` — called with the claimed handoff in the claim's transaction, after its
      ``handoff.claimed`` event: the app's own writes that go with the claim. What it returns is
      the claim's ``outcome``.
    """

    condition: str
    params: Mapping[str, Any] = field(default_factory=dict)
    prepare: Callable[[], Iterable[str] | None] | None = None
    on_claim: Callable[[Handoff], Any] | None = None


@dataclass(frozen=True)
class ClaimedRow:
    """What :func:`claim_row` took: the handoff (with ``previous_holder``) and ``on_claim``'s outcome."""

    handoff: Handoff
    outcome: Any = None


def _scoped(project_ids: Collection[int], session_id: int | None) -> QuerySet[Handoff]:
    qs = Handoff.objects.filter(project_id__in=list(project_ids))
    if session_id is not None:
        qs = qs.filter(session_id=session_id)
    return qs


def claim_row(
    *, project_ids: Collection[int], session_id: int | None, handoff_id: int | None, capabilities: list[str],
    holder: str, token_id: int | None, purpose: HandoffPurpose, now: datetime, actor: str,
    eligible: Eligibility | None = None,
) -> ClaimedRow | None:
    """The claim statement, then its ``handoff.claimed`` event. Outside a transaction, each try is
    a transaction of its own, and a claim that lost its session to racing claimers tries the
    next one (:func:`events.claim_in_oldest_session`); inside the caller's transaction, one try.
    ``None``: nothing of ``purpose`` in scope was claimable (and ``eligible``, if given). The
    returned handoff carries ``previous_holder`` (the lease holder before this claim, or "")."""
    if handoff_id is not None and not 0 < handoff_id <= BIGINT_MAX:
        return None  # the statement casts it to bigint: a larger id names no row
    params = {**_LEASE_PARAMS, "projects": list(project_ids), "bound": session_id, "handoff": handoff_id,
              "purpose": HandoffPurpose(purpose).value, "now": now, "caps": json.dumps(capabilities),
              "holder": holder, "token": token_id}
    claim_sql, candidate_session_sql = _CLAIM_SQL, _CANDIDATE_SESSION_SQL
    if eligible is not None:
        clash = set(eligible.params) & (set(params) | {"order_session", "tried"})
        if clash:
            raise ValueError(f"an eligibility's parameters reuse the claim's names: {sorted(clash)}")
        params.update(eligible.params)
        claim_sql, candidate_session_sql = _claim_statements(eligible.condition)
    return events.claim_in_oldest_session(
        candidate_session_sql, params,
        lambda order_session: _claim_in_session(claim_sql, params, order_session, actor, eligible),
    )


def _claim_in_session(
    claim_sql: str, params: dict, order_session: int, actor: str, eligible: Eligibility | None,
) -> ClaimedRow | None:
    params = {**params, "order_session": order_session}
    if eligible is not None and eligible.prepare is not None:
        declared = eligible.prepare()
        if declared is not None:
            params["caps"] = json.dumps(list(declared))
    claimed = list(Handoff.objects.raw(claim_sql, params))
    if not claimed:
        return None
    handoff = claimed[0]
    events.append(
        project_id=handoff.project_id, session_id=handoff.session_id, run_id=handoff.run_id, type=ev.HANDOFF_CLAIMED,
        actor=actor,
        payload={
            "handoff_id": handoff.id, "logical_id": handoff.logical_id, "attempt": handoff.attempt,
            "fencing_token": handoff.fencing_token, "worker": params["holder"],
            "lease_expires_at": handoff.lease_expires_at,
            # attempt > 1 only happens when the previous lease expired unfinished
            "reclaimed_after_expiry": handoff.attempt > 1,
            "previous_holder": handoff.previous_holder or None,
        },
    )
    if eligible is not None and eligible.on_claim is not None:
        return ClaimedRow(handoff, eligible.on_claim(handoff))
    return ClaimedRow(handoff)


def claim_handoff(
    caller: Caller, *, worker: str, capabilities: list[str], handoff_id: int | None = None,
) -> Handoff | None:
    """Claim the oldest eligible job handoff (or the named one). ``None``: nothing to claim.

    Eligible: a ``job`` handoff (review slots are claimed only through the review routes),
    pending, or claimed with an expired lease; required capabilities ⊆ declared; its session
    not terminated/stale. One statement decides: the row is locked with ``SKIP LOCKED`` and
    updated in place, so of two racing claims exactly one gets a row.
    """
    caller.require("work")
    caps = check(rt.validate_capabilities, capabilities)
    if not isinstance(worker, str) or not worker.strip() or len(worker) > 200:
        raise ValidationFailed("worker must name the claiming worker (1–200 characters)", field="worker")

    if handoff_id is not None and not 0 < handoff_id <= BIGINT_MAX:
        # The claim statement casts it to bigint (PostgreSQL would refuse): no such row, as the ORM would say.
        raise NotFound("handoff not found", handoff_id=handoff_id)

    now = timezone.now()
    # claim_row's transactions are its own: a claim that lost its candidate's session to a racing
    # claimer tries the next session in a new one (events.claim_in_oldest_session).
    claimed = claim_row(
        project_ids=caller.project_ids, session_id=caller.session_id, handoff_id=handoff_id, capabilities=caps,
        holder=worker, token_id=caller.token_id, purpose=HandoffPurpose.JOB, now=now, actor=caller.label,
    )
    if claimed is None and handoff_id is not None:
        _explain_unclaimable(caller, handoff_id, caps, now)
    return None if claimed is None else claimed.handoff


def review_route_required(handoff: Handoff) -> ReviewRouteRequired:
    """The refusal of a plain handoff route touching an agent-review slot (nothing written)."""
    return ReviewRouteRequired(
        "this handoff is a review slot: claim it, renew its lease and bind its verdict through the review routes",
        handoff_id=handoff.id, purpose=handoff.purpose, route="/api/v1/review-packets/claim",
    )


def _explain_unclaimable(caller: Caller, handoff_id: int, caps: list[str], now: datetime) -> NoReturn:
    try:
        handoff = visible_handoffs(caller).select_related("session").get(id=handoff_id)
    except Handoff.DoesNotExist:
        raise NotFound("handoff not found", handoff_id=handoff_id) from None
    if handoff.purpose != HandoffPurpose.JOB:
        raise review_route_required(handoff)
    missing = sorted(set(handoff.required_capabilities) - set(caps))
    lease_live = leases.handoff_lease_held(handoff.state, handoff.lease_expires_at, now)
    raise HandoffNotClaimable(
        "this handoff cannot be claimed now", handoff_id=handoff.id, state=handoff.state,
        missing_capabilities=missing, lease_held=bool(lease_live),
        lease_expires_at=handoff.lease_expires_at.isoformat() if handoff.lease_expires_at else None,
        session_status=handoff.session.status,
    )


# ---- heartbeat ----------------------------------------------------------------------------------------
# Private: the review app renews its reviewers' leases through ``control.service.renew``.
_HEARTBEAT_SQL = f"""
UPDATE {_H}
   SET heartbeat_at = %(now)s, lease_expires_at = %(now)s + make_interval(secs => timeout_seconds)
 WHERE id = %(id)s AND project_id = ANY(%(projects)s)
   AND (%(bound)s::bigint IS NULL OR session_id = %(bound)s::bigint)
   AND purpose = %(purpose)s AND state = %(claimed)s AND fencing_token = %(token)s
   AND NOT EXISTS (SELECT 1 FROM {_S} s WHERE s.id = session_id AND s.status = ANY(%(closed_statuses)s))
RETURNING lease_expires_at, attempt
"""


@dataclass(frozen=True)
class Lease:
    handoff_id: int
    attempt: int
    fencing_token: int
    lease_expires_at: datetime


def renew_lease(
    *, handoff_id: int, fencing_token: int, project_ids: Collection[int], session_id: int | None,
    purpose: HandoffPurpose,
) -> Lease:
    """One conditional UPDATE (no transaction, no event); a miss is explained by
    :func:`lease_refusal`. The fencing token decides, not the clock: a holder whose lease ran
    out may renew it as long as nobody has claimed the handoff since."""
    if not 0 < handoff_id <= BIGINT_MAX or not 0 < fencing_token <= BIGINT_MAX:
        raise lease_refusal(handoff_id=handoff_id, fencing_token=fencing_token, project_ids=project_ids,
                            session_id=session_id, purpose=purpose)
    with connection.cursor() as cur:
        cur.execute(
            _HEARTBEAT_SQL,
            {"now": timezone.now(), "id": handoff_id, "projects": list(project_ids), "bound": session_id,
             "purpose": HandoffPurpose(purpose).value, "claimed": HandoffState.CLAIMED.value, "token": fencing_token,
             "closed_statuses": _LEASE_PARAMS["closed_statuses"]},
        )
        row = cur.fetchone()
    if row is None:
        raise lease_refusal(handoff_id=handoff_id, fencing_token=fencing_token, project_ids=project_ids,
                            session_id=session_id, purpose=purpose)
    return Lease(handoff_id, row[1], fencing_token, row[0])


def heartbeat_handoff(caller: Caller, handoff_id: int, *, fencing_token: int) -> Lease:
    """Extend the lease of the current token holder of a job handoff: one conditional UPDATE."""
    caller.require("work")
    return renew_lease(handoff_id=handoff_id, fencing_token=fencing_token, project_ids=caller.project_ids,
                       session_id=caller.session_id, purpose=HandoffPurpose.JOB)


def lease_refusal(
    *, handoff_id: int, fencing_token: int, project_ids: Collection[int], session_id: int | None,
    purpose: HandoffPurpose,
) -> ServiceError:
    """Why a lease write matched nothing, most fundamental reason first: unknown (404), the
    wrong route for its purpose (409 ``review_route_required``), a superseded token (409
    ``stale_lease``), not claimed (``handoff_not_claimable``) or closed (``handoff_closed``: bound,
    conflicted, cancelled — or its session is terminated or stale, ``details.session_status``)."""
    handoff = (
        _scoped(project_ids, session_id).select_related("session").filter(id=handoff_id).first()
        if 0 < handoff_id <= BIGINT_MAX else None
    )
    if handoff is None:
        return NotFound("handoff not found", handoff_id=handoff_id)
    if handoff.purpose != purpose:
        if handoff.purpose == HandoffPurpose.REVIEW:
            return review_route_required(handoff)
        return NotFound("handoff not found", handoff_id=handoff_id)  # a review route never names a plain job
    if fencing_token != handoff.fencing_token:
        return StaleLease(
            "this fencing token was superseded by a later claim", handoff_id=handoff.id,
            fencing_token=fencing_token, current_fencing_token=handoff.fencing_token, attempt=handoff.attempt,
        )
    if handoff.state == HandoffState.PENDING:
        return HandoffNotClaimable("this handoff is not claimed", handoff_id=handoff.id, state=handoff.state)
    if handoff.state == HandoffState.CLAIMED and handoff.session.status in lc.WORK_CLOSED_STATUSES:
        return session_closed_to_work(handoff, handoff.session.status)
    return HandoffClosed("this handoff takes no more lease traffic", handoff_id=handoff.id, state=handoff.state)


def session_closed_to_work(handoff: Handoff, session_status: str) -> HandoffClosed:
    """The refusal of a result or lease renewal for a handoff whose session takes no more work
    (terminated, stale: ``lifecycles.WORK_CLOSED_STATUSES``): nothing is consumed into it.
    Entering those statuses cancels the session's unbound handoffs (then their state refuses);
    this answers the same for one such a session left open before it did."""
    return HandoffClosed(
        f"this handoff's session is {session_status}: it takes no more results or lease traffic",
        handoff_id=handoff.id, state=handoff.state, session_status=session_status,
    )


def raise_lease_refusal(caller: Caller, handoff_id: int, fencing_token: int) -> NoReturn:
    """Explain why a lease write on a job handoff matched nothing (see :func:`lease_refusal`)."""
    raise lease_refusal(handoff_id=handoff_id, fencing_token=fencing_token, project_ids=caller.project_ids,
                        session_id=caller.session_id, purpose=HandoffPurpose.JOB)


def lock_handoff(caller: Caller, handoff_id: int) -> tuple[Session, Handoff]:
    """Lock a visible handoff's session, then the handoff (the global lock order). 404 if foreign."""
    try:
        session_id = visible_handoffs(caller).values_list("session_id", flat=True).get(id=handoff_id)
    except Handoff.DoesNotExist:
        raise NotFound("handoff not found", handoff_id=handoff_id) from None
    session = lock_session(caller, session_id)
    return session, Handoff.objects.select_for_update().get(id=handoff_id)


# ---- cancel -------------------------------------------------------------------------------------------
def cancel_handoff(caller: Caller, handoff_id: int, *, reason: str = "") -> Handoff:
    """The run no longer needs this job. A bound result stays bound (refused with 409); a
    review slot is withdrawn with its gate (409 ``review_route_required``)."""
    caller.require("write")
    with transaction.atomic():
        session, handoff = lock_handoff(caller, handoff_id)
        if handoff.purpose != HandoffPurpose.JOB:
            raise review_route_required(handoff)
        if handoff.state == HandoffState.CANCELLED:
            return handoff
        if handoff.state not in UNBOUND_STATES:
            raise HandoffClosed("only a handoff still waiting for its result can be cancelled", state=handoff.state)
        outbox = Outbox(caller.label)
        cancel_locked(session, [handoff], reason=reason, outbox=outbox)
        outbox.flush()
    return handoff


def cancel_locked(
    session: Session, handoffs: Iterable[Handoff], *, reason: str, outbox: Outbox, settle_reason: str | None = None,
) -> list[Handoff]:
    """Cancel the still-unbound ``handoffs`` of a locked session (rows locked by the caller,
    inside its transaction): each goes ``cancelled`` with a ``handoff.cancelled`` event, then
    every run they belonged to is settled with ``settle_reason`` (default: "handoff X
    cancelled" naming the last one). Returns the handoffs it cancelled."""
    now = timezone.now()
    done: list[Handoff] = []
    for handoff in handoffs:
        if handoff.state not in UNBOUND_STATES:
            continue
        move(handoff, lc.HANDOFF, HandoffState.CANCELLED, cancelled_at=now)
        outbox.add(session, ev.HANDOFF_CANCELLED, run_id=handoff.run_id, handoff_id=handoff.id,
                   logical_id=handoff.logical_id, reason=reason)
        done.append(handoff)
    last_per_run = {h.run_id: h for h in done}
    for run_id, handoff in last_per_run.items():
        settle_waiting_run(session, run_id, outbox, reason=settle_reason or cancelled_reason(handoff))
    return done
