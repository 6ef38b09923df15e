"""A pending review gate holds its run (docs/model.md#waits; reviews/waits.py ``holds``): while a
page or relay gate is outstanding the session is ``awaiting_user`` (an agent gate:
``awaiting_external``), and it may not continue past the gate by a plain transition, nor end
its run ``completed``, until the verdicts are bound or the gate is cancelled — 409
``wait_outstanding``, nothing written. Resume carries the gate and leaves the continuing run
in that awaiting state. Job handoffs do not hold a run (a run may go on while a worker works).

Each refusal asserts that nothing was written: no event, the session, its runs, the gate and
its handoffs unchanged.
"""
from __future__ import annotations

from typing import Any

import pytest

from novelforge_sessions.control.checkpoints import record_checkpoint
from novelforge_sessions.control.models import Handoff
from novelforge_sessions.models import Event, Run, Session
from reviews.access import reviewer_for_user
from reviews.actions import bind_verdict, cancel_gate
from reviews.models import ReviewGate
from tests.reviews.factories import World, agent_reviewer, agent_verdict, verdict_for
from tests.support.responses import refused
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

RUNTIME = {"runtime_family": "claude-code", "capabilities": ["draft"], "lease_seconds": 600}


def status(world: World) -> str:
    return Session.objects.get(id=world.writer.id).status


def waiting_on(gate: ReviewGate, awaits: str) -> dict[str, Any]:
    """The details of a ``wait_outstanding`` refusal that names ``gate`` as the wait."""
    label = f"review gate #{gate.id} ({gate.route} route)"
    return {"waiting_on": [{"kind": "review_gate", "id": gate.id, "label": label, "awaits": awaits}]}


def leave_running(world: World) -> None:
    """A session the old code let run past its gate (a plain transition, or resume): running,
    its open run still holding the pending gate."""
    Session.objects.filter(id=world.writer.id).update(status="running")


# ---- a plain transition does not continue past a gate ----------------------------------------------
@pytest.mark.parametrize("route", ["page", "relay"])
def test_a_person_routed_gate_refuses_a_plain_transition_to_running_and_writes_nothing(world: World, route: str):
    gate = world.gate(route=route)
    assert status(world) == "awaiting_user"  # a live runtime: only the gate stands in the way
    before = snapshot()
    error = refused(world.writer_api.post(f"/sessions/{world.writer.id}/transition", {"to": "running"}),
                    409, "wait_outstanding", details_has=waiting_on(gate, "awaiting_user"))
    assert error["details"]["status"] == "awaiting_user" and error["details"]["run_id"] == world.run.id
    assert snapshot() == before
    # the other exits of a waiting session stay open: it may still fail
    assert world.writer_api.post(f"/sessions/{world.writer.id}/transition", {"to": "failed"}).status_code == 200
    gate.refresh_from_db()
    assert status(world) == "failed" and gate.state == "pending"


def test_an_agent_gate_refuses_a_plain_transition_to_running_while_its_review_is_unbound(world: World):
    agent_reviewer(world.project)
    gate = world.gate(route="agent")
    assert status(world) == "awaiting_external"
    assert Handoff.objects.filter(review_assignment__packet__gate=gate, state="pending").count() == 1
    before = snapshot()
    refused(world.writer_api.post(f"/sessions/{world.writer.id}/transition", {"to": "running"}),
            409, "wait_outstanding", details_has=waiting_on(gate, "awaiting_external"))
    assert snapshot() == before


def test_the_refusal_keeps_the_more_fundamental_ones_first(world: World):
    gate = world.gate(route="page")
    path = f"/sessions/{world.writer.id}/transition"
    version = Session.objects.get(id=world.writer.id).version
    before = snapshot()
    assert world.writer_api.post(path, {"to": "running", "expected_version": version - 1}).json()["error"]["code"] \
        == "version_conflict"
    assert world.writer_api.post(path, {"to": "idle"}).json()["error"]["code"] == "illegal_transition"
    Session.objects.filter(id=world.writer.id).update(open_conflict="handoff j1: conflicting result")
    assert world.writer_api.post(path, {"to": "running"}).json()["error"]["code"] == "open_conflict"
    Session.objects.filter(id=world.writer.id).update(open_conflict="")
    refused(world.writer_api.post(path, {"to": "running", "expected_version": version}),
            409, "wait_outstanding", details_has=waiting_on(gate, "awaiting_user"))
    assert snapshot() == before


# ---- a held run does not end completed ---------------------------------------------------------------
@pytest.mark.parametrize("session_status", [None, "idle", "completed"])
def test_a_run_holding_a_pending_gate_cannot_end_completed(world: World, session_status: str | None):
    gate = world.gate(route="page")
    leave_running(world)
    before = snapshot()
    body = {"outcome": "completed", **({"session_status": session_status} if session_status else {})}
    refused(world.writer_api.post(f"/runs/{world.run.id}/end", body),
            409, "wait_outstanding", details_has=waiting_on(gate, "awaiting_user"))
    assert snapshot() == before


@pytest.mark.parametrize("target", ["idle", "completed"])
def test_a_plain_transition_that_would_complete_a_held_run_is_refused(world: World, target: str):
    gate = world.gate(route="page")
    leave_running(world)
    before = snapshot()
    refused(world.writer_api.post(f"/sessions/{world.writer.id}/transition", {"to": target}),
            409, "wait_outstanding", details_has=waiting_on(gate, "awaiting_user"))
    assert snapshot() == before


def test_a_held_run_may_still_fail(world: World):
    world.gate(route="page")
    leave_running(world)
    assert world.writer_api.post(f"/runs/{world.run.id}/end", {"outcome": "failed"}).status_code == 200
    assert status(world) == "failed" and Run.objects.get(id=world.run.id).state == "failed"


# ---- the gate settled: the run goes on -----------------------------------------------------------------
def test_once_the_verdict_is_bound_the_run_continues_and_completes(world: World):
    gate = world.gate(route="page")
    bind_verdict(reviewer_for_user(world.users["alice"]), gate.packet.id, verdict_for(gate), channel="page")
    assert status(world) == "running"
    resp = world.writer_api.post(f"/runs/{world.run.id}/end", {"outcome": "completed", "session_status": "completed"})
    assert resp.status_code == 200, resp.content
    assert status(world) == "completed"


def test_a_cancelled_gate_no_longer_holds_the_run(world: World):
    gate = world.gate(route="page")
    leave_running(world)
    cancel_gate(world.writer_caller, gate.id, reason="re-freeze")
    assert world.writer_api.post(f"/runs/{world.run.id}/end", {"outcome": "completed"}).status_code == 200
    assert status(world) == "idle"


# ---- resume leaves the continuing run waiting ----------------------------------------------------------
def _close_and_resume(world: World) -> dict[str, Any]:
    record_checkpoint(world.writer_caller, world.run.id, {"boundary": "user_wait", "cursor": {"step": "await-review"}})
    assert world.writer_api.post(f"/sessions/{world.writer.id}/close", {}).status_code == 200
    resp = world.writer_api.post(f"/sessions/{world.writer.id}/resume", {"runtime": RUNTIME})
    assert resp.status_code == 200, resp.content
    return resp.json()


def test_resume_with_a_pending_page_gate_leaves_the_session_awaiting_user(world: World):
    gate = world.gate(route="page")
    mark = Event.objects.order_by("-id").values_list("id", flat=True).first()
    report = _close_and_resume(world)
    reviews = next(s for s in report["steps"] if s["step"] == "reviews")
    assert reviews["ok"] is True and reviews["data"]["pending"] == [gate.id]
    cont = report["steps"][-1]
    assert cont["step"] == "continue" and cont["data"]["waiting_on"][0]["id"] == gate.id
    session = Session.objects.get(id=world.writer.id)
    gate.refresh_from_db()
    new_run = Run.objects.get(id=report["run_id"])
    assert session.status == "awaiting_user" and session.status_reason == f"waiting on review gate #{gate.id} (page route)"
    assert gate.state == "pending" and gate.run_id == new_run.id and new_run.state == "open"
    moves = [(e.payload["from"], e.payload["to"]) for e in
             Event.objects.filter(id__gt=mark, type="session.transitioned").order_by("id")]
    assert moves[-2:] == [("awaiting_user", "running"), ("running", "awaiting_user")]

    # the resumed run cannot complete past the gate: it is awaiting_user, and going back to
    # running is refused until the verdict is bound
    before = snapshot()
    runtime_id = report["runtime_id"]
    assert world.writer_api.post(f"/runs/{new_run.id}/end", {"outcome": "completed", "session_status": "completed",
                                                               "runtime_id": runtime_id}).status_code == 409
    refused(world.writer_api.post(f"/sessions/{world.writer.id}/transition", {"to": "running", "runtime_id": runtime_id}),
            409, "wait_outstanding", details_has=waiting_on(gate, "awaiting_user"))
    assert snapshot() == before

    bind_verdict(reviewer_for_user(world.users["alice"]), gate.packet.id, verdict_for(gate), channel="page")
    assert status(world) == "running"
    assert world.writer_api.post(f"/runs/{new_run.id}/end", {"outcome": "completed", "session_status": "completed",
                                                               "runtime_id": runtime_id}).status_code == 200
    assert status(world) == "completed"


def test_resume_with_a_pending_agent_gate_leaves_the_session_awaiting_external(world: World):
    _, agent = agent_reviewer(world.project)
    gate = world.gate(route="agent")
    report = _close_and_resume(world)
    gate.refresh_from_db()
    assert status(world) == "awaiting_external" and gate.run_id == report["run_id"]
    before = snapshot()
    refused(world.writer_api.post(f"/sessions/{world.writer.id}/transition",
                                  {"to": "running", "runtime_id": report["runtime_id"]}),
                                          409, "wait_outstanding", details_has=waiting_on(gate, "awaiting_external"))
    assert snapshot() == before
    lease = agent.post("/review-packets/claim").json()["lease"]
    assert agent.post(f"/review-packets/{gate.packet.id}/verdicts",
                      agent_verdict(gate, lease["fencing_token"])).status_code == 201
    assert status(world) == "running"


# ---- job handoffs do not hold a run (the existing behaviour, kept) --------------------------------------
def test_a_pending_job_handoff_does_not_hold_the_run(world: World):
    resp = world.writer_api.post(f"/runs/{world.run.id}/handoffs", {"logical_id": "lookup-1", "inputs": []})
    assert resp.status_code in (200, 201), resp.content
    assert status(world) == "awaiting_external"
    assert world.writer_api.post(f"/sessions/{world.writer.id}/transition", {"to": "running"}).status_code == 200
    assert world.writer_api.post(f"/runs/{world.run.id}/end", {"outcome": "completed"}).status_code == 200
    assert status(world) == "idle"
