"""The one transition helper (``actions.lifecycle.move`` / ``move_rows``) and the shared
predicates (``lifecycles``, ``leases``) that actions and pages both ask (docs/model.md#record-lifecycles)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from novelforge_sessions import leases
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.actions.lifecycle import move, move_rows
from novelforge_sessions.errors import IllegalTransition
from novelforge_sessions.models import Event, Run, RuntimeAttachment

S, R, T, H = rt.SessionStatus, rt.RunState, rt.RuntimeState, lc.HandoffState


# ---- the helper, against real rows -------------------------------------------------------------------
@pytest.mark.django_db
def test_move_checks_the_table_and_writes_nothing_when_refused(new_session, owner):
    session = new_session(run=True)
    assert owner.post(f"/runs/{session['run']['id']}/end", {"outcome": "completed"}).status_code == 200
    run = Run.objects.get(id=session["run"]["id"])
    before = (run.state, run.end_reason, run.ended_at)
    events = Event.objects.count()
    with pytest.raises(IllegalTransition) as info, transaction.atomic():
        move(run, lc.RUN, R.FAILED, end_reason="late")
    assert info.value.http_status == 409 and info.value.code == "illegal_transition"
    assert info.value.details == {"record": "run", "from": "completed", "to": "failed", "allowed": []}
    run.refresh_from_db()
    assert (run.state, run.end_reason, run.ended_at) == before and Event.objects.count() == events


@pytest.mark.django_db
def test_move_sets_the_state_and_fields_and_saves_only_those(new_session):
    session = new_session(run=True)
    run = Run.objects.get(id=session["run"]["id"])
    Run.objects.filter(id=run.id).update(cursor={"step": "elsewhere"})  # a column move() must not overwrite
    now = timezone.now()
    assert move(run, lc.RUN, R.ABORTED, end_reason="stop", ended_at=now) is R.ABORTED
    fresh = Run.objects.get(id=run.id)
    assert (fresh.state, fresh.end_reason, fresh.ended_at, fresh.cursor) == ("aborted", "stop", now, {"step": "elsewhere"})


@pytest.mark.django_db
def test_every_reason_writer_stores_a_reason_that_fits_its_column(new_session, project):
    """``apply_transition`` (status_reason), ``end_run`` and ``end_runtime`` (end_reason), ``move``
    and ``move_rows`` cut a reason to its column whoever built it: no caller can overflow one."""
    from novelforge_sessions.actions.lifecycle import Outbox, apply_transition, end_runtime, lock_session
    from novelforge_sessions.models import Session
    from tests.support.factories import caller_for

    long = "because " + "x" * 400
    session = new_session(run=True)
    with transaction.atomic():
        locked = lock_session(caller_for(project), session["id"])
        outbox = Outbox("test")
        apply_transition(locked, S.TERMINATED, reason=long, outbox=outbox)  # ends the run and the runtime
        outbox.flush()
    fresh = Session.objects.get(id=session["id"])
    assert (fresh.status, fresh.status_reason) == ("terminated", long[:200])
    run = Run.objects.get(id=session["run"]["id"])
    assert run.state != "open" and run.end_reason == long[:200]
    transitioned = Event.objects.filter(session_id=session["id"], type="session.transitioned").latest("id")
    ended = Event.objects.filter(session_id=session["id"], type="run.ended").latest("id")
    assert transitioned.payload["reason"] == long[:200] and ended.payload["reason"] == long[:200]

    other = new_session(run=True)
    runtime = RuntimeAttachment.objects.get(session_id=other["id"])
    with transaction.atomic():
        locked = lock_session(caller_for(project), other["id"])
        outbox = Outbox("test")
        end_runtime(runtime, T.CLOSED, long, outbox, locked)
        outbox.flush()
    assert RuntimeAttachment.objects.get(id=runtime.id).end_reason == long[:64]  # its column is 64 long
    closed = Event.objects.filter(session_id=other["id"], type="runtime.closed").latest("id")
    assert closed.payload["reason"] == long[:64]

    third = new_session()
    moved = move_rows(RuntimeAttachment.objects.filter(session_id=third["id"]), lc.RUNTIME, T.LOST, end_reason=long)
    assert moved == 1 and RuntimeAttachment.objects.get(session_id=third["id"]).end_reason == long[:64]


@pytest.mark.django_db
def test_move_rows_moves_only_rows_in_a_legal_source_state(new_session, owner):
    live = new_session()
    closed = new_session()
    assert owner.post(f"/sessions/{closed['id']}/close", {}).status_code == 200
    ids = list(RuntimeAttachment.objects.filter(session_id__in=[live["id"], closed["id"]]).values_list("id", flat=True))
    assert len(ids) == 2
    moved = move_rows(RuntimeAttachment.objects.filter(id__in=ids), lc.RUNTIME, T.LOST, end_reason="test")
    assert moved == 1, "closed → lost is not in the table: that row is not touched"
    states = dict(RuntimeAttachment.objects.filter(id__in=ids).values_list("session_id", "state"))
    assert states == {live["id"]: "lost", closed["id"]: "closed"}


def test_sessions_do_not_move_through_the_generic_helper():
    with pytest.raises(AssertionError):
        move_rows(None, lc.SESSION, S.RUNNING)  # type: ignore[arg-type]


# ---- the shared predicates agree with the tables ---------------------------------------------------------
@pytest.mark.parametrize("status", list(S))
def test_resumable_is_the_table_allowing_running(status):
    assert lc.resumable(status) is (S.RUNNING in lc.SESSION.table[status])
    # A running session whose runtime's lease ran out becomes failed (runtime_lost), which resumes.
    expected_after_loss = S.FAILED if status is S.RUNNING else status
    assert lc.status_after_runtime_loss(status) is expected_after_loss
    assert lc.resumable(status, runtime_lease_expired=True) is (S.RUNNING in lc.SESSION.table[expected_after_loss])
    assert lc.holds_run(status) is (status in lc.RUN_HOLDING_STATES)


def test_needs_attention():
    assert lc.needs_attention(S.FAILED, open_conflict="", runtime_problem=False)
    assert lc.needs_attention(S.STALE, open_conflict="", runtime_problem=False)
    assert not lc.needs_attention(S.IDLE, open_conflict="", runtime_problem=False)
    assert lc.needs_attention(S.IDLE, open_conflict="conflicting_result: x", runtime_problem=False)
    assert lc.needs_attention(S.RUNNING, open_conflict="", runtime_problem=True)


def test_handoff_predicates_follow_the_table():
    # Waiting = the states a claim may move from or bind from; consumed = a receipt exists.
    assert set(lc.HANDOFF_WAITING) == set(lc.HANDOFF.sources(H.CLAIMED))
    assert set(lc.HANDOFF_WAITING) | set(lc.HANDOFF_CONSUMED) | lc.HANDOFF.terminal == set(H)
    assert [s for s in H if lc.conflict_open(s)] == [H.CONFLICTED]
    assert {s for s in lc.IntentState if lc.intent_open(s)} == set(lc.IntentState) - lc.WRITE_INTENT.terminal
    assert set(lc.RUN_OUTCOMES) <= lc.RUN.table[R.OPEN]
    for default, allowed in lc.RUN_OUTCOMES.values():
        assert default in allowed and all(lc.SESSION.is_legal(S.RUNNING, s) for s in allowed)


def test_lease_predicates():
    now = timezone.now()
    later, earlier = now + timedelta(seconds=5), now - timedelta(seconds=5)
    assert leases.handoff_lease_held(H.CLAIMED, later, now) and not leases.handoff_lease_expired(H.CLAIMED, later, now)
    assert leases.handoff_lease_expired(H.CLAIMED, earlier, now) and leases.handoff_claimable(H.CLAIMED, earlier, now)
    assert leases.handoff_claimable(H.PENDING, None, now) and not leases.handoff_claimable(H.CLAIMED, later, now)
    assert not leases.handoff_lease_expired(H.BOUND, earlier, now) and not leases.handoff_claimable(H.BOUND, earlier, now)
    assert leases.runtime_problem(T.LOST, later, now) and leases.runtime_problem(T.LIVE, earlier, now)
    assert not leases.runtime_problem(T.LIVE, later, now) and not leases.runtime_problem(T.CLOSED, earlier, now)
