"""The one place a status is written.

``apply_transition`` checks the contract's table (pure core, ``lifecycles.SESSION``), then
applies what the new state implies for the session's open run and live runtime. Every other
record's state (run, runtime attachment, handoff, write intent, review gate, assignment) is
written by :func:`move` (one loaded row) or :func:`move_rows` (a conditional UPDATE), both
checked against that record's table in ``lifecycles``. ``apply_transition`` expects the caller to hold
the session row lock (``lock_session``) and to be inside ``transaction.atomic()``. It does
not append events itself: it returns them, and the action appends every event last (see
``events`` for why).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from novelforge_sessions import event_types as ev
from novelforge_sessions import events, leases
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.errors import (
    NoLiveRuntime, NotFound, RuntimeRequired, StaleRuntime, VersionConflict, WaitOutstanding, from_rule_error,
)
from novelforge_sessions.models import LIVE_RUNTIME_PARAMS, Run, RuntimeAttachment, Session, live_runtime_sql


#: PostgreSQL bigint, the type of every id and fencing token column. Storing or casting a larger
#: integer fails in the database (DataError); the ORM's lookups already treat it as "no row".
BIGINT_MAX = 2**63 - 1


@dataclass
class Outbox:
    """Events an action will append, in order, as its last statements."""

    actor: str
    items: list[dict[str, Any]] = field(default_factory=list)

    def add(self, session: Session, type: ev.EventType, run_id: int | None = None, **payload: Any) -> None:
        """Queue one event: ``type`` is a catalog constant, checked against its declared fields now
        (``TypeError`` on a string, a missing or an unknown field)."""
        if not isinstance(type, ev.EventType):
            raise TypeError(f"Outbox.add takes an event_types constant, not {type!r}")
        self.items.append(
            {"project_id": session.project_id, "session_id": session.id, "run_id": run_id, "type": type,
             "payload": type(**payload)}
        )

    def flush(self) -> list[int]:
        if len(self.items) == 1:
            return [events.append(actor=self.actor, **self.items[0])]
        return events.append_many([{**item, "actor": self.actor} for item in self.items])  # one statement


# ``lock_session(..., project=False)`` and ``open_run`` in SQL: these are the hot paths' reads
# (every transition), where compiling the equivalent ORM queries would cost more CPU than running
# them. Scoping
# matches ``Caller.sessions()``: the caller's projects, and only its session for a bound token.
# The session's liveness rides along (``session.runtime_live``, the one rule in SQL): the
# transition's runtime check costs no statement of its own.
_LOCK_SESSION_SQL = f"""
SELECT s.*, {live_runtime_sql("s.id")} AS runtime_live FROM {Session._meta.db_table} AS s
 WHERE s.id = %(id)s AND s.project_id = ANY(%(projects)s) AND (%(bound)s::bigint IS NULL OR s.id = %(bound)s::bigint)
   AND {events.order_lock_sql("%(id)s::bigint")}
   FOR UPDATE OF s
"""
_OPEN_RUN_SQL = f"SELECT * FROM {Run._meta.db_table} WHERE session_id = %s AND state = %s"


def lock_session(caller: Caller, session_id: int, *, project: bool = True) -> Session:
    """Lock the session row (lock order: session, then its run, then its runtime).

    ``project=False`` skips loading ``session.project`` (a later access would query it) and
    reads whether the session has a live runtime into ``session.runtime_live`` in the same
    statement (for :func:`require_live_runtime`).
    """
    assert transaction.get_connection().in_atomic_block
    # The session's ordering lock first (events.order_lock): then the row lock below is never
    # contended by this session's other writers, and this transaction's xid (its event ids)
    # is drawn after theirs committed.
    if not project:
        events.before_order_lock(session_id)
        params = {"id": session_id, "projects": list(caller.project_ids), "bound": caller.session_id,
                  "now": timezone.now(), **LIVE_RUNTIME_PARAMS}
        # A larger id names no row (as the ORM would say), never a 500.
        session = next(iter(Session.objects.raw(_LOCK_SESSION_SQL, params)), None) if 0 < session_id <= BIGINT_MAX else None
        if session is None:
            raise NotFound("session not found", session_id=session_id)
        return session
    if not 0 < session_id <= BIGINT_MAX:  # a larger id names no row (as the ORM would say), never a 500
        raise NotFound("session not found", session_id=session_id)
    events.before_order_lock(session_id)
    # The ordering lock inside the locking statement (a one-time filter, evaluated before the
    # scan and so before the row lock): no extra round trip.
    order_lock = events.order_lock_filter("%s::bigint", [session_id])
    try:
        # of=("self",): lock only the session row, not the joined project.
        return (
            caller.sessions().filter(order_lock).select_related("project").select_for_update(of=("self",))
            .get(id=session_id)
        )
    except Session.DoesNotExist:
        raise NotFound("session not found", session_id=session_id) from None


def check(fn, *args, **kwargs):
    """Call a pure validator, turning its refusal into a service error."""
    try:
        return fn(*args, **kwargs)
    except rt.RuntimeRuleError as exc:
        raise from_rule_error(exc) from None


def open_run(session: Session, *, lock: bool = True) -> Run | None:
    """The session's open run (at most one: a partial unique index), locked unless ``lock=False``."""
    sql = _OPEN_RUN_SQL + (" FOR UPDATE" if lock else "")
    return next(iter(Run.objects.raw(sql, [session.id, rt.RunState.OPEN.value])), None)


def live_runtime(session: Session, *, lock: bool = True, now: datetime | None = None) -> RuntimeAttachment | None:
    """The session's live runtime: its record says live *and* its lease has not run out
    (``RuntimeAttachment.objects.live``; docs/model.md#runtimes-and-leases). A record whose lease expired is not live."""
    qs = RuntimeAttachment.objects.live(now).filter(session=session)
    if lock:
        qs = qs.select_for_update()
    return qs.first()


def recorded_runtime(session: Session, *, lock: bool = True) -> RuntimeAttachment | None:
    """The attachment whose *record* says live (at most one, a partial unique index), whether
    or not its lease still holds. For tidying records, never as a liveness answer."""
    qs = RuntimeAttachment.objects.filter(session=session, state=rt.RuntimeState.LIVE)
    if lock:
        qs = qs.select_for_update()
    return qs.first()


def fit_reason(model: type[models.Model], column: str, reason: str) -> str:
    """``reason`` cut to what its column stores (``max_length`` characters, as PostgreSQL's
    varchar counts them). A reason is a human-readable note that often quotes caller input (a
    handoff's logical id, a gate's label): whoever builds it, the writers below store what fits
    instead of failing the whole change in the database (a 500 for a declared-valid request)."""
    max_length = model._meta.get_field(column).max_length
    return reason[:max_length] if max_length is not None else reason


def _fit_reasons(model: type[models.Model], fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with every reason column's text (``*reason``) cut to fit (:func:`fit_reason`)."""
    return {
        name: fit_reason(model, name, value) if name.endswith("reason") and isinstance(value, str) else value
        for name, value in fields.items()
    }


def move(obj: models.Model, lifecycle: lc.Lifecycle, target: str | StrEnum, **fields: Any) -> StrEnum:
    """The one transition helper for a loaded row of a non-session record: check
    ``current → target`` against ``lifecycle``'s table (409 ``illegal_transition`` otherwise,
    nothing written), set the state and ``fields``, and save exactly those columns. The caller
    holds the row (lock or conditional statement) inside its transaction. Sessions move
    through :func:`apply_transition`. A reason column's text is cut to fit (:func:`fit_reason`)."""
    assert lifecycle is not lc.SESSION, "session statuses move through apply_transition"
    fields = _fit_reasons(type(obj), fields)
    dst = check(lifecycle.check, getattr(obj, lifecycle.field), target)
    setattr(obj, lifecycle.field, dst.value)
    for name, value in fields.items():
        setattr(obj, name, value)
    obj.save(update_fields=[lifecycle.field, *fields])
    return dst


def move_rows(queryset: models.QuerySet, lifecycle: lc.Lifecycle, target: str | StrEnum, **fields: Any) -> int:
    """The conditional-UPDATE form of :func:`move`: rows of ``queryset`` whose state is a legal
    source of ``target`` (``lifecycle.sources``) move to ``target`` with ``fields``. Returns the
    row count: the caller decides what a miss means (someone else moved the row first). A reason
    column's text is cut to fit (:func:`fit_reason`)."""
    assert lifecycle is not lc.SESSION, "session statuses move through apply_transition"
    fields = _fit_reasons(queryset.model, fields)
    dst = lifecycle.state(target)
    return queryset.filter(**{f"{lifecycle.field}__in": lifecycle.sources(dst)}).update(
        **{lifecycle.field: dst.value}, **fields
    )


def end_run(run: Run, state: rt.RunState, reason: str, outbox: Outbox, session: Session) -> None:
    """End ``run`` in ``state``; its end reason (and the event's) is ``reason`` cut to fit the column."""
    move(run, lc.RUN, state, end_reason=reason, ended_at=timezone.now())
    outbox.add(session, ev.RUN_ENDED, run_id=run.id, seq=run.seq, state=run.state, reason=run.end_reason)


#: The event that records a runtime attachment's end, by the state it ended in.
RUNTIME_END_EVENTS = {rt.RuntimeState.CLOSED: ev.RUNTIME_CLOSED, rt.RuntimeState.LOST: ev.RUNTIME_LOST}


def end_runtime(attachment: RuntimeAttachment, state: rt.RuntimeState, reason: str, outbox: Outbox, session: Session) -> None:
    """End ``attachment`` in ``state``; its end reason (and the event's) is ``reason`` cut to fit the column."""
    move(attachment, lc.RUNTIME, state, end_reason=reason, ended_at=timezone.now())
    outbox.add(
        session, RUNTIME_END_EVENTS[state], runtime_id=attachment.id, generation=attachment.generation,
        reason=attachment.end_reason,
    )


@dataclass(frozen=True)
class Hold:
    """One thing a run waits on that holds its session (a pending review gate): until it is
    settled the run may not continue past it nor end ``completed`` (``lifecycles.passes_waits``).
    ``awaits`` is the awaiting state it keeps the session in (a person: ``awaiting_user``; an
    agent reviewer: ``awaiting_external``)."""

    kind: str
    id: int
    label: str
    awaits: rt.SessionStatus

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.id, "label": self.label, "awaits": self.awaits.value}


#: What a run waits on that holds it. The registry of wait kinds is the control plane's
#: (``control/waits.py``, a layer above): it installs its query here at start-up
#: (``ControlConfig.ready``), so session actions ask it without importing it.
_holds_query: Callable[[Session, Run], list[Hold]] | None = None


def install_holds_query(query: Callable[[Session, Run], list[Hold]]) -> None:
    global _holds_query
    _holds_query = query


def holds(session: Session, run: Run) -> list[Hold]:
    """What ``run`` waits on that holds ``session``, per the wait registry (oldest first)."""
    if _holds_query is None:  # a fail-loud wiring error, never a silent "nothing waits"
        raise RuntimeError("the control plane's wait registry is not installed (novelforge_sessions.control app)")
    return _holds_query(session, run)


#: Withdrawing what a session waits on (its unbound handoffs, pending review gates, … every
#: registered wait kind), installed by the control plane at start-up like the holds query.
_withdraw_waits: Callable[[Session, Outbox, str], None] | None = None


def install_withdraw_waits(withdraw: Callable[[Session, Outbox, str], None]) -> None:
    global _withdraw_waits
    _withdraw_waits = withdraw


def withdraw_waits(session: Session, outbox: Outbox, reason: str) -> None:
    """Cancel everything ``session`` waits on, with its events in ``outbox`` (the wait registry's
    cancel mechanisms: ``handoff.cancelled``, ``review.gate_cancelled``, …). Under the session lock."""
    if _withdraw_waits is None:  # a fail-loud wiring error, never a silent "nothing to withdraw"
        raise RuntimeError("the control plane's wait registry is not installed (novelforge_sessions.control app)")
    _withdraw_waits(session, outbox, reason)


def refuse_held(session: Session, run: Run | None, target: str | StrEnum) -> None:
    """Refuse (409 ``wait_outstanding``, nothing written) a move that takes ``run`` past what it
    still waits on: continuing (``→ running``) or ending it ``completed`` while a pending review
    gate holds it. Other moves (failed, terminated, stale) and runs waiting on nothing pass.
    Call it under the session row lock, after the other refusals (it is the business check)."""
    if run is None or not lc.passes_waits(session.status, target):
        return
    held = holds(session, run)
    if held:
        raise WaitOutstanding(
            f"the run still waits on {', '.join(h.label for h in held)}: it continues when the wait is settled "
            "(verdicts bound, or the gate cancelled)",
            status=session.status, to=str(target), run_id=run.id, waiting_on=[h.as_dict() for h in held],
        )


def check_version(session: Session, expected_version: int | None) -> None:
    """The caller's compare-and-swap precondition: it comes before every other refusal (what
    the caller saw is outdated, so whatever it meant to do is decided on stale ground)."""
    if expected_version is not None and expected_version != session.version:
        raise VersionConflict(
            "the session changed since you read it", expected_version=expected_version, version=session.version,
            status=session.status,
        )


def apply_transition(
    session: Session,
    target: str,
    *,
    reason: str,
    outbox: Outbox,
    expected_version: int | None = None,
    run_end_state: rt.RunState | None = None,
    current_run: Run | None | bool = True,
) -> rt.SessionStatus:
    """Move a locked session to ``target`` and settle its run/runtime accordingly.

    ``current_run``: the session's open run if the caller already holds it, ``None`` if it
    knows there is none, or ``True`` (default) to look it up here. ``reason`` is stored cut to
    fit ``Session.status_reason`` (:func:`fit_reason`); the event carries what was stored.
    """
    reason = fit_reason(Session, "status_reason", reason)
    check_version(session, expected_version)
    source = rt.SessionStatus(session.status)
    dst = check(lc.SESSION.check, source, target)

    leaving_run = lc.holds_run(source) and not lc.holds_run(dst)
    if leaving_run:
        run = open_run(session) if current_run is True else current_run
        if run is not None:
            end_run(run, run_end_state or lc.RUN_END_ON_STATUS[dst], reason or dst.value, outbox, session)
    if dst is rt.SessionStatus.TERMINATED:
        # Whatever the record says live ends with the session, its lease run out or not.
        attachment = recorded_runtime(session)
        if attachment is not None:
            end_runtime(attachment, rt.RuntimeState.CLOSED, "terminated", outbox, session)

    session.status = dst.value
    session.status_reason = reason
    session.version += 1
    # generation and run_count ride along: resume and start_run bump them on the locked row
    # just before the transition, so the session is written once per action.
    session.save(update_fields=["status", "status_reason", "version", "generation", "run_count", "updated_at"])
    outbox.add(
        session, ev.SESSION_TRANSITIONED, **{"from": source.value, "to": dst.value, "reason": reason, "version": session.version}
    )
    if dst in lc.WORK_CLOSED_STATUSES:
        # A session that can only end takes no more external work: what it waits on is withdrawn
        # in this transaction, after the move (the cause first, then its effects; and the
        # withdrawal's settling finds the session no longer waiting, so it wakes nothing).
        # A worker or reviewer still holding a lease then renews and delivers nothing.
        withdraw_waits(session, outbox, f"session {dst.value}: {reason}"[:200] if reason else f"session {dst.value}")
    return dst


#: ``fence_runtime(..., attachment=LOOKUP)``: look the session's live runtime up (the default).
LOOKUP: Any = object()


def fence_runtime(
    caller: Caller, session: Session, runtime_id: int | None, *, attachment: RuntimeAttachment | None | Any = LOOKUP,
) -> None:
    """Refuse a write from a superseded runtime generation (docs/model.md#generation-fencing).

    Call it under the session row lock, after the lifecycle checks and before anything is
    written. ``attachment`` is the session's live-state runtime if the action already holds it.

    * A named ``runtime_id`` must be the session's live runtime (state live and lease not run
      out), whoever the caller: else 409 ``stale_runtime``.
    * An unnamed write from an API token is accepted only while the session has had at most one
      generation (nobody to confuse it with); after that, 409 ``runtime_required``.
    * Managers acting from the pages (``caller.user_id``) and the service itself (the reconciler,
      management commands: no token) are their own principal and are not fenced.

    Fencing answers *which* generation may write; whether the session's runtime is still there
    at all is :func:`require_live_runtime`, which the runtime's own work on its run calls next.
    """
    if runtime_id is None:
        if not acts_for_runtime(caller) or session.generation <= 1:
            return
        raise RuntimeRequired(
            "this session has had more than one runtime generation: name your runtime (runtime_id) in the write",
            field="runtime_id", generation=session.generation,
        )
    if attachment is LOOKUP:
        attachment = live_runtime(session, lock=False)
    now = timezone.now()
    live = attachment if attachment is not None and leases.runtime_is_live(attachment.state, attachment.lease_expires_at, now) else None
    if live is not None and live.id == runtime_id:
        return
    raise StaleRuntime(
        "this runtime is not the session's live runtime (superseded, closed or lost): nothing was written",
        runtime_id=runtime_id,
        live_runtime_id=live.id if live is not None else None,
        live_generation=live.generation if live is not None else None,
    )


def acts_for_runtime(caller: Caller) -> bool:
    """An API token's write is made on behalf of the session's runtime. A manager acting from the
    pages (``caller.user_id``) and the service itself (no token) are their own principal."""
    return caller.token_id is not None and caller.user_id is None


def runtime_gone(session_id: int, status: str) -> NoLiveRuntime:
    """The one refusal of the runtime's own work once the session has no live runtime."""
    return NoLiveRuntime(
        "the session has no live runtime (its lease ran out, or it was closed or lost): nothing was written; "
        "resume the session to continue its work",
        session_id=session_id, status=status,
    )


def require_live_runtime(caller: Caller, session: Session, *, live: bool | None = None) -> None:
    """Refuse the runtime's own work on its run (ending it, moving out of ``running`` as
    ``lifecycles.runtime_move`` says, a checkpoint, a cursor, a handoff, a review gate) once the
    session has no live runtime by its lease (docs/model.md#runtimes-and-leases): 409 ``no_live_runtime``, nothing
    written. A runtime whose lease ran out is gone before any reconciler pass records it lost, so
    a write made on its behalf is refused the moment the lease runs out, and still after the pass.

    Call it under the locks, after the run's own refusals. Only writes made on a runtime's behalf
    (:func:`acts_for_runtime`) are refused: a manager on the pages and the service keep working,
    and the manager's writes that need no runtime (terminate, close, abort, cancel, resolve a
    conflict) never call this. A write that named its runtime and passed :func:`fence_runtime`
    needs no second look: fencing a named runtime proves it the session's live one.
    ``live``: whether the session has a live runtime, if the action's locking statement already
    read it (``session.runtime_live``, ``models.live_runtime_sql``); else it is looked up here.
    """
    if not acts_for_runtime(caller):
        return
    if live is None:
        live = live_runtime(session, lock=False) is not None
    if not live:
        raise runtime_gone(session.id, session.status)
