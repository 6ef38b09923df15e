"""A session that takes no more work withdraws what it waits on.

Entering ``terminated`` or ``stale`` cancels the session's unbound handoffs and pending review
gates in the same transaction, each through its own cancel mechanism and with its events (after
the ``session.transitioned`` that caused it). A worker or reviewer who claimed before then renews
nothing and delivers nothing: the renewal is 409 ``handoff_closed``, the delivery is 409
``handoff_closed`` and still logged, the verdict 409 ``gate_closed`` — no receipt, no bound
verdict, no event, the session untouched. (Before, the lease renewed and the result or verdict
was consumed into the terminated session.) A handoff or gate such a session left open before
this rule existed is refused the same way.
"""
from __future__ import annotations


import pytest
from django.db import connection

from novelforge_sessions.control.models import Handoff, ResultDelivery
from novelforge_sessions.models import Event, Run, Session
from reviews.access import reviewer_for_user
from reviews.actions import bind_verdict
from tests.control.conftest import claim, deliver, make_handoff
from tests.support.responses import ok, refused
from tests.reviews.factories import World, agent_reviewer, agent_verdict, make_world, verdict_for
from novelforge_sessions.errors import GateClosed
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(project) -> World:
    return make_world(project)


def events_after(session_id: int, after: int) -> list[tuple[str, dict]]:
    return list(Event.objects.filter(session_id=session_id, id__gt=after).order_by("id").values_list("type", "payload"))


def last_event_id() -> int:
    return Event.objects.order_by("-id").values_list("id", flat=True).first() or 0


@pytest.mark.parametrize("to", ["terminated", "stale"])
def test_the_move_cancels_unbound_handoffs_and_the_claimed_worker_renews_and_delivers_nothing(
    owner, new_session, worker, to,
):
    s = new_session(run=True)
    claimed_job = make_handoff(owner, s["run"]["id"], "job-claimed", result_schema={"text": "string"})
    pending_job = make_handoff(owner, s["run"]["id"], "job-pending")
    lease = claim(worker, handoff_id=claimed_job["id"])
    before = last_event_id()

    ok(owner.post(f"/sessions/{s['id']}/transition", {"to": to, "reason": "abandon this line"}))
    assert dict(Handoff.objects.filter(session_id=s["id"]).values_list("id", "state")) == {
        claimed_job["id"]: "cancelled", pending_job["id"]: "cancelled"}
    types = [t for t, _ in events_after(s["id"], before)]
    ended = ["run.ended", "runtime.closed"] if to == "terminated" else ["run.ended"]  # terminate ends the runtime too
    assert types == [*ended, "session.transitioned", "handoff.cancelled", "handoff.cancelled"]
    cancelled = [p for t, p in events_after(s["id"], before) if t == "handoff.cancelled"]
    assert [p["logical_id"] for p in cancelled] == ["job-claimed", "job-pending"]
    assert cancelled[0]["reason"] == f"session {to}: abandon this line"
    assert Run.objects.get(id=s["run"]["id"]).pending_external == []

    frozen = snapshot(exclude=['ResultDelivery'])
    err = refused(worker.post(f"/handoffs/{lease['id']}/heartbeat", {"fencing_token": lease["fencing_token"]}),
                  409, "handoff_closed")
    assert err["details"]["state"] == "cancelled"
    deliveries = ResultDelivery.objects.filter(handoff_id=lease["id"]).count()
    refused(deliver(worker, lease, {"text": "late"}), 409, "handoff_closed")
    # The delivery is logged (as every refused arrival is); nothing else is written.
    assert list(ResultDelivery.objects.filter(handoff_id=lease["id"]).values_list("outcome", flat=True)) == \
        ["not_claimable"] * (deliveries + 1)
    after = snapshot(exclude=['ResultDelivery'])
    assert after == frozen
    assert ok(worker.post("/handoffs/claim", {"worker": "w2", "capabilities": []}))["handoff"] is None


def test_terminating_cancels_a_job_of_an_ended_run_too(owner, new_session, worker):
    """A job outlives the run that completed while a worker had it; the session's end withdraws it."""
    s = new_session(run=True)
    job = make_handoff(owner, s["run"]["id"], "job-1")
    ok(owner.post(f"/sessions/{s['id']}/transition", {"to": "running"}))  # the run goes on with other work
    ok(owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed"}))
    assert Handoff.objects.get(id=job["id"]).state == "pending"
    ok(owner.post(f"/sessions/{s['id']}/transition", {"to": "terminated"}))
    assert Handoff.objects.get(id=job["id"]).state == "cancelled"


def test_a_bound_result_stays_bound(owner, new_session, worker):
    s = new_session(run=True)
    job = make_handoff(owner, s["run"]["id"], "job-1", result_schema={"text": "string"})
    lease = claim(worker, handoff_id=job["id"])
    ok(deliver(worker, lease, {"text": "done"}))
    ok(owner.post(f"/sessions/{s['id']}/transition", {"to": "terminated"}))
    assert Handoff.objects.get(id=job["id"]).state == "bound"
    assert ok(deliver(worker, lease, {"text": "done"}))["outcome"] == "already_consumed"


def test_an_agent_gate_is_withdrawn_and_its_reviewer_binds_nothing(world: World):
    gate = world.gate(route="agent")
    _, reviewer = agent_reviewer(world.project)
    lease = ok(reviewer.post("/review-packets/claim"))["lease"]
    before = last_event_id()
    ok(world.writer_api.post(f"/sessions/{world.writer.id}/transition", {"to": "terminated", "reason": "abandon"}))
    gate.refresh_from_db()
    assert gate.state == "cancelled"
    assert Handoff.objects.get(id=lease["handoff_id"]).state == "cancelled"
    assert [t for t, _ in events_after(world.writer.id, before)] == [
        "run.ended", "runtime.closed", "session.transitioned", "review.gate_cancelled", "handoff.cancelled"]

    frozen = snapshot(exclude=['ResultDelivery'])
    refused(reviewer.post(f"/review-packets/{gate.packet.id}/heartbeat", {"fencing_token": lease["fencing_token"]}),
            409, "handoff_closed")
    refused(reviewer.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, lease["fencing_token"])),
            409, "gate_closed")
    assert snapshot(exclude=['ResultDelivery']) == frozen


def test_a_page_gate_is_withdrawn_and_its_reviewer_binds_nothing(world: World):
    gate = world.gate(route="page")
    ok(world.writer_api.post(f"/sessions/{world.writer.id}/transition", {"to": "stale"}))
    gate.refresh_from_db()
    assert gate.state == "cancelled"
    frozen = snapshot(exclude=['ResultDelivery'])
    with pytest.raises(GateClosed):
        bind_verdict(reviewer_for_user(world.users["alice"]), gate.packet.id, verdict_for(gate), channel="page")
    assert snapshot(exclude=['ResultDelivery']) == frozen


# ---- what such a session left open before the rule: refused all the same --------------------------
def close_without_withdrawing(session_id: int, status: str) -> None:
    """A session that entered ``status`` before entering it withdrew anything."""
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {Session._meta.db_table} SET status = %s WHERE id = %s", [status, session_id])


@pytest.mark.parametrize("status", ["terminated", "stale"])
def test_a_handoff_such_a_session_left_open_takes_no_renewal_and_no_result(owner, new_session, worker, status):
    s = new_session(run=True)
    job = make_handoff(owner, s["run"]["id"], "job-1", result_schema={"text": "string"})
    lease = claim(worker, handoff_id=job["id"])
    close_without_withdrawing(s["id"], status)
    frozen = snapshot(exclude=['ResultDelivery'])
    err = refused(worker.post(f"/handoffs/{lease['id']}/heartbeat", {"fencing_token": lease["fencing_token"]}),
                  409, "handoff_closed")
    assert err["details"] == {"handoff_id": lease["id"], "state": "claimed", "session_status": status}
    err = refused(deliver(worker, lease, {"text": "late"}), 409, "handoff_closed")
    assert err["details"]["session_status"] == status
    assert list(ResultDelivery.objects.filter(handoff_id=lease["id"]).values_list("outcome", flat=True)) == ["not_claimable"]
    assert snapshot(exclude=['ResultDelivery']) == frozen


def test_a_gate_such_a_session_left_open_takes_no_verdict(world: World):
    gate = world.gate(route="agent")
    _, reviewer = agent_reviewer(world.project)
    lease = ok(reviewer.post("/review-packets/claim"))["lease"]
    close_without_withdrawing(world.writer.id, "terminated")
    frozen = snapshot(exclude=['ResultDelivery'])
    err = refused(reviewer.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, lease["fencing_token"])),
                  409, "gate_closed")
    assert err["details"] == {"state": "pending", "session_status": "terminated"}
    refused(reviewer.post(f"/review-packets/{gate.packet.id}/heartbeat", {"fencing_token": lease["fencing_token"]}),
            409, "handoff_closed")
    assert snapshot(exclude=['ResultDelivery']) == frozen
