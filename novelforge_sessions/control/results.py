"""The result pipeline (docs/model.md#results-and-idempotent-delivery): delivery ≠ validation ≠ consumption.

``deliver_result`` is ONE write transaction per arrival and always logs a ``ResultDelivery``:

1. The server hashes the result (sha256 over canonical JSON) and reads the handoff together
   with its receipt, if any — one query.
2. A receipt exists and the hash matches → ``already_consumed`` (200, the original outcome).
   Cost: that read plus the delivery-log row (its own autocommit transaction). No
   validation row, no event, no lock.
3. A receipt exists and the hash differs → hard stop: 409 ``conflicting_result``. The first
   conflict marks the handoff ``conflicted``, raises ``Session.open_conflict`` (always),
   fails the session where the lifecycle table allows it (else it keeps its state) and emits
   a conflict event. Nothing is consumed twice; the consumed payload is never touched.
   (A *superseded* lease holder is refused with ``stale_lease`` instead: it holds no lease,
   so its write is not a result of this job.)
4. No receipt: the fencing token must be current and the handoff claimed; the result is
   validated (its schema, and that it cites the frozen job fingerprint) and the validation
   recorded. Invalid → 422 ``invalid_result`` (logged, nothing consumed).
5. Valid → under the session lock, a fenced conditional UPDATE binds the handoff (row count
   checked: of many concurrent deliveries exactly one gets it), the receipt is inserted
   (``ON CONFLICT DO NOTHING`` on the unique (project, logical id) index), and when the run
   waits on nothing else the session returns from ``awaiting_external`` to ``running``.
   Losers of that race re-read the receipt and are answered by 2 or 3.

Refusals that must still be recorded (the delivery row, a conflict) are committed first and
raised after commit, so the log and the hard stop survive the 4xx.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from novelforge_sessions import events
from novelforge_sessions import event_types as ev
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.control.handoffs import (
    RESULTS_BOUND_REASON,
    lock_handoff,
    review_route_required,
    session_closed_to_work,
    settle_waiting_run,
    visible_handoffs,
)
from novelforge_sessions.actions.lifecycle import (
    BIGINT_MAX, Outbox, apply_transition, check, lock_session, move, move_rows,
)
from novelforge_sessions.control.fingerprints import canonical_json, fingerprint
from novelforge_sessions.control.result_schema import result_problems
from novelforge_sessions.control.models import (
    ConsumeReceipt,
    DeliveryOutcome,
    Handoff,
    HandoffPurpose,
    HandoffState,
    ResultDelivery,
    ResultValidation,
)
from novelforge_sessions.errors import (
    AlreadyConsumed,
    Conflict,
    ConflictingResult,
    HandoffClosed,
    HandoffNotClaimable,
    InvalidResult,
    NoOpenConflict,
    NotFound,
    ResultHashMismatch,
    ServiceError,
    StaleLease,
    ValidationFailed,
)
from novelforge_sessions.models import Session
from novelforge_sessions.phrases import Phrase, gettext_noop

MAX_RESULT_BYTES = 128 * 1024



@dataclass
class Delivered:
    """A 200 answer: ``consumed`` (this arrival was consumed) or ``already_consumed``."""

    outcome: str
    delivery: ResultDelivery
    receipt: ConsumeReceipt
    handoff: Handoff
    session_status: str


# ---- pure validation ------------------------------------------------------------------------
def result_digest(result: Any, stated_hash: str | None = None) -> tuple[dict[str, Any], str]:
    """Shape-check a result body and compute its hash (pure)."""
    if not isinstance(result, dict):
        raise ValidationFailed("result must be a JSON object", field="result")
    result = check(rt.validate_metadata, result, "result", MAX_RESULT_BYTES)
    try:
        digest = fingerprint(result)
    except ValueError:
        raise ValidationFailed("result must be plain JSON (no NaN or Infinity)", field="result") from None
    if stated_hash is not None and not rt.is_fingerprint(stated_hash):
        # Not a sha256 at all (the schema's pattern): a malformed field, not a mismatch.
        raise ValidationFailed("result_hash must look like sha256:<64 hex digits>", field="result_hash")
    if stated_hash is not None and stated_hash != digest:
        raise ResultHashMismatch(
            "result_hash does not match the server's sha256 of the canonical result",
            field="result_hash", stated=stated_hash, computed=digest,
        )
    return result, digest


def check_against_job(handoff: Handoff, result: dict[str, Any], stated_job_fingerprint: str) -> list[dict[str, str]]:
    """Validation proper: the result cites the frozen job and fits its result schema (pure)."""
    problems: list[dict[str, str]] = []
    if stated_job_fingerprint != handoff.job_fingerprint:
        problems.append({"path": "job_fingerprint", "message": "does not cite the frozen job's fingerprint"})
    # The frozen job's result schema, as JSON Schema, checked by jsonschema (control/result_schema.py).
    problems.extend(result_problems(handoff.result_schema or {}, result))
    return problems


# ---- the action ---------------------------------------------------------------------------------
def _receipt_of(handoff: Handoff) -> ConsumeReceipt | None:
    try:
        return handoff.receipt
    except ConsumeReceipt.DoesNotExist:
        return None


def _read(caller: Caller, handoff_id: int, *, lock: bool = False) -> Handoff:
    qs = visible_handoffs(caller).select_related("receipt", "session")
    if lock:
        qs = qs.select_for_update(of=("self",))
    try:
        return qs.get(id=handoff_id)
    except Handoff.DoesNotExist:
        raise NotFound("handoff not found", handoff_id=handoff_id) from None


def _log(handoff: Handoff, token: int, digest: str, outcome: str, actor: str, payload: dict | None = None) -> ResultDelivery:
    return ResultDelivery.objects.create(
        handoff=handoff, attempt=min(token, handoff.attempt),
        fencing_token=token, result_hash=digest, payload=payload, outcome=outcome, delivered_by=actor,
    )


def deliver_result(
    caller: Caller, handoff_id: int, *, fencing_token: int, job_fingerprint: str, result: Any,
    result_hash: str | None = None,
) -> Delivered:
    caller.require("work")
    if not isinstance(fencing_token, int) or isinstance(fencing_token, bool) or not 1 <= fencing_token <= BIGINT_MAX:
        raise ValidationFailed("fencing_token must be the positive integer your claim returned", field="fencing_token")
    if not isinstance(job_fingerprint, str):
        raise ValidationFailed("job_fingerprint must be a string", field="job_fingerprint")
    result, digest = result_digest(result, result_hash)
    handoff = _read(caller, handoff_id)
    if handoff.purpose != HandoffPurpose.JOB:
        # A review slot is answered with a typed verdict through the review routes: refused
        # before anything is written (no delivery row, no validation, no event).
        raise review_route_required(handoff)
    receipt = _receipt_of(handoff)
    if receipt is not None and receipt.result_hash == digest:
        # The hot duplicate path: a receipt is immutable, so this read needs no lock and
        # the delivery-log INSERT is the whole (autocommit) write transaction.
        delivery = _log(handoff, fencing_token, digest, DeliveryOutcome.ALREADY_CONSUMED, caller.label)
        return Delivered(DeliveryOutcome.ALREADY_CONSUMED, delivery, receipt, handoff, handoff.session.status)
    refusal: ServiceError | None = None
    answer: Delivered | None = None
    with transaction.atomic():
        events.order_lock(handoff.session_id)  # before anything below writes (events.order_lock)
        if receipt is not None:
            answer, refusal = _against_receipt(caller, handoff, receipt, fencing_token, digest, result, None)
        elif fencing_token != handoff.fencing_token:
            _log(handoff, fencing_token, digest, DeliveryOutcome.STALE_LEASE, caller.label)
            refusal = _stale(handoff, fencing_token)
        elif handoff.state != HandoffState.CLAIMED:
            _log(handoff, fencing_token, digest, DeliveryOutcome.NOT_CLAIMABLE, caller.label)
            refusal = _not_claimable(handoff)
        elif handoff.session.status in lc.WORK_CLOSED_STATUSES:
            # Entering terminated/stale cancels the session's unbound handoffs (a racing delivery
            # finds its handoff cancelled under the session lock); this answers the same for a
            # handoff such a session left open before it did. Terminal for work: no lock needed.
            _log(handoff, fencing_token, digest, DeliveryOutcome.NOT_CLAIMABLE, caller.label)
            refusal = session_closed_to_work(handoff, handoff.session.status)
        else:
            problems = check_against_job(handoff, result, job_fingerprint)
            if problems:
                refusal = _record_invalid(caller, handoff, fencing_token, digest, result, job_fingerprint, problems)
            else:
                answer, refusal = _consume(caller, handoff, fencing_token, digest, result, job_fingerprint)
    if refusal is not None:
        raise refusal
    assert answer is not None
    return answer


def _stale(handoff: Handoff, token: int) -> StaleLease:
    return StaleLease(
        "this fencing token was superseded by a later claim; the write is refused", handoff_id=handoff.id,
        fencing_token=token, current_fencing_token=handoff.fencing_token, attempt=handoff.attempt,
    )


def _not_claimable(handoff: Handoff) -> Conflict:
    if handoff.state == HandoffState.PENDING:
        return HandoffNotClaimable("claim this handoff before delivering its result", handoff_id=handoff.id, state=handoff.state)
    return HandoffClosed("this handoff takes no more results", handoff_id=handoff.id, state=handoff.state)


def _record_invalid(
    caller: Caller, handoff: Handoff, token: int, digest: str, result: dict, stated: str, problems: list[dict],
) -> InvalidResult:
    delivery = _log(handoff, token, digest, DeliveryOutcome.INVALID, caller.label, payload=result)
    ResultValidation.objects.create(
        delivery=delivery, valid=False, cites_job_fingerprint=stated == handoff.job_fingerprint,
        stated_job_fingerprint=stated[:80], errors=problems,
    )
    events.append(
        project_id=handoff.project_id, session_id=handoff.session_id, run_id=handoff.run_id, type=ev.HANDOFF_RESULT_INVALID,
        actor=caller.label,
        payload={"handoff_id": handoff.id, "logical_id": handoff.logical_id, "delivery_id": delivery.id,
                 "result_hash": digest, "errors": problems},
    )
    return InvalidResult(
        "the result is not a valid result of the frozen job; the delivery was logged and nothing was consumed",
        handoff_id=handoff.id, delivery_id=delivery.id, errors=problems,
    )


def _against_receipt(
    caller: Caller, handoff: Handoff, receipt: ConsumeReceipt, token: int, digest: str, result: dict,
    session: Session | None,
) -> tuple[Delivered | None, ServiceError | None]:
    """The logical id was consumed already: a duplicate, a superseded writer, or a conflict."""
    if receipt.result_hash == digest:
        # The hot duplicate path: the log row only. The payload is identical to the receipt's.
        delivery = _log(handoff, token, digest, DeliveryOutcome.ALREADY_CONSUMED, caller.label)
        status = session.status if session is not None else handoff.session.status
        return Delivered(DeliveryOutcome.ALREADY_CONSUMED, delivery, receipt, handoff, status), None
    if token != handoff.fencing_token:
        _log(handoff, token, digest, DeliveryOutcome.STALE_LEASE, caller.label)
        return None, _stale(handoff, token)
    return None, _conflict(caller, handoff, receipt, token, digest, result, session)


def _conflict(
    caller: Caller, handoff: Handoff, receipt: ConsumeReceipt, token: int, digest: str, result: dict,
    session: Session | None,
) -> ConflictingResult:
    if session is None:
        # Session, then handoff (the global lock order): the first conflict decides the
        # session's fate exactly once, however many conflicting deliveries race.
        session = lock_session(caller, handoff.session_id)
    handoff = Handoff.objects.select_for_update().get(id=handoff.id)
    delivery = _log(handoff, token, digest, DeliveryOutcome.CONFLICTING_RESULT, caller.label, payload=result)
    outbox = Outbox(caller.label)
    if not lc.conflict_open(handoff.state):
        move(handoff, lc.HANDOFF, HandoffState.CONFLICTED, conflict_at=timezone.now())
        reason = f"conflicting_result: {handoff.logical_id}"[:200]
        fails = lc.SESSION.is_legal(session.status, rt.SessionStatus.FAILED)
        if not session.open_conflict:
            # The hard stop is always flagged, whether the session fails (where the table allows
            # it) or keeps its state (idle, completed, stale, already failed…): a manager must
            # resolve it before the session runs again (resume, start_run and transition check
            # it). The first open conflict's reason stands until resolved.
            session.open_conflict = reason
            Session.objects.filter(id=session.id).update(open_conflict=reason, updated_at=timezone.now())
        # The cause first, then its effect on the session.
        outbox.add(
            session, ev.HANDOFF_RESULT_CONFLICT, run_id=handoff.run_id, handoff_id=handoff.id,
            logical_id=handoff.logical_id, consumed_hash=receipt.result_hash, conflicting_hash=digest,
            receipt_id=receipt.id, delivery_id=delivery.id,
            session_status=rt.SessionStatus.FAILED.value if fails else session.status,
            open_conflict=session.open_conflict or None,
        )
        if fails:
            apply_transition(session, rt.SessionStatus.FAILED, reason=reason, outbox=outbox, run_end_state=rt.RunState.FAILED)
        outbox.flush()
    return ConflictingResult(
        "a different result arrived for a logical id that was already consumed: hard stop",
        handoff_id=handoff.id, logical_id=handoff.logical_id, consumed_hash=receipt.result_hash,
        delivered_hash=digest, receipt_id=receipt.id, delivery_id=delivery.id, session_status=session.status,
        open_conflict=session.open_conflict or None,
    )


_RECEIPT_SQL = f"""
INSERT INTO {ConsumeReceipt._meta.db_table}
       (project_id, logical_id, handoff_id, session_id, run_id, delivery_id, job_fingerprint, result_hash, result, consumed_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s)
ON CONFLICT (project_id, logical_id) DO NOTHING
RETURNING id
"""


def _consume(
    caller: Caller, handoff: Handoff, token: int, digest: str, result: dict, stated: str,
) -> tuple[Delivered | None, ServiceError | None]:
    # The session lock serialises everything that decides this session's state; the
    # fenced UPDATE below then decides, by its row count, which delivery binds the result.
    session = lock_session(caller, handoff.session_id)
    now = timezone.now()
    bound = move_rows(
        Handoff.objects.filter(id=handoff.id, state=HandoffState.CLAIMED, fencing_token=token), lc.HANDOFF,
        HandoffState.BOUND, bound_at=now,
    )
    if bound != 1:
        # Someone bound it (or re-claimed it, or cancelled it) while we waited: look again.
        fresh = _read(caller, handoff.id)
        receipt = _receipt_of(fresh)
        if receipt is not None:
            return _against_receipt(caller, fresh, receipt, token, digest, result, session)
        if token != fresh.fencing_token:
            _log(fresh, token, digest, DeliveryOutcome.STALE_LEASE, caller.label)
            return None, _stale(fresh, token)
        _log(fresh, token, digest, DeliveryOutcome.NOT_CLAIMABLE, caller.label)
        return None, _not_claimable(fresh)
    outbox = Outbox(caller.label)
    receipt = _record_consumption(
        session, handoff, token=token, digest=digest, result=result, stated=stated, now=now, actor=caller.label,
        outbox=outbox,
    )
    delivery = receipt.delivery
    settle_waiting_run(session, handoff.run_id, outbox, reason=RESULTS_BOUND_REASON)
    outbox.flush()
    return Delivered(DeliveryOutcome.CONSUMED, delivery, receipt, handoff, session.status), None


def _record_consumption(
    session: Session, handoff: Handoff, *, token: int, digest: str, result: dict, stated: str, now: datetime,
    actor: str, outbox: Outbox,
) -> ConsumeReceipt:
    """The records of a consumption, once the fenced UPDATE has bound the handoff: the
    ``consumed`` delivery log row, its validation, the consume-once receipt (the unique index
    is the last word) and the ``handoff.result_consumed`` event in the caller's outbox."""
    handoff.state, handoff.bound_at = HandoffState.BOUND, now
    delivery = _log(handoff, token, digest, DeliveryOutcome.CONSUMED, actor, payload=result)
    ResultValidation.objects.create(delivery=delivery, valid=True, cites_job_fingerprint=True, stated_job_fingerprint=stated)
    with connection.cursor() as cur:
        cur.execute(
            _RECEIPT_SQL,
            [handoff.project_id, handoff.logical_id, handoff.id, handoff.session_id, handoff.run_id, delivery.id,
             handoff.job_fingerprint, digest, canonical_json(result).decode(), now],
        )
        row = cur.fetchone()
    if row is None:
        # Unreachable while handoff logical ids are unique too; the index is the last word.
        raise AlreadyConsumed("this logical id was consumed concurrently", logical_id=handoff.logical_id)
    receipt = ConsumeReceipt(
        id=row[0], project_id=handoff.project_id, logical_id=handoff.logical_id, handoff_id=handoff.id,
        session_id=handoff.session_id, run_id=handoff.run_id, delivery=delivery,
        job_fingerprint=handoff.job_fingerprint, result_hash=digest, result=result, consumed_at=now,
    )
    outbox.add(
        session, ev.HANDOFF_RESULT_CONSUMED, run_id=handoff.run_id, handoff_id=handoff.id, logical_id=handoff.logical_id,
        delivery_id=delivery.id, receipt_id=receipt.id, result_hash=digest, attempt=handoff.attempt,
    )
    return receipt


def consume_locked(
    session: Session, handoff: Handoff, *, fencing_token: int, result: dict[str, Any], actor: str, outbox: Outbox,
) -> ConsumeReceipt:
    """Bind ``result`` to a handoff whose session and row the caller has locked (inside the
    caller's transaction), with the same records as a delivery (``_record_consumption``);
    returns the receipt (public as ``control.service.bind``). The caller has checked the fencing token and validated
    ``result`` against its own schema (e.g. a typed review verdict), and settles the run
    afterwards."""
    result, digest = result_digest(result)
    now = timezone.now()
    # Fenced: the row is locked, so this only re-states the caller's checks as the write's condition.
    bound = move_rows(
        Handoff.objects.filter(id=handoff.id, state=HandoffState.CLAIMED, fencing_token=fencing_token), lc.HANDOFF,
        HandoffState.BOUND, bound_at=now,
    )
    if bound != 1:
        raise _stale(handoff, fencing_token) if fencing_token != handoff.fencing_token else _not_claimable(handoff)
    receipt = _record_consumption(
        session, handoff, token=fencing_token, digest=digest, result=result, stated=handoff.job_fingerprint, now=now,
        actor=actor, outbox=outbox,
    )
    return receipt


# ---- conflict resolution ------------------------------------------------------------------------------
def resolve_conflict(caller: Caller, handoff_id: int, *, resolution: str) -> Handoff:
    """A manager acknowledges a hard stop: the consumed result stands (nothing is consumed
    again), the handoff returns to ``bound`` and the session's open-conflict flag clears when
    no other conflict of the session is open. The session's status is not touched: a failed
    session is resumed as usual."""
    caller.require("approve")
    if not isinstance(resolution, str) or not resolution.strip() or len(resolution) > 200:
        raise ValidationFailed(Phrase(gettext_noop("resolution must say how the conflict was resolved (1–200 characters)")),
                               field="resolution")
    check(rt.check_storable_text, resolution, "resolution")  # the API's and the page's one refusal
    with transaction.atomic():
        session, handoff = lock_handoff(caller, handoff_id)
        if not lc.conflict_open(handoff.state):
            raise NoOpenConflict("this handoff has no open conflict", state=handoff.state)
        move(handoff, lc.HANDOFF, HandoffState.BOUND, conflict_resolved_at=timezone.now(), conflict_resolution=resolution)
        others = Handoff.objects.filter(session=session, state=HandoffState.CONFLICTED).exists()
        if session.open_conflict and not others:
            session.open_conflict = ""
            Session.objects.filter(id=session.id).update(open_conflict="", updated_at=timezone.now())
        outbox = Outbox(caller.label)
        outbox.add(session, ev.HANDOFF_CONFLICT_RESOLVED, run_id=handoff.run_id, handoff_id=handoff.id,
                   logical_id=handoff.logical_id, resolution=resolution, open_conflict=session.open_conflict or None)
        outbox.flush()
    return handoff
