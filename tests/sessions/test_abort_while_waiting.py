"""Abort is honoured while the run waits.

Abort flags the open run of any run-holding state, and the heartbeat then tells the runtime to end
it with outcome ``aborted``. From ``running`` the session goes ``idle``; a *waiting* session
(``awaiting_user`` / ``awaiting_external``) cannot go idle (the contract's table has no
``awaiting_* → idle``), so an aborted run ends it ``failed`` — the exit the table leaves a wait
(``lifecycles.RUN_OUTCOMES``, ``run_end_status``). What it waited on stays (a pending gate, an
unbound job): resume carries it. Before, the abort was accepted and could then never be honoured
(``409 illegal_transition`` ``awaiting_user → idle``).
"""
from __future__ import annotations

import pytest

from novelforge_sessions import lifecycles as lc
from novelforge_sessions.control.models import Handoff
from novelforge_sessions.models import Event, Run, RuntimeAttachment, Session
from reviews.models import ReviewGate
from tests.support.factories import RUNTIME
from tests.control.conftest import make_handoff
from tests.support.responses import ok, refused
from tests.reviews.factories import World, make_world
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

S, R = lc.SessionStatus, lc.RunState


def test_the_outcome_table_lets_an_aborted_waiting_run_end_its_session_failed():
    for waiting in (S.AWAITING_USER, S.AWAITING_EXTERNAL):
        assert lc.run_end_status(R.ABORTED, waiting) is S.FAILED
        assert lc.run_end_status(R.FAILED, waiting) is S.FAILED
        # completing is still not an exit of a wait: the default stands and the table refuses it
        assert lc.run_end_status(R.COMPLETED, waiting) is S.IDLE and not lc.SESSION.is_legal(waiting, S.IDLE)
    assert lc.run_end_status(R.ABORTED, S.RUNNING) is S.IDLE
    assert lc.run_end_status(R.ABORTED, S.RUNNING, S.FAILED) is S.FAILED
    for outcome, (default, allowed) in lc.RUN_OUTCOMES.items():
        for source in lc.AWAITING_STATUSES | {S.RUNNING}:
            assert lc.run_end_status(outcome, source) in allowed | {default}


@pytest.fixture
def world(project) -> World:
    return make_world(project)


def abort_and_heartbeat(api, session_id: int, run_id: int) -> None:
    assert ok(api.post(f"/sessions/{session_id}/abort", {"reason": "stop this run"}))["already_requested"] is False
    runtime = RuntimeAttachment.objects.live().get(session_id=session_id)
    beat = ok(api.post(f"/runtimes/{runtime.id}/heartbeat", {}))
    assert beat["abort_requested"] is True and beat["open_run_id"] == run_id


def test_an_aborted_run_of_a_session_awaiting_a_person_ends_it_failed_and_resume_waits_again(world: World):
    gate = world.gate(route="page")
    world.refresh()
    assert world.writer.status == "awaiting_user"
    abort_and_heartbeat(world.writer_api, world.writer.id, world.run.id)

    run = ok(world.writer_api.post(f"/runs/{world.run.id}/end", {"outcome": "aborted"}))
    assert run["state"] == "aborted"
    session = Session.objects.get(id=world.writer.id)
    assert (session.status, session.status_reason) == ("failed", "run aborted")
    transition = Event.objects.filter(session_id=session.id, type="session.transitioned").last().payload
    assert (transition["from"], transition["to"]) == ("awaiting_user", "failed")
    assert RuntimeAttachment.objects.live().filter(session_id=session.id).exists()  # abort is not close

    # The gate still waits; resume (once the runtime is closed) carries it and waits on it again.
    gate.refresh_from_db()
    assert gate.state == "pending"
    ok(world.writer_api.post(f"/sessions/{session.id}/close", {}))
    report = ok(world.writer_api.post(f"/sessions/{session.id}/resume", {"runtime": RUNTIME}))
    assert Session.objects.get(id=session.id).status == "awaiting_user"
    assert ReviewGate.objects.get(id=gate.id).run_id == report["run_id"]


def test_an_aborted_run_of_a_session_awaiting_a_worker_ends_it_failed(owner, new_session):
    s = new_session(run=True)
    job = make_handoff(owner, s["run"]["id"], "job-1")
    assert Session.objects.get(id=s["id"]).status == "awaiting_external"
    abort_and_heartbeat(owner, s["id"], s["run"]["id"])
    ok(owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "aborted", "reason": "manager stopped it"}))
    session = Session.objects.get(id=s["id"])
    assert (session.status, session.status_reason) == ("failed", "manager stopped it")
    assert Run.objects.get(id=s["run"]["id"]).state == "aborted"
    assert Handoff.objects.get(id=job["id"]).state == "pending"  # the job is not withdrawn: resume carries it


@pytest.mark.parametrize(("body", "code"), [
    ({"outcome": "aborted", "session_status": "idle"}, "illegal_transition"),  # awaiting → idle: not in the table
    ({"outcome": "completed"}, "illegal_transition"),  # a waiting run cannot complete
])
def test_what_a_waiting_session_still_cannot_do(owner, new_session, body, code):
    s = new_session(run=True)
    make_handoff(owner, s["run"]["id"], "job-1")
    ok(owner.post(f"/sessions/{s['id']}/abort", {}))
    before = snapshot()
    err = refused(owner.post(f"/runs/{s['run']['id']}/end", body), 409, code)
    assert err["details"]["from"] == "awaiting_external"
    assert snapshot() == before


def test_an_aborted_run_of_a_running_session_still_leaves_it_idle(owner, new_session):
    s = new_session(run=True)
    abort_and_heartbeat(owner, s["id"], s["run"]["id"])
    ok(owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "aborted"}))
    assert Session.objects.get(id=s["id"]).status == "idle"
