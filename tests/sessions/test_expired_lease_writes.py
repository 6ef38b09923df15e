"""A runtime whose lease ran out is gone before any reconciler pass (docs/lifecycles.md, "Liveness is the lease"; docs/model.md#runtimes-and-leases).

Every write made on a runtime's behalf on its run (ending the run, the runtime's own moves out
of ``running``, a handoff, a checkpoint single or batched, a cursor advance) is refused with
``409 no_live_runtime`` the moment the session's lease has run out, and writes nothing; the
reconciler then still turns the session ``failed / runtime_lost``, and the same write stays
refused after its pass. A manager's writes that need no runtime keep working. Leases are
expired by UPDATE in the database; nothing sleeps.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import caller_for_user
from novelforge_sessions.actions import sessions
from novelforge_sessions.actions.runtimes import reconcile_expired_runtimes
from novelforge_sessions.models import (
    LIVE_RUNTIME_PARAMS, Run, RuntimeAttachment, Session, live_runtime_sql,
)
from novelforge_sessions.models import Membership
from tests.dashboard.conftest import make_user
from tests.sessions.test_liveness import expire
from tests.support.responses import refused
from tests.support.snapshots import snapshot

S = rt.SessionStatus
CP = {"boundary": "context_freeze", "cursor": {"step": 2}}


#: The runtime's own work on its run: (route, body), ``{sid}``/``{run}`` filled in.
RUNTIME_WRITES: dict[str, tuple[str, dict[str, Any]]] = {
    "end run, session completed": ("/runs/{run}/end", {"outcome": "completed", "session_status": "completed"}),
    "end run, session idle": ("/runs/{run}/end", {"outcome": "completed"}),
    "end run aborted": ("/runs/{run}/end", {"outcome": "aborted"}),
    "end run failed": ("/runs/{run}/end", {"outcome": "failed"}),
    **{f"running → {to.value}": ("/sessions/{sid}/transition", {"to": to.value})
       for to in (S.AWAITING_USER, S.IDLE, S.AWAITING_EXTERNAL, S.COMPLETED, S.FAILED)},
    "handoff": ("/runs/{run}/handoffs", {"logical_id": "job-1"}),
    "checkpoint": ("/runs/{run}/checkpoints", CP),
    "checkpoint with an idempotency key": ("/runs/{run}/checkpoints", {**CP, "idempotency_key": "k-1"}),
    "batch": ("/runs/{run}/batch", {"items": [{"kind": "checkpoint", "checkpoint": CP},
                                              {"kind": "cursor", "cursor": {"step": 3}}]}),
    "batch of a cursor": ("/runs/{run}/batch", {"items": [{"kind": "cursor", "cursor": {"step": 3}}]}),
    "cursor": ("/runs/{run}/cursor", {"cursor": {"step": 3}}),
}


def send(owner, write: str, s: dict):
    path, body = RUNTIME_WRITES[write]
    return owner.post(path.format(sid=s["id"], run=s["run"]["id"]), body)


@pytest.mark.django_db
@pytest.mark.parametrize("write", list(RUNTIME_WRITES))
def test_a_runtime_write_after_its_lease_ran_out_is_refused_before_any_reconciler_pass(owner, new_session, write):
    s = new_session(run=True)
    expire(s["id"])
    before = snapshot()
    refused(send(owner, write, s), 409, "no_live_runtime", details={"session_id": s["id"], "status": S.RUNNING.value})
    assert snapshot() == before, "a refusal writes nothing"
    # The reconciler still finds the session as the runtime left it, and does what it always did.
    assert [r.session_status for r in reconcile_expired_runtimes()] == [S.FAILED]
    session = Session.objects.get(id=s["id"])
    assert (session.status, session.status_reason) == (S.FAILED, "runtime_lost")
    after = snapshot()
    resp = send(owner, write, s)
    assert resp.status_code == 409 and resp.json()["error"]["code"] in {"run_not_open", "illegal_transition"}, resp.content
    assert snapshot() == after


@pytest.mark.django_db
@pytest.mark.parametrize("write", ["end run failed", "handoff", "checkpoint", "batch", "cursor"])
def test_a_waiting_session_s_run_takes_no_runtime_write_once_its_lease_ran_out_before_and_after_a_pass(
    owner, new_session, write,
):
    """A waiting session keeps waiting (and its run open) through the reconciler, so the answer is
    the same before and after the pass: the runtime is gone either way."""
    s = new_session(run=True)
    assert owner.post(f"/sessions/{s['id']}/transition", {"to": "awaiting_external"}).status_code == 200
    expire(s["id"])
    before = snapshot()
    refused(send(owner, write, s), 409, "no_live_runtime",
            details={"session_id": s["id"], "status": S.AWAITING_EXTERNAL.value})
    assert snapshot() == before
    assert [r.session_status for r in reconcile_expired_runtimes()] == [S.AWAITING_EXTERNAL]
    assert Run.objects.get(id=s["run"]["id"]).state == rt.RunState.OPEN
    after = snapshot()
    refused(send(owner, write, s), 409, "no_live_runtime",
            details={"session_id": s["id"], "status": S.AWAITING_EXTERNAL.value})
    assert snapshot() == after


@pytest.mark.django_db
def test_a_named_expired_runtime_is_still_a_stale_runtime(owner, new_session):
    """Fencing comes first (stale generation before a missing runtime): naming the runtime whose
    lease ran out answers ``stale_runtime``, as it always did."""
    s = new_session(run=True)
    rid = expire(s["id"]).id
    before = snapshot()
    for path, body in [(f"/sessions/{s['id']}/transition", {"to": "idle", "runtime_id": rid}),
                       (f"/runs/{s['run']['id']}/end", {"outcome": "completed", "runtime_id": rid}),
                       (f"/runs/{s['run']['id']}/cursor", {"cursor": {"step": 3}, "runtime_id": rid})]:
        resp = owner.post(path, body)
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "stale_runtime", (path, resp.content)
    assert snapshot() == before


@pytest.mark.django_db
def test_the_refusal_order_puts_the_ended_run_before_the_missing_runtime(owner, new_session):
    s = new_session(run=True)
    assert owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed"}).status_code == 200
    expire(s["id"])
    for write in ["checkpoint", "batch", "cursor", "end run, session idle", "handoff"]:
        resp = send(owner, write, s)
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "run_not_open", (write, resp.content)
    # ... and the lifecycle before the runtime: idle → awaiting_user is no move at all.
    resp = owner.post(f"/sessions/{s['id']}/transition", {"to": "awaiting_user"})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "illegal_transition"


@pytest.mark.django_db
def test_a_checkpoint_replay_after_the_lease_ran_out_still_answers_the_first_outcome(owner, new_session):
    s = new_session(run=True)
    body = {**CP, "idempotency_key": "k-1"}
    first = owner.post(f"/runs/{s['run']['id']}/checkpoints", body)
    assert first.status_code == 201
    expire(s["id"])
    before = snapshot()
    again = owner.post(f"/runs/{s['run']['id']}/checkpoints", body)
    assert again.status_code == 200 and again.json() == first.json()
    assert snapshot() == before


# ---- what stays open: the manager's writes, the pages, the service ----------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("to", [S.TERMINATED, S.STALE])
def test_a_token_still_terminates_or_stales_a_running_session_whose_lease_ran_out(owner, new_session, to):
    s = new_session(run=True)
    old = expire(s["id"])
    resp = owner.post(f"/sessions/{s['id']}/transition", {"to": to.value, "reason": "manager"})
    assert resp.status_code == 200, resp.content
    assert Session.objects.get(id=s["id"]).status == to
    assert Run.objects.get(id=s["run"]["id"]).state != rt.RunState.OPEN
    old.refresh_from_db()
    assert old.state == (rt.RuntimeState.CLOSED if to is S.TERMINATED else rt.RuntimeState.LIVE)


@pytest.mark.django_db
def test_close_abort_and_resume_still_work_after_the_lease_ran_out(owner, new_session):
    s = new_session(run=True)
    expire(s["id"])
    aborted = owner.post(f"/sessions/{s['id']}/abort", {})
    assert aborted.status_code == 200, aborted.content
    assert Run.objects.get(id=s["run"]["id"]).abort_requested_at is not None
    before = snapshot()
    closed = owner.post(f"/sessions/{s['id']}/close")
    assert closed.status_code == 200 and closed.json()["already_closed"] is True  # nothing live to close
    assert snapshot() == before
    resumed = owner.post(f"/sessions/{s['id']}/resume", {"runtime": {"runtime_family": "claude-code"}})
    assert resumed.status_code == 200 and resumed.json()["ok"] is True, resumed.content
    # The new generation's run takes the runtime's writes again (unnamed writes now name it).
    run_id = Run.objects.get(session_id=s["id"], state=rt.RunState.OPEN).id
    assert owner.post(f"/runs/{run_id}/checkpoints", CP).status_code == 201


@pytest.mark.django_db
def test_a_manager_on_the_pages_is_not_refused(project, new_session):
    """The pages' manager is their own principal (as with fencing): a move is not the runtime's work."""
    s = new_session(run=True)
    expire(s["id"])
    boss = make_user("boss", project, Membership.Role.MANAGER)
    sessions.transition_session(caller_for_user(boss), s["id"], S.IDLE, reason="manager stops it")
    session = Session.objects.get(id=s["id"])
    assert (session.status, session.status_reason) == (S.IDLE, "manager stops it")


# ---- the one rule, in SQL and in Python --------------------------------------------------------------------
@pytest.mark.django_db
def test_the_locking_statements_liveness_is_objects_live(owner, new_session):
    from django.db import connection

    live, expired, closed, none = new_session(), new_session(), new_session(), new_session(attach=False)
    expire(expired["id"])
    owner.post(f"/sessions/{closed['id']}/close")
    lost = new_session()
    expire(lost["id"])
    reconcile_expired_runtimes(now=timezone.now())
    sql = f"SELECT {live_runtime_sql('%(session)s')}"
    for now in (timezone.now(), timezone.now() + timedelta(seconds=120)):
        for s in (live, expired, closed, none, lost):
            with connection.cursor() as cur:
                cur.execute(sql, {"session": s["id"], "now": now, **LIVE_RUNTIME_PARAMS})
                in_sql = cur.fetchone()[0]
            assert in_sql is RuntimeAttachment.objects.live(now).filter(session_id=s["id"]).exists(), (s["id"], now)
