"""Runs: one invocation inside a session (docs/model.md#runs). At most one open run per session."""
from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef

from novelforge_sessions import event_types as ev
from novelforge_sessions import events
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.actions import idempotency
from novelforge_sessions.actions.artifacts import require_versions
from novelforge_sessions.actions.lifecycle import (
    BIGINT_MAX,
    Outbox,
    apply_transition,
    check,
    fence_runtime,
    live_runtime,
    lock_session,
    open_run,
    refuse_held,
    require_live_runtime,
)
from novelforge_sessions.errors import NoLiveRuntime, NotFound, OpenConflict, OpenRunExists, RunNotOpen, ValidationFailed
from novelforge_sessions.models import Checkpoint, KeyedOperation, Run, RuntimeAttachment, Session


def create_run(
    session: Session, outbox: Outbox, *, task_mode: str, target: str = "", cursor: dict | None = None,
    frozen_inputs: list | None = None, resumed_from: Checkpoint | None = None,
) -> Run:
    """Insert run N+1 for a locked session and move it to ``running``."""
    session.run_count += 1
    run = Run.objects.create(
        session=session,
        seq=session.run_count,
        generation=session.generation,
        task_mode=task_mode,
        target=target,
        cursor=cursor or {},
        frozen_inputs=frozen_inputs or [],
        resumed_from=resumed_from,
    )
    outbox.add(
        session, ev.RUN_STARTED, run_id=run.id, seq=run.seq, generation=run.generation, task_mode=task_mode,
        cursor=run.cursor, resumed_from_checkpoint=resumed_from.id if resumed_from else None,
    )
    apply_transition(session, rt.SessionStatus.RUNNING, reason="run started", outbox=outbox, current_run=None)
    return run


def start_run(
    caller: Caller, session_id: int, *, task_mode: str | None = None, target: str = "",
    cursor: dict[str, Any] | None = None, frozen_inputs: list | None = None, runtime_id: int | None = None,
    idempotency_key: str | None = None,
) -> Run:
    """Run N+1. Refusals, most fundamental first: not found → lifecycle (``open_run_exists`` in
    a state that holds a run, ``illegal_transition`` where running cannot be entered) →
    generation fencing → ``no_live_runtime`` → ``open_conflict``.

    With an ``idempotency_key`` (scoped to the session), the same key and body answer the run
    the first request started, writing nothing, whatever the session did since; another body is
    ``idempotency_key_reused`` (``actions/idempotency.py``)."""
    caller.require("write")
    key = idempotency.key_for(KeyedOperation.START_RUN, session_id, idempotency_key, {
        "task_mode": task_mode, "target": target, "cursor": cursor, "frozen_inputs": frozen_inputs,
        "runtime_id": runtime_id,
    })

    def write() -> tuple[Run, int, idempotency.Answer]:
        run = _start_run(caller, session_id, task_mode=task_mode, target=target, cursor=cursor,
                         frozen_inputs=frozen_inputs, runtime_id=runtime_id)
        return run, run.session_id, idempotency.Answer(201, {"id": run.id})

    return idempotency.once(caller, key, write, lambda first: Run.objects.get(id=first.data["id"]))


def _start_run(
    caller: Caller, session_id: int, *, task_mode: str | None, target: str, cursor: dict[str, Any] | None,
    frozen_inputs: list | None, runtime_id: int | None,
) -> Run:
    if task_mode is not None:
        check(rt.validate_name, task_mode, "task_mode")
    if cursor is not None and not isinstance(cursor, dict):
        raise ValidationFailed("cursor must be a JSON object", field="cursor")
    check(rt.validate_metadata, cursor, "cursor", rt.MAX_CURSOR_BYTES)
    check(rt.validate_size, frozen_inputs, "frozen_inputs", rt.MAX_FROZEN_INPUTS_BYTES)
    cited = _cited_versions(frozen_inputs)
    with transaction.atomic():
        session = lock_session(caller, session_id)
        # The most fundamental refusal first: can the session enter running with a new run at
        # all (a state holding a run already has one; completed, stale, terminated have no way
        # into running)? Then generation fencing, then the runtime, then the conflict flag.
        existing = open_run(session, lock=False) if lc.holds_run(session.status) else None
        if existing is not None:
            raise OpenRunExists("this session already has an open run", run_id=existing.id, seq=existing.seq)
        check(lc.SESSION.check, session.status, rt.SessionStatus.RUNNING)
        attachment = live_runtime(session, lock=False)
        fence_runtime(caller, session, runtime_id, attachment=attachment)
        if attachment is None:
            raise NoLiveRuntime("attach a runtime before starting a run", status=session.status)
        if session.open_conflict:
            # A conflicting result is a hard stop (docs/model.md#runs): no new work until a manager resolves it.
            raise OpenConflict("the session has an open conflict; a manager must resolve it first",
                               reason=session.open_conflict)
        require_versions(caller, session.project_id, cited, what="frozen_inputs")
        outbox = Outbox(caller.label)
        run = create_run(
            session, outbox, task_mode=task_mode or session.task_mode, target=target, cursor=cursor,
            frozen_inputs=frozen_inputs,
        )
        outbox.flush()
    return run


def _cited_versions(frozen_inputs: list | None) -> list[tuple[int, str]]:
    """The artifact versions ``frozen_inputs`` cite. The list is free-form, but an item with an
    ``artifact_id`` is an artifact ref: it needs the version's ``fingerprint`` too (422 naming
    the item otherwise), and the pair must name a real version within the caller's reach
    (``require_versions``). A cited artifact is one the session was given
    (``access.artifacts_given_to``), so an id alone, or a fingerprint learnt elsewhere (a blind
    review packet carries its candidate's), would let a bound token give itself an artifact."""
    cited = []
    for index, item in enumerate(frozen_inputs or []):
        if not isinstance(item, dict) or "artifact_id" not in item:
            continue
        artifact_id = item["artifact_id"]
        if not isinstance(artifact_id, int) or isinstance(artifact_id, bool) or not 0 < artifact_id <= BIGINT_MAX:
            raise ValidationFailed("an artifact ref's artifact_id is a positive integer", field=f"frozen_inputs[{index}].artifact_id")
        cited.append((artifact_id, check(rt.validate_fingerprint, item.get("fingerprint"), f"frozen_inputs[{index}].fingerprint")))
    return cited


def _lock_run(caller: Caller, run_id: int) -> tuple[Session, Run]:
    """Lock session then run (the global lock order)."""
    try:
        session_id = Run.objects.filter(session__in=caller.sessions()).values_list("session_id", flat=True).get(id=run_id)
    except Run.DoesNotExist:
        raise NotFound("run not found", run_id=run_id) from None
    session = lock_session(caller, session_id)
    run = Run.objects.select_for_update().get(id=run_id)
    return session, run


def advance_cursor(caller: Caller, run_id: int, cursor: dict[str, Any], *, runtime_id: int | None = None) -> Run:
    """Refusals: not found → the run has ended (``run_not_open``: resume ended a superseded
    generation's run) → a named ``runtime_id`` that is not the live runtime (``stale_runtime``)
    → the session has no live runtime (``no_live_runtime``: its lease ran out, reconciled or not)."""
    caller.require("write")
    if not isinstance(cursor, dict) or not cursor:
        raise ValidationFailed("cursor must be a non-empty JSON object", field="cursor")
    check(rt.validate_metadata, cursor, "cursor", rt.MAX_CURSOR_BYTES)
    with transaction.atomic():
        if runtime_id is not None:
            # Fencing reads the session's live runtime: hold the session lock first (lock order).
            session, run = _lock_run(caller, run_id)
        else:
            if not 0 < run_id <= BIGINT_MAX:  # a larger id names no row, never a 500
                raise NotFound("run not found", run_id=run_id)
            events.before_order_lock()
            # The run's session's ordering lock inside the locking statement (events.order_lock).
            order_lock = events.order_lock_filter(f"SELECT session_id FROM {Run._meta.db_table} WHERE id = %s::bigint", [run_id])
            try:
                # The session's liveness rides along (no statement of its own on this hot path).
                live = Exists(RuntimeAttachment.objects.live().filter(session_id=OuterRef("session_id")))
                run = (
                    Run.objects.filter(order_lock).select_for_update(of=("self",)).select_related("session")
                    .annotate(runtime_live=live).get(id=run_id, session__in=caller.sessions())
                )
            except Run.DoesNotExist:
                raise NotFound("run not found", run_id=run_id) from None
            session = run.session
        if run.state != rt.RunState.OPEN:
            raise RunNotOpen("the run has ended", state=run.state)
        if runtime_id is not None:
            fence_runtime(caller, session, runtime_id)  # the named runtime is the live one
        else:
            require_live_runtime(caller, session, live=run.runtime_live)
        run.cursor = cursor
        run.save(update_fields=["cursor"])
        outbox = Outbox(caller.label)
        outbox.add(session, ev.RUN_CURSOR_ADVANCED, run_id=run.id, seq=run.seq, cursor=cursor)
        outbox.flush()
    return run


#: outcome → (run end state, default next session status, allowed next statuses): ``lifecycles.RUN_OUTCOMES``.
_OUTCOMES = {state.value: (state, default, allowed) for state, (default, allowed) in lc.RUN_OUTCOMES.items()}


def end_run(
    caller: Caller, run_id: int, *, outcome: str, session_status: str | None = None, reason: str = "",
    runtime_id: int | None = None,
) -> Run:
    """End the open run; the session leaves ``running`` for ``idle``/``completed``/``failed``
    (``lifecycles.run_end_status``). A waiting run (``awaiting_*``) may fail or be aborted —
    both leave the session ``failed``, the table having no ``awaiting_* → idle`` — but not
    end ``completed``; nor may a run that still waits on something that holds it (a pending
    review gate).

    Refusals, most fundamental first: not found → ``run_not_open`` → the lifecycle table (an
    awaiting session's run cannot end this way) → a named ``runtime_id`` that is not the live
    runtime (``stale_runtime``) → the session has no live runtime (``no_live_runtime``: its lease
    ran out, reconciled or not; a manager terminates instead) → a wait that holds the run
    (``wait_outstanding``)."""
    caller.require("write")
    if outcome not in _OUTCOMES:
        raise ValidationFailed("outcome must be completed, aborted or failed", field="outcome", allowed=sorted(_OUTCOMES))
    run_state, _, allowed = _OUTCOMES[outcome]
    target = rt.SessionStatus(session_status) if session_status in {s.value for s in rt.SessionStatus} else None
    if session_status is not None and (target is None or target not in allowed):
        raise ValidationFailed(
            f"after a {outcome} run the session may go to {sorted(s.value for s in allowed)}",
            field="session_status",
        )
    with transaction.atomic():
        session, run = _lock_run(caller, run_id)
        if run.state != rt.RunState.OPEN:
            raise RunNotOpen("the run has already ended", state=run.state)
        next_status = lc.run_end_status(run_state, session.status, target)
        check(lc.SESSION.check, session.status, next_status)
        if runtime_id is not None:
            fence_runtime(caller, session, runtime_id)  # the named runtime is the live one
        else:
            require_live_runtime(caller, session)
        if run_state is rt.RunState.COMPLETED:
            refuse_held(session, run, next_status)
        outbox = Outbox(caller.label)
        apply_transition(
            session, next_status, reason=reason or f"run {outcome}", outbox=outbox,
            run_end_state=run_state, current_run=run,
        )
        outbox.flush()
    return run
