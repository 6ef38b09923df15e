"""Races, with real threads against PostgreSQL: claims are claim-once, verdicts bind once,
and a gate completes (and resumes its session) exactly once."""
from __future__ import annotations

from collections import Counter

import pytest

from novelforge_sessions.control.models import Handoff
from novelforge_sessions.models import Event
from reviews.access import reviewer_for_user
from reviews.actions import bind_verdict
from reviews.models import ReviewAssignment, Verdict
from tests.reviews.factories import agent_reviewer, agent_verdict, verdict_for
from tests.support.races import oks, race

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrent_claims_take_each_slot_once(world):
    gate = world.gate(route="agent", required_verdicts=3)
    agents = [agent_reviewer(world.project)[1] for _ in range(6)]
    results = oks(race([lambda api=api: api.post("/review-packets/claim") for api in agents]))
    assert [r.status_code for r in results] == [200] * 6
    claimed = [r.json()["packet"] for r in results if r.json()["packet"]]
    assert len(claimed) == 3 and {p["id"] for p in claimed} == {gate.packet.id}
    assert len({p["assignment_id"] for p in claimed}) == 3
    assert ReviewAssignment.objects.filter(packet=gate.packet, state="assigned").count() == 3
    assert ReviewAssignment.objects.filter(state="open").count() == 0
    assert Event.objects.filter(type="review.packet_claimed").count() == 3
    # Each claim is one control-plane lease: three handoffs claimed once, three still pending.
    leases = [r.json()["lease"] for r in results if r.json()["lease"]]
    assert len({lease["handoff_id"] for lease in leases}) == 3
    assert {(lease["fencing_token"], lease["attempt"]) for lease in leases} == {(1, 1)}
    assert Handoff.objects.filter(state="claimed", attempt=1).count() == 3


def test_one_reviewer_racing_itself_holds_one_slot_per_packet(world):
    gate = world.gate(route="agent", required_verdicts=4)
    _, api = agent_reviewer(world.project)
    results = oks(race([lambda: api.post("/review-packets/claim") for _ in range(4)]))
    got = [r.json()["packet"] for r in results if r.status_code == 200 and r.json()["packet"]]
    assert len(got) == 1 and got[0]["id"] == gate.packet.id
    assert all(r.status_code in (200, 409) for r in results)
    assert ReviewAssignment.objects.filter(packet=gate.packet, state="assigned").count() == 1


def test_identical_verdicts_racing_bind_once(world):
    gate = world.gate(route="agent")
    _, api = agent_reviewer(world.project)
    api.post("/review-packets/claim")
    body = agent_verdict(gate)
    results = oks(race([lambda: api.post(f"/review-packets/{gate.packet.id}/verdicts", body) for _ in range(5)]))
    assert Counter(r.status_code for r in results) == {201: 1, 200: 4}
    assert len({r.json()["id"] for r in results}) == 1
    assert Verdict.objects.count() == 1
    assert Event.objects.filter(type="review.verdict_bound").count() == 1


def test_last_two_verdicts_racing_complete_the_gate_once(world):
    gate = world.gate(route="relay", reviewers=["alice", "bob"], required_verdicts=2)
    who = {name: reviewer_for_user(world.users[name]) for name in ("alice", "bob")}
    results = oks(race([
        lambda name=name: bind_verdict(who[name], gate.packet.id, verdict_for(gate), channel="relay")
        for name in ("alice", "bob")
    ]))
    assert all(r.created for r in results), results
    gate.refresh_from_db()
    world.refresh()
    assert gate.bound_verdicts == 2 and gate.state == "complete"
    assert world.writer.status == "running"
    assert Event.objects.filter(type="review.gate_completed").count() == 1
    assert Event.objects.filter(session_id=world.writer.id, type="session.transitioned",
                                payload__to="running", payload__from="awaiting_user").count() == 1
