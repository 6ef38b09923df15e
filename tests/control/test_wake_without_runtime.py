"""A settled wait wakes a session only if a runtime is live to run it.

A waiting session (``awaiting_external`` on a handoff, ``awaiting_user`` on a page gate) keeps
waiting when its runtime is closed or lost (docs/model.md#runtimes-and-leases). When the wait then settles — its result
delivered, its verdict bound, what it waited on cancelled — and no runtime is live by its lease,
nothing would run it: it goes where the reconciler puts a ``running`` session whose runtime is
gone, ``failed`` with reason ``runtime_lost``, its run interrupted, and a record still saying
live with its lease run out is recorded ``lost``. The bound result stays bound, and resume (dry
run and real) continues the cursor from there. The end state never depends on whether a
reconciler pass ran between the lease running out and the result arriving. (Before, the session
went ``running`` with no runtime, and resume refused it for good: ``running → running``.)

Leases are expired by UPDATE in the database; nothing sleeps.
"""
from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from novelforge_sessions.control.models import ConsumeReceipt, Handoff
from novelforge_sessions.models import Checkpoint, Event, Run, RuntimeAttachment, Session
from reviews.access import reviewer_for_user
from reviews.actions import bind_verdict, cancel_gate
from tests.support.factories import RUNTIME
from tests.control.conftest import claim, deliver, make_handoff
from tests.support.responses import ok, refused
from tests.reviews.factories import World, agent_reviewer, agent_verdict, make_world, verdict_for
from tests.sessions.test_liveness import expire
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

#: How the session's runtime went away while it waited.
GONE = ["closed", "lease ran out", "lease ran out, reconciled"]


def lose_runtime(owner, session_id: int, how: str) -> None:
    if how == "closed":
        assert ok(owner.post(f"/sessions/{session_id}/close", {}))["already_closed"] is False
        return
    expire(session_id)
    if how.endswith("reconciled"):
        call_command("reconcile_runtimes", verbosity=0)


def state_of(session_id: int, run_id: int) -> dict[str, Any]:
    s = Session.objects.get(id=session_id)
    run = Run.objects.get(id=run_id)
    return {
        "status": s.status, "reason": s.status_reason, "run": (run.state, run.end_reason),
        "runtimes": list(RuntimeAttachment.objects.filter(session_id=session_id).order_by("id")
                         .values_list("state", flat=True)),
    }


def waiting_on_a_job(owner, new_session, worker, logical_id: str = "job-1") -> tuple[dict, dict, dict]:
    """A running session that checkpointed its wait and handed off one job a worker claimed."""
    s = new_session(run=True)
    run = s["run"]
    handoff = make_handoff(owner, run["id"], logical_id, result_schema={"text": "string"})
    ok(owner.post(f"/runs/{run['id']}/checkpoints", {
        "boundary": "external_wait", "cursor": {"step": "await-job"}, "pending": {"handoffs": [logical_id]}}), 201)
    lease = claim(worker, handoff_id=handoff["id"])
    assert Session.objects.get(id=s["id"]).status == "awaiting_external"
    return s, handoff, lease


def resumes_at_the_saved_cursor(owner, session_id: int, *, bound: dict[str, str] | None = None) -> dict:
    """Dry run, then real: both 200, the real one continues the checkpoint's cursor in a new run
    of generation N+1, with whatever was bound reported as bound."""
    generation = Session.objects.get(id=session_id).generation
    dry = ok(owner.post(f"/sessions/{session_id}/resume", {"runtime": RUNTIME, "dry_run": True}))
    assert dry["ok"] is True and dry["dry_run"] is True, dry
    report = ok(owner.post(f"/sessions/{session_id}/resume", {"runtime": RUNTIME}))
    assert report["ok"] is True and report["generation"] == generation + 1, report
    if bound is not None:
        results = next(step for step in report["steps"] if step["step"] == "results")
        assert results["data"]["bound"] == bound, results
    new_run = Run.objects.get(id=report["run_id"])
    assert new_run.state == "open" and new_run.cursor == Checkpoint.objects.filter(session_id=session_id).last().cursor
    assert new_run.generation == generation + 1
    return report


@pytest.mark.parametrize("how", GONE)
def test_a_result_delivered_to_a_session_whose_runtime_is_gone_fails_it_and_resume_continues(
    owner, new_session, worker, how,
):
    s, handoff, lease = waiting_on_a_job(owner, new_session, worker)
    lose_runtime(owner, s["id"], how)
    assert Session.objects.get(id=s["id"]).status == "awaiting_external"  # it kept waiting

    got = ok(deliver(worker, lease, {"text": "done"}))
    assert got["outcome"] == "consumed"
    assert got["session_status"] == "failed"
    after = state_of(s["id"], s["run"]["id"])
    assert after == {"status": "failed", "reason": "runtime_lost", "run": ("interrupted", "runtime_lost"),
                     "runtimes": ["closed" if how == "closed" else "lost"]}
    # The result is consumed and stays bound.
    assert Handoff.objects.get(id=handoff["id"]).state == "bound"
    receipt = ConsumeReceipt.objects.get(handoff_id=handoff["id"])
    assert not RuntimeAttachment.objects.live().filter(session_id=s["id"]).exists()

    report = resumes_at_the_saved_cursor(owner, s["id"], bound={"job-1": receipt.result_hash})
    assert Session.objects.get(id=s["id"]).status == "running"
    assert report["steps"][-1]["data"]["cursor"] == {"step": "await-job"}


def test_an_expired_record_is_recorded_lost_in_the_delivery_itself(owner, new_session, worker):
    """No reconciler pass: the delivery's transaction records the runtime lost (``runtime.lost``),
    then the session's move, as the reconciler would have."""
    s, _, lease = waiting_on_a_job(owner, new_session, worker)
    runtime = expire(s["id"])
    last = Event.objects.order_by("-id").values_list("id", flat=True).first()
    ok(deliver(worker, lease, {"text": "done"}))
    types = list(Event.objects.filter(id__gt=last, session_id=s["id"]).order_by("id").values_list("type", "payload"))
    assert [t for t, _ in types] == ["handoff.result_consumed", "runtime.lost", "run.ended", "session.transitioned"]
    assert types[1][1]["runtime_id"] == runtime.id
    assert types[3][1]["from"] == "awaiting_external" and types[3][1]["to"] == "failed"
    assert types[3][1]["reason"] == "runtime_lost"


def test_the_end_state_does_not_depend_on_a_reconciler_pass(owner, new_session, worker):
    """The ordering case: the same facts, with and without a reconciler pass between the
    lease running out and the result arriving, end in the same state (before: failed in one,
    running with no runtime and unresumable in the other)."""
    ends = []
    for reconcile_between in (False, True):
        s, _, lease = waiting_on_a_job(owner, new_session, worker, f"job-{reconcile_between}")
        expire(s["id"])
        if reconcile_between:
            call_command("reconcile_runtimes", verbosity=0)
        ok(deliver(worker, lease, {"text": "done"}))
        call_command("reconcile_runtimes", verbosity=0)
        ends.append(state_of(s["id"], s["run"]["id"]))
        assert ok(owner.post(f"/sessions/{s['id']}/resume", {"runtime": RUNTIME, "dry_run": True}))["ok"] is True
    assert ends[0] == ends[1] == {"status": "failed", "reason": "runtime_lost", "run": ("interrupted", "runtime_lost"),
                                  "runtimes": ["lost"]}


def test_cancelling_the_last_awaited_handoff_without_a_runtime_fails_the_session(owner, new_session, worker):
    s, handoff, _ = waiting_on_a_job(owner, new_session, worker)
    lose_runtime(owner, s["id"], "closed")
    assert ok(owner.post(f"/handoffs/{handoff['id']}/cancel", {"reason": "not needed"}))["state"] == "cancelled"
    assert state_of(s["id"], s["run"]["id"])["status"] == "failed"
    resumes_at_the_saved_cursor(owner, s["id"])


def test_a_session_still_awaiting_another_result_keeps_waiting(owner, new_session, worker):
    s, _, lease = waiting_on_a_job(owner, new_session, worker)
    make_handoff(owner, s["run"]["id"], "job-2")
    lose_runtime(owner, s["id"], "closed")
    ok(deliver(worker, lease, {"text": "done"}))
    assert state_of(s["id"], s["run"]["id"])["status"] == "awaiting_external"
    assert Run.objects.get(id=s["run"]["id"]).pending_external == ["job-2"]


def test_with_a_live_runtime_the_run_continues(owner, new_session, worker):
    s, _, lease = waiting_on_a_job(owner, new_session, worker)
    assert ok(deliver(worker, lease, {"text": "done"}))["session_status"] == "running"
    assert state_of(s["id"], s["run"]["id"])["run"] == ("open", "")


@pytest.mark.parametrize("how", GONE)
def test_a_new_runtime_cannot_take_over_the_waiting_run_resume_does(owner, new_session, worker, how):
    """The run waits, its runtime is gone: attaching generation 2 is refused (409
    ``open_run_exists``, nothing written, not even the tidying of an expired record): continuing
    a run under another execution identity is resume's, a fresh validation act (docs/model.md#resume).
    The session keeps waiting; the result then fails it (``runtime_lost``) and resume continues
    the saved cursor in a new run, the result bound. (Before, the attach was accepted and the old
    run went on under generation 2, nothing revalidated.)"""
    s, _, lease = waiting_on_a_job(owner, new_session, worker)
    lose_runtime(owner, s["id"], how)
    before = snapshot()
    error = refused(owner.post(f"/sessions/{s['id']}/runtimes", RUNTIME), 409, "open_run_exists")
    assert error["details"] == {"run_id": s["run"]["id"], "status": "awaiting_external"}
    assert snapshot() == before
    assert ok(deliver(worker, lease, {"text": "done"}))["session_status"] == "failed"
    report = resumes_at_the_saved_cursor(owner, s["id"], bound={"job-1": ConsumeReceipt.objects.get().result_hash})
    assert report["run_id"] != s["run"]["id"]


# ---- review gates take the same path (reviews/actions.py: _resume_if_waiting, control.settle) ----
@pytest.fixture
def world(project) -> World:
    return make_world(project)


@pytest.mark.parametrize("how", GONE)
@pytest.mark.parametrize("settled_by", ["verdict bound", "gate cancelled"])
def test_a_page_gate_settled_without_a_runtime_fails_the_session_and_resume_continues(world: World, how, settled_by):
    gate = world.gate(route="page")
    ok(world.writer_api.post(f"/runs/{world.run.id}/checkpoints", {
        "boundary": "user_wait", "cursor": {"step": "await-review"}, "pending": {"gates": [{"gate_id": gate.id}]}}), 201)
    lose_runtime(world.writer_api, world.writer.id, how)
    world.refresh()
    assert world.writer.status == "awaiting_user"

    if settled_by == "verdict bound":
        bind_verdict(reviewer_for_user(world.users["alice"]), gate.packet.id, verdict_for(gate), channel="page")
    else:
        cancel_gate(world.writer_caller, gate.id, reason="withdrawn")
    gate.refresh_from_db()
    assert gate.state == ("complete" if settled_by == "verdict bound" else "cancelled")
    assert state_of(world.writer.id, world.run.id) == {
        "status": "failed", "reason": "runtime_lost", "run": ("interrupted", "runtime_lost"),
        "runtimes": ["closed" if how == "closed" else "lost"]}
    if settled_by == "verdict bound":
        report = resumes_at_the_saved_cursor(world.writer_api, world.writer.id)
        reviews = next(step for step in report["steps"] if step["step"] == "reviews")
        assert reviews["data"]["complete"] == [{"gate_id": gate.id, "outcome": gate.outcome}]
        assert Session.objects.get(id=world.writer.id).status == "running"
    else:  # a cancelled gate the checkpoint waits on is re-review: resume says so, it is not stuck
        resp = world.writer_api.post(f"/sessions/{world.writer.id}/resume", {"runtime": RUNTIME, "dry_run": True})
        assert refused(resp, 409, "resume_refused")["details"]["report"]["repairs"] == ["re-review"]


def test_an_agent_verdict_bound_without_a_runtime_fails_the_session(world: World):
    gate = world.gate(route="agent")
    ok(world.writer_api.post(f"/runs/{world.run.id}/checkpoints", {
        "boundary": "external_wait", "cursor": {"step": "await-review"}, "pending": {"gates": [{"gate_id": gate.id}]}}), 201)
    _, reviewer = agent_reviewer(world.project)
    lease = ok(reviewer.post("/review-packets/claim"))["lease"]
    lose_runtime(world.writer_api, world.writer.id, "lease ran out")
    resp = reviewer.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, lease["fencing_token"]))
    assert resp.status_code == 201, resp.content
    assert state_of(world.writer.id, world.run.id) == {
        "status": "failed", "reason": "runtime_lost", "run": ("interrupted", "runtime_lost"), "runtimes": ["lost"]}
    assert Handoff.objects.get(id=lease["handoff_id"]).state == "bound"
    resumes_at_the_saved_cursor(world.writer_api, world.writer.id)


# ---- data from before the fix: running, with no live runtime -----------------------------------
def test_resume_tidies_a_running_session_that_has_no_live_runtime(owner, new_session):
    """A session a settled wait woke to ``running`` with no runtime (before this fix): resume
    records it ``failed / runtime_lost`` (as it tidies an expired record) and continues."""
    s = new_session(run=True)
    ok(owner.post(f"/runs/{s['run']['id']}/checkpoints", {"boundary": "context_freeze", "cursor": {"step": "two"}}), 201)
    with connection.cursor() as cur:  # the runtime was closed without the session leaving running
        cur.execute(f"UPDATE {RuntimeAttachment._meta.db_table} SET state = 'closed' WHERE session_id = %s", [s["id"]])
    assert Session.objects.get(id=s["id"]).status == "running"
    events = Event.objects.count()
    dry = ok(owner.post(f"/sessions/{s['id']}/resume", {"runtime": RUNTIME, "dry_run": True}))
    assert dry["ok"] is True
    assert Event.objects.count() == events and Session.objects.get(id=s["id"]).status == "running"  # dry: nothing
    report = resumes_at_the_saved_cursor(owner, s["id"])
    assert report["steps"][-1]["data"]["cursor"] == {"step": "two"}
    transitions = list(Event.objects.filter(session_id=s["id"], type="session.transitioned", id__gt=0)
                       .order_by("id").values_list("payload__from", "payload__to", "payload__reason"))
    assert transitions[-2:] == [("running", "failed", "runtime_lost"), ("failed", "running", "run started")]
    assert Run.objects.get(id=s["run"]["id"]).state == "interrupted"
