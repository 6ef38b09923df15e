"""Session actions: create, transition, close, abort, forget (docs/model.md#session-operations).

Resume lives in ``control/resume.py``: it is a validation act of its own (docs/model.md#resume).
Each action: authorize (``caller``), validate (pure core), then one ``transaction.atomic()``
that locks the session row, writes, and appends its events last.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from novelforge_sessions import event_types as ev
from novelforge_sessions import events
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.actions.lifecycle import (
    Outbox,
    apply_transition,
    check,
    check_version,
    end_runtime,
    fence_runtime,
    live_runtime,
    lock_session,
    open_run,
    refuse_held,
    require_live_runtime,
)
from novelforge_sessions.actions.runtimes import RuntimeSpec, visible_runtime, insert_attachment, refuse_live_runtime
from novelforge_sessions.errors import Forbidden, NoLiveRuntime, NoOpenRun, OpenConflict
from novelforge_sessions.models import RuntimeAttachment, Session


@dataclass(frozen=True)
class NewSession:
    role: str
    memory_policy: str
    task_mode: str
    runtime_family: str
    role_extension: str = ""
    provider_metadata: dict[str, Any] | None = None


def create_session(caller: Caller, spec: NewSession, *, runtime: RuntimeSpec | None = None) -> Session:
    """Create the durable record (status ``created``), optionally with runtime generation 1.

    A token bound to a session is refused (403 ``forbidden``, nothing written): it is that
    session's identity and creates no other (``access.BOUND_TOKEN_MATRIX``, ``new_session``)."""
    caller.require("write")
    if caller.bound_for("new_session") is not None:
        raise Forbidden(
            "a token bound to a session acts as that session and creates no other: creating a session (or opening a "
            "graph thread, which opens one) needs a token that is not bound to a session"
        )
    valid = check(
        rt.validate_session_spec,
        role=spec.role,
        role_extension=spec.role_extension,
        memory_policy=spec.memory_policy,
        task_mode=spec.task_mode,
        runtime_family=spec.runtime_family,
    )
    metadata = check(rt.validate_metadata, spec.provider_metadata, "provider_metadata")
    project = caller.single_project()
    with transaction.atomic():
        session = Session.objects.create(
            project=project,
            role=valid.role.value,
            role_extension=valid.role_extension,
            memory_policy=valid.memory_policy.value,
            task_mode=valid.task_mode,
            runtime_family=valid.runtime_family,
            provider_metadata=metadata,
            created_by=caller.label,
        )
        events.order_lock(session.id, created=True)
        outbox = Outbox(caller.label)
        outbox.add(
            session, ev.SESSION_CREATED, role=session.role, memory_policy=session.memory_policy,
            task_mode=session.task_mode, runtime_family=session.runtime_family, status=session.status,
        )
        if runtime is not None:
            # Read out as the create response's ``runtime_id``: the runtime names it in its writes.
            session.created_runtime_id = insert_attachment(session, runtime, outbox).id
            session.save(update_fields=["generation"])
        outbox.flush()
    return session


def transition_session(
    caller: Caller, session_id: int, target: str, *, reason: str = "", expected_version: int | None = None,
    runtime_id: int | None = None,
) -> Session:
    """A client-requested lifecycle change. Entering ``running`` needs a run: use
    ``start_run`` (from created/idle/failed) or ``resume_session``; from an awaiting state the
    waiting run continues — unless something it waits on still holds it (a pending review
    gate: it continues when the verdicts are bound or the gate is cancelled). Nor may a held
    run end ``completed`` (``running → idle | completed``).

    Refusals, most fundamental first: not found → the caller's ``expected_version`` → the
    lifecycle table → generation fencing (``runtime_id``) → no run, or no live runtime, to
    enter running with; no live runtime for the runtime's own move out of running
    (``lifecycles.runtime_move``: a token's move to idle, a wait, completed or failed, refused
    as soon as the lease ran out; terminate and stale stay open) → an open conflict → a wait
    that holds the run (``wait_outstanding``). Each refusal writes nothing."""
    caller.require("write")
    with transaction.atomic():
        session = lock_session(caller, session_id, project=False)  # nothing here reads the project
        check_version(session, expected_version)
        check(lc.SESSION.check, session.status, target)
        entering_running = target == rt.SessionStatus.RUNNING
        attachment = live_runtime(session, lock=False) if entering_running or runtime_id is not None else None
        fence_runtime(caller, session, runtime_id, attachment=attachment)
        run = open_run(session) if lc.holds_run(session.status) else None
        if entering_running and run is None:
            raise NoOpenRun(
                "entering running needs a run: start one (POST /sessions/{id}/runs) or resume the session",
                status=session.status,
            )
        if entering_running and attachment is None:
            # Nothing would run it (and no lease could ever expire to tidy it up).
            raise NoLiveRuntime("entering running needs a live runtime: resume the session (it holds a run, so a new runtime only comes with resume)",
                                status=session.status)
        if lc.runtime_move(session.status, target):
            # Liveness was read by the session lock (no statement of its own on this hot path).
            require_live_runtime(caller, session, live=session.runtime_live)
        if entering_running and session.open_conflict:
            raise OpenConflict("the session has an open conflict; a manager must resolve it first",
                               reason=session.open_conflict)
        refuse_held(session, run, target)
        outbox = Outbox(caller.label)
        apply_transition(session, target, reason=reason, outbox=outbox, expected_version=expected_version, current_run=run)
        outbox.flush()
    return session


@dataclass(frozen=True)
class CloseResult:
    session: Session
    closed_runtime_id: int | None

    @property
    def already_closed(self) -> bool:
        return self.closed_runtime_id is None


def close_session(caller: Caller, session_id: int, *, reason: str = "closed", runtime_id: int | None = None) -> CloseResult:
    """End the live runtime generation; keep the record, runs, checkpoints and transcript.

    Idempotent: closing a session with no live runtime changes nothing and writes nothing
    (also for a runtime that names its own, already ended, generation — but a superseded
    generation naming itself is refused ``stale_runtime``, and while a runtime is live the
    write is fenced like every other). A ``running`` session goes ``idle`` (its run is
    interrupted); a waiting session keeps waiting — it waits on a person or a worker, not on
    its runtime.
    """
    caller.require("write")
    with transaction.atomic():
        session = lock_session(caller, session_id)
        attachment = live_runtime(session)
        if attachment is None and (runtime_id is None or _latest_generation(session, runtime_id)):
            return CloseResult(session, None)
        fence_runtime(caller, session, runtime_id, attachment=attachment)
        outbox = Outbox(caller.label)
        if session.status == rt.SessionStatus.RUNNING:
            apply_transition(session, rt.SessionStatus.IDLE, reason=reason, outbox=outbox, run_end_state=rt.RunState.INTERRUPTED)
        end_runtime(attachment, rt.RuntimeState.CLOSED, reason, outbox, session)
        outbox.flush()
    return CloseResult(session, attachment.id)


def _latest_generation(session: Session, runtime_id: int) -> bool:
    """Is ``runtime_id`` the session's newest generation (ended or not): nobody superseded it."""
    return RuntimeAttachment.objects.filter(id=runtime_id, session_id=session.id, generation=session.generation).exists()


def detach_runtime(caller: Caller, runtime_id: int, *, reason: str = "detached") -> RuntimeAttachment:
    """The runtime says goodbye: the same as closing its session's live generation (and only
    that generation: the close is fenced by this runtime's id)."""
    attachment = visible_runtime(caller, runtime_id)
    if attachment.state != rt.RuntimeState.LIVE:
        return attachment  # idempotent, like close
    close_session(caller, attachment.session_id, reason=reason, runtime_id=attachment.id)
    attachment.refresh_from_db()
    return attachment


@dataclass(frozen=True)
class AbortResult:
    session: Session
    run_id: int
    already_requested: bool


def abort_session(
    caller: Caller, session_id: int, *, reason: str = "abort requested", runtime_id: int | None = None
) -> AbortResult:
    """Cooperatively interrupt the current run: flag it; the runtime sees the flag on its next
    heartbeat and ends the run (outcome ``aborted``). Not close: the runtime stays live.

    Refusals: not found → a state that holds no run (``no_open_run``) → generation fencing."""
    caller.require("write")
    with transaction.atomic():
        session = lock_session(caller, session_id)
        run = open_run(session) if lc.holds_run(session.status) else None
        if run is None:
            raise NoOpenRun("there is no open run to abort", status=session.status)
        fence_runtime(caller, session, runtime_id)
        if run.abort_requested_at is not None:
            return AbortResult(session, run.id, True)
        run.abort_requested_at = timezone.now()
        run.save(update_fields=["abort_requested_at"])
        outbox = Outbox(caller.label)
        outbox.add(session, ev.RUN_ABORT_REQUESTED, run_id=run.id, seq=run.seq, reason=reason)
        outbox.flush()
    return AbortResult(session, run.id, False)


def forget_session(caller: Caller, session_id: int) -> None:
    """Delete the session's record (runs, checkpoints, transcript). Refused while a runtime is
    live (by its lease: an expired record is tidied first, its ``runtime.lost`` recorded)."""
    caller.require("write")
    with transaction.atomic():
        session = lock_session(caller, session_id)
        outbox = Outbox(caller.label)
        refuse_live_runtime(session, outbox, "close the live runtime before forgetting the session")
        outbox.add(session, ev.SESSION_FORGOTTEN, status=session.status, runs=session.run_count)
        session.delete()
        outbox.flush()
