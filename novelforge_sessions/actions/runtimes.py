"""Runtime attachments: attach, heartbeat, detach, and the reconciler for lost leases.

A runtime is one generation of a live process/chat/worker serving a session (seed 003). The
record saying ``live`` is an observation; liveness is the lease. A lease that ran out means
the runtime is gone: the reconciler ends it (``lost``) and, if the session was ``running``,
moves it to ``failed`` with reason ``runtime_lost`` — resumable (``failed → running``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import SYSTEM, Caller
from novelforge_sessions.actions.lifecycle import (
    Outbox,
    apply_transition,
    check,
    live_runtime,
    lock_session,
)
from novelforge_sessions.errors import LiveRuntimeExists, NotFound, RuntimeNotLive, ValidationFailed
from novelforge_sessions.models import Run, RuntimeAttachment, Session

log = logging.getLogger("novelforge.runtimes")

MAX_LEASE_SECONDS = 3600

#: States in which a runtime may serve the session (it could run, or is waiting).
_ATTACHABLE = frozenset(s for s in rt.SessionStatus if rt.SessionStatus.RUNNING in rt.LIFECYCLE[s]) | rt.RUN_HOLDING_STATES


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
        session, "runtime.attached", runtime_id=attachment.id, generation=attachment.generation,
        runtime_family=attachment.runtime_family, capabilities=caps,
    )
    return attachment


def attach_runtime(caller: Caller, session_id: int, spec: RuntimeSpec) -> RuntimeAttachment:
    caller.require("write")
    with transaction.atomic():
        session = lock_session(caller, session_id)
        existing = live_runtime(session, lock=False)
        if existing is not None:
            raise LiveRuntimeExists(
                "this session already has a live runtime", runtime_id=existing.id, generation=existing.generation
            )
        if session.status not in _ATTACHABLE:
            raise RuntimeNotLive(
                f"a {session.status} session takes no new runtime", code="session_not_attachable", status=session.status
            )
        outbox = Outbox(caller.label)
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
   AND r.state = 'live' AND r.lease_expires_at > %(now)s
RETURNING r.session_id,
          (SELECT ru.id FROM {Run._meta.db_table} ru WHERE ru.session_id = r.session_id AND ru.state = 'open'),
          (SELECT ru.abort_requested_at IS NOT NULL FROM {Run._meta.db_table} ru
            WHERE ru.session_id = r.session_id AND ru.state = 'open')
"""


def heartbeat_runtime(caller: Caller, runtime_id: int, *, lease_seconds: int | None = None) -> Heartbeat:
    """Extend a live lease. One conditional UPDATE; no event (liveness is not a state change).

    A lease that already ran out is not revived: the runtime is considered lost and must be
    replaced by a new generation (resume), so two generations never overlap.
    """
    caller.require("write")
    lease = _lease(lease_seconds)
    now = timezone.now()
    expires = now + timedelta(seconds=lease)
    with connection.cursor() as cur:
        cur.execute(
            _HEARTBEAT_SQL,
            {"now": now, "expires": expires, "lease": lease, "id": runtime_id,
             "projects": list(caller.project_ids), "bound": caller.session_id},
        )
        row = cur.fetchone()
    if row is None:
        attachment = _visible_runtime(caller, runtime_id)
        raise RuntimeNotLive(
            "this runtime is no longer live; resume the session to start a new generation",
            runtime_id=attachment.id, state=attachment.state,
            lease_expired=attachment.state == rt.RuntimeState.LIVE and attachment.lease_expires_at <= now,
        )
    session_id, run_id, abort = row
    return Heartbeat(runtime_id, session_id, expires, bool(abort), run_id)


def _visible_runtime(caller: Caller, runtime_id: int) -> RuntimeAttachment:
    try:
        return RuntimeAttachment.objects.get(id=runtime_id, session__in=caller.sessions())
    except RuntimeAttachment.DoesNotExist:
        raise NotFound("runtime not found", runtime_id=runtime_id) from None


def detach_runtime(caller: Caller, runtime_id: int, *, reason: str = "detached") -> RuntimeAttachment:
    """The runtime says goodbye: the same as closing its session's live generation."""
    from novelforge_sessions.actions.sessions import close_session

    attachment = _visible_runtime(caller, runtime_id)
    if attachment.state != rt.RuntimeState.LIVE:
        return attachment  # idempotent, like close
    close_session(caller, attachment.session_id, reason=reason)
    attachment.refresh_from_db()
    return attachment


@dataclass(frozen=True)
class Reconciled:
    runtime_id: int
    session_id: int
    session_status: str


def reconcile_expired_runtimes(*, now: datetime | None = None, limit: int = 100) -> list[Reconciled]:
    """Turn expired leases into ``lost`` runtimes and ``running`` sessions into ``failed``.

    Safe to run concurrently (several reconcilers, or one racing a close): each runtime is
    claimed by a conditional UPDATE whose row count is checked, under the session lock.
    Never makes a transition the table forbids: idle and waiting sessions keep their state.
    """
    now = now or timezone.now()
    candidates = list(
        RuntimeAttachment.objects.filter(state=rt.RuntimeState.LIVE, lease_expires_at__lte=now)
        .order_by("id")
        .values_list("id", "session_id")[:limit]
    )
    done: list[Reconciled] = []
    for runtime_id, session_id in candidates:
        with transaction.atomic():
            try:
                session = Session.objects.select_for_update().get(id=session_id)
            except Session.DoesNotExist:
                continue
            claimed = RuntimeAttachment.objects.filter(
                id=runtime_id, state=rt.RuntimeState.LIVE, lease_expires_at__lte=now
            ).update(state=rt.RuntimeState.LOST.value, end_reason="runtime_lost", ended_at=now)
            if claimed != 1:
                continue  # renewed, closed or reconciled by someone else meanwhile
            outbox = Outbox(SYSTEM.label + ":reconciler")
            outbox.add(session, "runtime.lost", runtime_id=runtime_id, reason="runtime_lost")
            if session.status == rt.SessionStatus.RUNNING:
                apply_transition(
                    session, rt.SessionStatus.FAILED, reason="runtime_lost", outbox=outbox,
                    run_end_state=rt.RunState.INTERRUPTED,
                )
            outbox.flush()
        log.info("reconciled runtime %s of session %s: session now %s", runtime_id, session_id, session.status)
        done.append(Reconciled(runtime_id, session_id, session.status))
    return done
