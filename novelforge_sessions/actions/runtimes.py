"""Runtime attachments: attach, heartbeat, detach, and the reconciler for lost leases.

A runtime is one generation of a live process/chat/worker serving a session. The
record saying ``live`` is an observation; liveness is the lease (``novelforge_sessions.leases``,
docs/model.md#runtimes-and-leases). A lease that ran out means the runtime is gone, whether or not a record says so
yet: no resume, attach or forget is blocked by its record, and no write made on its behalf is
accepted (``actions.lifecycle.require_live_runtime``). ``expire_runtime`` turns that into records and
events — the runtime ends ``lost`` and, if the session was ``running``, the session moves to
``failed`` with reason ``runtime_lost`` (resumable, ``failed → running``). The reconciler calls
it for every expired lease; resume, attach and forget call it inline for the session they
lock, so the one-live-runtime index never makes an expired record block them.

``wake_waiting_session`` is the same rule for a wait that settles: a waiting session whose
results or verdicts are bound (or whose wait is cancelled) continues ``running`` only if a
runtime is live to run it; else it goes ``failed / runtime_lost`` as a running session whose
runtime is gone would — whether or not a reconciler pass ran first.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from novelforge_sessions import commit, events, leases
from novelforge_sessions import event_types as ev
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import SYSTEM, Caller
from novelforge_sessions.actions import idempotency
from novelforge_sessions.actions.lifecycle import (
    Outbox,
    apply_transition,
    check,
    live_runtime,
    lock_session,
    move_rows,
    open_run,
    recorded_runtime,
)
from novelforge_sessions.errors import LiveRuntimeExists, NotFound, OpenRunExists, RuntimeNotLive, ValidationFailed
from novelforge_sessions.models import KeyedOperation, Run, RuntimeAttachment, Session

log = logging.getLogger("novelforge.runtimes")

MAX_LEASE_SECONDS = 3600
#: The status reason (and the lost runtime's end reason) when a session's runtime is gone.
RUNTIME_LOST = "runtime_lost"

#: States the table lets enter ``running`` (or that hold a run: a waiting session, refused below
#: with ``open_run_exists``; a ``running`` one whose lease ran out fails first, then attaches).
_ATTACHABLE = frozenset(s for s in rt.SessionStatus if lc.resumable(s) or lc.holds_run(s))


@dataclass(frozen=True)
class RuntimeSpec:
    runtime_family: str
    capabilities: list[str] = field(default_factory=list)
    provider_metadata: dict[str, Any] | None = None
    lease_seconds: int | None = None


def _lease(seconds: int | None) -> int:
    value = seconds or settings.RUNTIME_LEASE_SECONDS
    if not 1 <= value <= MAX_LEASE_SECONDS:
        raise ValidationFailed(f"lease_seconds must be between 1 and {MAX_LEASE_SECONDS}", field="lease_seconds")
    return value


def insert_attachment(session: Session, spec: RuntimeSpec, outbox: Outbox) -> RuntimeAttachment:
    """Create generation N+1 for a locked session. The caller saves ``session.generation``."""
    caps = check(rt.validate_capabilities, spec.capabilities)
    metadata = check(rt.validate_metadata, spec.provider_metadata, "provider_metadata")
    check(rt.validate_name, spec.runtime_family, "runtime_family")
    lease = _lease(spec.lease_seconds)
    now = timezone.now()
    session.generation += 1
    attachment = RuntimeAttachment.objects.create(
        session=session,
        generation=session.generation,
        runtime_family=spec.runtime_family,
        capabilities=caps,
        provider_metadata=metadata,
        lease_seconds=lease,
        lease_expires_at=now + timedelta(seconds=lease),
        heartbeat_at=now,
    )
    outbox.add(
        session, ev.RUNTIME_ATTACHED, runtime_id=attachment.id, generation=attachment.generation,
        runtime_family=attachment.runtime_family, capabilities=caps,
    )
    return attachment


def expire_runtime(
    session: Session, attachment: RuntimeAttachment, outbox: Outbox, *, now: datetime | None = None
) -> bool:
    """Record that a runtime whose lease ran out is gone: ``lost`` / ``runtime_lost``, event
    ``runtime.lost``, and a ``running`` session ``failed`` (reason ``runtime_lost``, its run
    interrupted). Idle and waiting sessions keep their state: they wait on a person or a worker,
    not on the runtime — never a transition the table forbids.

    The caller holds the session lock inside ``transaction.atomic()`` and flushes ``outbox``.
    The runtime is claimed by a conditional UPDATE (still live, lease still expired at ``now``);
    returns False, writing nothing, if it was renewed, closed or tidied meanwhile.
    """
    now = now or timezone.now()
    claimed = move_rows(
        RuntimeAttachment.objects.lease_expired(now).filter(id=attachment.id), lc.RUNTIME, rt.RuntimeState.LOST,
        end_reason=RUNTIME_LOST, ended_at=now,
    )
    if claimed != 1:
        return False
    attachment.state, attachment.end_reason, attachment.ended_at = rt.RuntimeState.LOST.value, RUNTIME_LOST, now
    outbox.add(
        session, ev.RUNTIME_LOST, runtime_id=attachment.id, generation=attachment.generation, reason=RUNTIME_LOST,
    )
    after = lc.status_after_runtime_loss(session.status)
    if after != session.status:
        apply_transition(
            session, after, reason=RUNTIME_LOST, outbox=outbox, run_end_state=rt.RunState.INTERRUPTED,
        )
    return True


def fail_without_runtime(session: Session, outbox: Outbox, *, now: datetime | None = None) -> None:
    """Record that nothing runs a locked session that holds a run and has no live runtime (the
    caller established that, by the lease): a record still saying live whose lease ran out is
    recorded ``lost`` (:func:`expire_runtime`), and the session goes where the reconciler puts a
    ``running`` session whose runtime is gone — ``failed`` with reason ``runtime_lost``, its run
    interrupted (resumable). What its run bound (results, verdicts) stays bound: resume carries it."""
    record = recorded_runtime(session, lock=False)
    if record is not None:
        expire_runtime(session, record, outbox, now=now)  # a running session fails here already
    after = lc.status_after_runtime_loss(rt.SessionStatus.RUNNING)
    if session.status != after:
        apply_transition(session, after, reason=RUNTIME_LOST, outbox=outbox, run_end_state=rt.RunState.INTERRUPTED)


def wake_waiting_session(
    session: Session, outbox: Outbox, *, reason: str, current_run: Run | None | bool = True,
    runtime_live: bool | None = None, now: datetime | None = None,
) -> rt.SessionStatus:
    """A locked ``awaiting_*`` session's wait was settled (its results or verdicts bound, or what
    it waited on cancelled) and nothing else holds its run: the run continues (``→ running``,
    ``reason``) — if a runtime is live to run it, by its lease (docs/model.md#runtimes-and-leases). Otherwise nothing
    would run it, and no lease could ever run out to tidy it: :func:`fail_without_runtime`
    (``failed / runtime_lost``, its run interrupted, an expired record recorded lost), the same
    end state whether or not a reconciler pass recorded the runtime lost first. Resume is then the
    way back, carrying what was bound.

    ``runtime_live``: whether the session has a live runtime, if the caller's locking statement
    already read it; ``current_run``: as :func:`apply_transition` takes it. Returns the new status.
    """
    now = now or timezone.now()
    if runtime_live is None:
        runtime_live = live_runtime(session, lock=False, now=now) is not None
    if runtime_live:
        return apply_transition(
            session, rt.SessionStatus.RUNNING, reason=reason, outbox=outbox, current_run=current_run,
        )
    fail_without_runtime(session, outbox, now=now)
    return rt.SessionStatus(session.status)


def refuse_live_runtime(session: Session, outbox: Outbox, message: str, *, now: datetime | None = None) -> None:
    """For actions that need the locked session to have no live runtime (resume, attach, forget).

    Refused ``live_runtime_exists`` only if a runtime is live by its lease. A record that
    still says live with its lease run out is tidied here first (``expire_runtime``, its events
    into ``outbox``), as the reconciler would have.
    """
    now = now or timezone.now()
    # No row lock here (lock order: session, run, runtime): the session lock is held, and
    # expire_runtime's conditional UPDATE takes the runtime row when it writes.
    record = recorded_runtime(session, lock=False)
    if record is None:
        return
    if leases.runtime_is_live(record.state, record.lease_expires_at, now) or not expire_runtime(
        session, record, outbox, now=now
    ):
        raise LiveRuntimeExists(message, runtime_id=record.id, generation=record.generation)


def attach_runtime(caller: Caller, session_id: int, spec: RuntimeSpec, *,
                   idempotency_key: str | None = None) -> RuntimeAttachment:
    """Generation N+1 for a session without an open run. Refusals, most fundamental first: not
    found → ``illegal_transition`` (the session can never run again: completed, stale,
    terminated) → ``live_runtime_exists`` (one is live by its lease) → ``open_run_exists`` (the
    session still holds an open run, waiting on a person or a worker, whose runtime is gone).

    A new runtime never takes over an open run: continuing a run under another execution
    identity is what resume is for, a fresh validation act (docs/model.md#resume: authority, fingerprints,
    approvals and capabilities checked again). Resume works from the waiting state itself: the
    waiting run ends superseded and a new run carries what it waits on (still waiting, if a gate
    holds it). Left alone, the session keeps waiting and fails ``runtime_lost`` when the wait
    settles (``wake_waiting_session``). A refusal writes nothing (an expired record tidied on
    the way is rolled back with it; the reconciler records it).

    With an ``idempotency_key`` (scoped to the session), the same key and body answer the runtime
    the first request attached, writing nothing; another body is ``idempotency_key_reused``
    (``actions/idempotency.py``).
    """
    caller.require("write")
    key = idempotency.key_for(KeyedOperation.ATTACH, session_id, idempotency_key, asdict(spec))

    def write() -> tuple[RuntimeAttachment, int, idempotency.Answer]:
        attachment = _attach_runtime(caller, session_id, spec)
        return attachment, attachment.session_id, idempotency.Answer(201, {"id": attachment.id})

    return idempotency.once(caller, key, write,
                            lambda first: RuntimeAttachment.objects.get(id=first.data["id"]))


def _attach_runtime(caller: Caller, session_id: int, spec: RuntimeSpec) -> RuntimeAttachment:
    with transaction.atomic():
        session = lock_session(caller, session_id)
        if session.status not in _ATTACHABLE:
            # The lifecycle refuses first: this session can never run again (completed, stale,
            # terminated), whatever its runtimes say.
            check(lc.SESSION.check, session.status, rt.SessionStatus.RUNNING)
        outbox = Outbox(caller.label)
        refuse_live_runtime(session, outbox, "this session already has a live runtime")
        # (A running session whose lease ran out was failed just above: it holds no run now.)
        if lc.holds_run(session.status):
            run = open_run(session, lock=False)
            raise OpenRunExists(
                "this session holds an open run whose runtime is gone; a new runtime cannot take it "
                "over: resume the session (it revalidates and carries what the run waits on into a new run)",
                run_id=run.id if run else None, status=session.status,
            )
        attachment = insert_attachment(session, spec, outbox)
        session.save(update_fields=["generation", "updated_at"])
        outbox.flush()
    return attachment


@dataclass(frozen=True)
class Heartbeat:
    runtime_id: int
    session_id: int
    lease_expires_at: datetime
    abort_requested: bool
    open_run_id: int | None


_HEARTBEAT_SQL = f"""
UPDATE {RuntimeAttachment._meta.db_table} AS r
   SET heartbeat_at = %(now)s, lease_expires_at = %(expires)s, lease_seconds = %(lease)s
  FROM {Session._meta.db_table} AS s
 WHERE r.id = %(id)s AND r.session_id = s.id AND s.project_id = ANY(%(projects)s)
   AND (%(bound)s::bigint IS NULL OR s.id = %(bound)s::bigint)
   AND r.state = %(live)s AND r.lease_expires_at > %(now)s
RETURNING r.session_id,
          (SELECT ru.id FROM {Run._meta.db_table} ru WHERE ru.session_id = r.session_id AND ru.state = %(open)s),
          (SELECT ru.abort_requested_at IS NOT NULL FROM {Run._meta.db_table} ru
            WHERE ru.session_id = r.session_id AND ru.state = %(open)s)
"""
#: The state values the heartbeat statement takes as parameters (never literals in the SQL).
_HEARTBEAT_PARAMS = {"live": rt.RuntimeState.LIVE.value, "open": rt.RunState.OPEN.value}


def heartbeat_runtime(caller: Caller, runtime_id: int, *, lease_seconds: int | None = None) -> Heartbeat:
    """Extend a live lease. One conditional UPDATE; no event (liveness is not a state change).

    A lease that already ran out is not revived: the runtime is considered lost and must be
    replaced by a new generation (resume), so two generations never overlap.
    """
    caller.require("write")
    lease = _lease(lease_seconds)
    now = timezone.now()
    expires = now + timedelta(seconds=lease)
    # One statement, its own transaction (commit.execute_write: one round trip, prepared, seen by
    # the fault hook).
    row = commit.execute_write(_HEARTBEAT_SQL, {
        **_HEARTBEAT_PARAMS, "now": now, "expires": expires, "lease": lease, "id": runtime_id,
        "projects": list(caller.project_ids), "bound": caller.session_id,
    })
    if row is None:
        attachment = visible_runtime(caller, runtime_id)
        raise RuntimeNotLive(
            "this runtime is no longer live; resume the session to start a new generation",
            runtime_id=attachment.id, state=attachment.state,
            lease_expired=leases.runtime_lease_expired(attachment.state, attachment.lease_expires_at, now),
        )
    session_id, run_id, abort = row
    return Heartbeat(runtime_id, session_id, expires, bool(abort), run_id)


def visible_runtime(caller: Caller, runtime_id: int) -> RuntimeAttachment:
    try:
        return RuntimeAttachment.objects.get(id=runtime_id, session__in=caller.sessions())
    except RuntimeAttachment.DoesNotExist:
        raise NotFound("runtime not found", runtime_id=runtime_id) from None


@dataclass(frozen=True)
class Reconciled:
    runtime_id: int
    session_id: int
    session_status: str


def reconcile_expired_runtimes(
    *, now: datetime | None = None, batch_size: int = 100, limit: int | None = None
) -> list[Reconciled]:
    """Turn every lease expired at ``now`` (default: when the pass starts) into records and events.

    Drains: reads the expired runtimes in batches of ``batch_size`` (keyset on id) until none
    is left, so one pass leaves no lease that had expired when it started; ``limit`` caps the
    total (None: all). Each runtime is tidied by ``expire_runtime`` in its own transaction,
    under the session lock; safe to run concurrently (several reconcilers, or one racing a
    close or an inline tidy): a runtime someone else tidied meanwhile is skipped.
    """
    now = now or timezone.now()
    done: list[Reconciled] = []
    after = 0
    while limit is None or len(done) < limit:
        batch = list(
            RuntimeAttachment.objects.lease_expired(now).filter(id__gt=after)
            .order_by("id").only("id", "session_id", "generation", "state", "lease_expires_at")[:batch_size]
        )
        if not batch:
            break
        after = batch[-1].id
        for attachment in batch:
            if limit is not None and len(done) >= limit:
                break
            with transaction.atomic():
                events.order_lock(attachment.session_id)
                session = Session.objects.select_for_update().filter(id=attachment.session_id).first()
                if session is None:
                    continue
                outbox = Outbox(SYSTEM.label + ":reconciler")
                if not expire_runtime(session, attachment, outbox, now=now):
                    continue  # renewed, closed or tidied by someone else meanwhile
                outbox.flush()
            log.info("reconciled runtime %s of session %s: session now %s", attachment.id, session.id, session.status)
            done.append(Reconciled(attachment.id, session.id, session.status))
    return done
