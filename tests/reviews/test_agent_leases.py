"""Agent reviewers claim review packets as control-plane handoffs: leases, fencing tokens,
re-claims after expiry, heartbeats, and the verdict as the handoff's consumed result."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from novelforge_sessions.control.models import ConsumeReceipt, Handoff, ResultDelivery
from novelforge_sessions.models import Event
from reviews.models import ReviewAssignment, ReviewGate, Verdict
from tests.support.factories import Api
from tests.reviews.factories import World, agent_reviewer, agent_verdict, verdict_for
from tests.support.responses import refused

pytestmark = pytest.mark.django_db


def claim(api: Api) -> dict[str, Any]:
    resp = api.post("/review-packets/claim")
    assert resp.status_code == 200, resp.content
    return resp.json()


def expire(gate: ReviewGate) -> None:
    """Let every claimed lease of the gate run out (as if its holder crashed)."""
    Handoff.objects.filter(review_assignment__packet__gate=gate).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))


def test_session_awaits_external_reviewers_and_runs_again_when_bound(world: World):
    gate = world.gate(route="agent", required_verdicts=2)
    world.refresh()
    assert world.writer.status == "awaiting_external" and len(world.run.pending_external) == 2
    (_, one), (_, two) = agent_reviewer(world.project), agent_reviewer(world.project)
    first, second = claim(one), claim(two)
    assert first["packet"]["id"] == second["packet"]["id"] == gate.packet.id
    assert first["lease"]["fencing_token"] == 1 and first["lease"]["attempt"] == 1

    assert one.post(f"/review-packets/{gate.packet.id}/verdicts",
                    agent_verdict(gate, first["lease"]["fencing_token"])).status_code == 201
    world.refresh()
    assert world.writer.status == "awaiting_external"  # one verdict still outstanding
    assert world.run.pending_external == [Handoff.objects.get(id=second["lease"]["handoff_id"]).logical_id]

    assert two.post(f"/review-packets/{gate.packet.id}/verdicts",
                    agent_verdict(gate, second["lease"]["fencing_token"], decision="pass")).status_code == 201
    world.refresh()
    gate.refresh_from_db()
    assert gate.state == "complete" and world.writer.status == "running" and world.run.state == "open"
    assert world.run.pending_external == []
    # The control plane's records tell the same story: each handoff bound, one consumed delivery
    # and one receipt each, whose result is the verdict.
    for lease, decision in ((first["lease"], "revise"), (second["lease"], "pass")):
        handoff = Handoff.objects.get(id=lease["handoff_id"])
        assert handoff.state == "bound"
        assert list(ResultDelivery.objects.filter(handoff=handoff).values_list("outcome", flat=True)) == ["consumed"]
        receipt = ConsumeReceipt.objects.get(handoff=handoff)
        assert receipt.result["decision"] == decision and receipt.result["packet_fingerprint"] == gate.packet.fingerprint
    transitions = list(Event.objects.filter(session_id=world.writer.id, type="session.transitioned")
                       .values_list("payload__from", "payload__to"))
    assert transitions[-2:] == [("running", "awaiting_external"), ("awaiting_external", "running")]


def test_an_expired_lease_is_reclaimed_and_the_first_reviewers_verdict_is_stale(world: World):
    gate = world.gate(route="agent")
    (_, crashed), (second_session, second) = agent_reviewer(world.project), agent_reviewer(world.project)
    first = claim(crashed)
    assert claim(second) == {"packet": None, "lease": None}  # the live lease holds
    expire(gate)

    taken = claim(second)
    assert taken["packet"]["id"] == gate.packet.id
    assert (taken["lease"]["attempt"], taken["lease"]["fencing_token"]) == (2, 2)
    assert taken["lease"]["handoff_id"] == first["lease"]["handoff_id"]
    slot = ReviewAssignment.objects.get(packet=gate.packet)
    assert slot.reviewer == f"session:{second_session.id}" and slot.state == "assigned"
    assert Event.objects.filter(type="handoff.claimed", payload__attempt=2,
                                payload__reclaimed_after_expiry=True).count() == 1

    err = refused(crashed.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, 1)),
                       409, "stale_lease")
    assert err["details"]["current_fencing_token"] == 2
    assert Verdict.objects.count() == 0 and ResultDelivery.objects.count() == 0
    refused(crashed.post(f"/review-packets/{gate.packet.id}/heartbeat", {"fencing_token": 1}), 409, "stale_lease")

    bound = second.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, 2))
    assert bound.status_code == 201, bound.content
    # A bound claim takes no more heartbeats; the identical verdict again is idempotent.
    refused(second.post(f"/review-packets/{gate.packet.id}/heartbeat", {"fencing_token": 2}), 409, "handoff_closed")
    again = second.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, 2))
    assert again.status_code == 200 and again.json()["id"] == bound.json()["id"]
    world.refresh()
    assert world.writer.status == "running"
    assert ResultDelivery.objects.get().attempt == 2


def test_heartbeat_renews_the_current_lease_and_refuses_a_stale_token(world: World):
    gate = world.gate(route="agent")
    _, api = agent_reviewer(world.project)
    lease = claim(api)["lease"]
    Handoff.objects.filter(id=lease["handoff_id"]).update(lease_expires_at=timezone.now() + timedelta(seconds=5))
    renewed = api.post(f"/review-packets/{gate.packet.id}/heartbeat", {"fencing_token": 1})
    assert renewed.status_code == 200, renewed.content
    assert renewed.json()["handoff_id"] == lease["handoff_id"] and renewed.json()["fencing_token"] == 1
    assert Handoff.objects.get(id=lease["handoff_id"]).lease_expires_at > timezone.now() + timedelta(seconds=60)

    # Its own expired lease re-claimed: the old token is superseded.
    expire(gate)
    again = claim(api)["lease"]
    assert again["fencing_token"] == 2
    err = refused(api.post(f"/review-packets/{gate.packet.id}/heartbeat", {"fencing_token": 1}), 409, "stale_lease")
    assert err["details"]["current_fencing_token"] == 2
    assert api.post(f"/review-packets/{gate.packet.id}/heartbeat", {"fencing_token": 2}).status_code == 200
    assert api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, 1)).status_code == 409
    assert Verdict.objects.count() == 0


def test_a_verdict_without_its_fencing_token_is_422_naming_the_field(world: World):
    gate = world.gate(route="agent")
    _, api = agent_reviewer(world.project)
    claim(api)
    err = refused(api.post(f"/review-packets/{gate.packet.id}/verdicts", verdict_for(gate)), 422, "validation_error")
    assert err["details"]["field"] == "fencing_token"
    err = refused(api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, "1")),
                       422, "validation_error")
    assert err["details"]["field"] == "fencing_token"
    assert Verdict.objects.count() == 0


def test_a_pre_assigned_reviewer_claims_its_own_slot_before_binding(world: World):
    session, api = agent_reviewer(world.project)
    _, other = agent_reviewer(world.project)
    gate = world.gate(route="agent", reviewer_session_ids=[session.id])
    refused(api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate)), 409, "handoff_not_claimable")
    assert claim(other) == {"packet": None, "lease": None}  # not someone else's to take
    lease = claim(api)["lease"]
    assert api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, lease["fencing_token"])).status_code == 201
    world.refresh()
    assert world.writer.status == "running"


def test_cancelling_an_agent_gate_withdraws_its_handoffs_and_resumes_the_session(world: World):
    gate = world.gate(route="agent", required_verdicts=2)
    _, api = agent_reviewer(world.project)
    claim(api)
    resp = world.writer_api.post(f"/review-gates/{gate.id}/cancel")
    assert resp.status_code == 200, resp.content
    assert set(Handoff.objects.filter(review_assignment__packet__gate=gate).values_list("state", flat=True)) == {"cancelled"}
    world.refresh()
    assert world.writer.status == "running" and world.run.pending_external == []
    refused(api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate)), 409, "gate_closed")
    assert claim(api) == {"packet": None, "lease": None}
