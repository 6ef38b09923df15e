"""A review slot's handoff is reachable only through the review routes.

The plain handoff routes (`/handoffs/claim`, `/handoffs/{id}/heartbeat`, `…/results`,
`…/cancel`) never claim, renew, answer or cancel a review handoff — not for a plain worker,
not for the writer's own `work` token — and a refusal writes nothing: no claim, no delivery
row, no receipt, no event, no state change. The gate stays pending and the writer keeps
waiting; an eligible agent reviewer still claims and binds its verdict through
`/review-packets`."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.control.models import (
    ConsumeReceipt,
    Handoff,
    HandoffPurpose,
    HandoffState,
)
from novelforge_sessions.models import Event, Run
from reviews.models import ReviewGate
from tests.support.factories import Api
from tests.reviews.factories import World, agent_reviewer, agent_verdict
from tests.support.responses import assert_refused, refused
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

PASS = {"decision": "pass", "scores": {"clarity": 5, "pacing": 9}, "findings": [], "confidence": 1.0}


@pytest.fixture
def plain_workers(world: World) -> dict[str, Api]:
    """A plain worker of the project, and the writer's own token with `work` added."""
    _, worker = create_token(world.project, name="worker", permissions=["read", "work", "write"])
    _, own = create_token(world.project, name="writer-own-work", permissions=["read", "write", "work"],
                          session=world.writer)
    return {"worker": Api(worker), "writer's own": Api(own)}


def test_review_handoffs_are_marked_review_and_jobs_stay_jobs(world: World):
    gate = world.gate(route="agent", required_verdicts=2)
    slots = Handoff.objects.filter(review_assignment__packet__gate=gate)
    assert slots.count() == 2
    assert set(slots.values_list("purpose", flat=True)) == {HandoffPurpose.REVIEW}
    plain = world.writer_api.post(f"/runs/{world.run.id}/handoffs", {"logical_id": "plain-job"})
    assert plain.status_code == 201, plain.content
    assert plain.json()["purpose"] == HandoffPurpose.JOB
    assert Handoff.objects.get(logical_id="plain-job").purpose == HandoffPurpose.JOB
    listed = {h["logical_id"]: h["purpose"] for h in world.writer_api.get("/handoffs").json()["items"]}
    assert listed == {"review-%d-1" % gate.id: "review", "review-%d-2" % gate.id: "review", "plain-job": "job"}


@pytest.mark.parametrize("who", ["worker", "writer's own"])
def test_the_plain_claim_never_takes_a_review_slot(world: World, plain_workers, who):
    gate = world.gate(route="agent")
    api = plain_workers[who]
    handoff = Handoff.objects.get(review_assignment__packet__gate=gate)
    before = snapshot()
    got = api.post("/handoffs/claim", {"worker": "sneaky", "capabilities": ["review"]})
    assert got.status_code == 200 and got.json() == {"handoff": None}, got.content
    err = refused(api.post("/handoffs/claim", {"worker": "sneaky", "capabilities": ["review"],
                                               "handoff_id": handoff.id}),
                                                       409, "review_route_required")
    assert err["details"]["handoff_id"] == handoff.id and err["details"]["purpose"] == "review"
    assert err["details"]["route"] == "/api/v1/review-packets/claim"
    assert snapshot() == before
    # Also not once its reviewer's lease has run out (what a re-claim would take over).
    _, reviewer = agent_reviewer(world.project)
    assert reviewer.post("/review-packets/claim").json()["lease"]["fencing_token"] == 1
    Handoff.objects.filter(id=handoff.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    before = snapshot()
    assert api.post("/handoffs/claim", {"worker": "sneaky", "capabilities": ["review"]}).json() == {"handoff": None}
    refused(api.post("/handoffs/claim", {"worker": "sneaky", "capabilities": ["review"], "handoff_id": handoff.id}),
            409, "review_route_required")
    assert snapshot() == before


@pytest.mark.parametrize("who", ["worker", "writer's own"])
def test_heartbeat_result_and_cancel_on_a_review_handoff_are_refused_and_write_nothing(world: World, plain_workers, who):
    gate = world.gate(route="agent")
    api = plain_workers[who]
    handoff = Handoff.objects.get(review_assignment__packet__gate=gate)
    # Unclaimed (token 0 is what the plain API would show) and claimed by a real reviewer (token 1).
    for claimed in (False, True):
        if claimed:
            _, reviewer = agent_reviewer(world.project)
            assert reviewer.post("/review-packets/claim").json()["lease"]["handoff_id"] == handoff.id
        handoff.refresh_from_db()
        before = snapshot()
        token = max(handoff.fencing_token, 1)
        refused(api.post(f"/handoffs/{handoff.id}/heartbeat", {"fencing_token": token}),
                409, "review_route_required")
        refused(api.post(f"/handoffs/{handoff.id}/results", {
            "fencing_token": token, "job_fingerprint": handoff.job_fingerprint,
            "result": {**PASS, "packet_fingerprint": gate.packet.fingerprint,
                       "artifact_fingerprint": gate.candidate_fingerprint}}),
                               409, "review_route_required")
        refused(api.post(f"/handoffs/{handoff.id}/cancel", {"reason": "not needed"}),
                409, "review_route_required")
        assert snapshot() == before
    world.refresh()
    assert world.writer.status == "awaiting_external"
    assert world.run.pending_external == [handoff.logical_id]
    gate.refresh_from_db()
    assert gate.state == ReviewGate.State.PENDING and gate.bound_verdicts == 0


def test_a_manager_cancels_a_review_slot_through_its_gate_not_the_handoff(world: World, owner):
    gate = world.gate(route="agent")
    handoff = Handoff.objects.get(review_assignment__packet__gate=gate)
    assert_refused(lambda: owner.post(f"/handoffs/{handoff.id}/cancel", {}), 409, "review_route_required")
    assert owner.post(f"/review-gates/{gate.id}/cancel").status_code == 200
    assert Handoff.objects.get(id=handoff.id).state == HandoffState.CANCELLED
    # And the settled run says why it stopped waiting.
    world.refresh()
    assert world.writer.status == "running" and world.writer.status_reason == f"review gate {gate.id} cancelled"
    last = Event.objects.filter(session_id=world.writer.id, type="session.transitioned").order_by("-id").first()
    assert last.payload["reason"] == f"review gate {gate.id} cancelled"


def test_the_agent_reviewer_route_still_binds_a_verdict(world: World, plain_workers):
    gate = world.gate(route="agent")
    api = plain_workers["writer's own"]
    assert api.post("/handoffs/claim", {"worker": "sneaky", "capabilities": ["review"]}).json() == {"handoff": None}
    _, reviewer = agent_reviewer(world.project)
    lease = reviewer.post("/review-packets/claim").json()["lease"]
    assert reviewer.post(f"/review-packets/{gate.packet.id}/heartbeat",
                         {"fencing_token": lease["fencing_token"]}).status_code == 200
    bound = reviewer.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, lease["fencing_token"]))
    assert bound.status_code == 201, bound.content
    gate.refresh_from_db()
    world.refresh()
    assert gate.state == ReviewGate.State.COMPLETE and gate.bound_verdicts == 1
    assert world.writer.status == "running" and world.run.pending_external == []
    handoff = Handoff.objects.get(id=lease["handoff_id"])
    assert handoff.state == HandoffState.BOUND and ConsumeReceipt.objects.get(handoff=handoff).result["decision"] == "revise"
    assert Run.objects.get(id=world.run.id).state == "open"
