"""Binding verdicts: fingerprints, staleness, idempotency, conflicts, independence, scoping.

Agent reviewers go through the API; the same action backs the reviewer page and the relay."""
from __future__ import annotations

import json

import pytest

from novelforge_sessions.actions.artifacts import add_artifact_version, create_artifact
from novelforge_sessions.control.checkpoints import record_checkpoint
from novelforge_sessions.models import Artifact, Event, Session
from reviews.models import ReviewAssignment, ReviewGate, Verdict
from tests.support.factories import Api
from tests.reviews.factories import World, agent_reviewer, agent_verdict, orchestrator, verdict_for
from tests.support.responses import refused

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent_gate(world: World) -> tuple[ReviewGate, Session, Api]:
    """An agent-route gate with one slot, claimed by a fresh agent reviewer."""
    gate = world.gate(route="agent")
    session, api = agent_reviewer(world.project)
    claimed = api.post("/review-packets/claim")
    assert claimed.status_code == 200 and claimed.json()["packet"]["id"] == gate.packet.id
    return gate, session, api


def bound_events(gate: ReviewGate) -> int:
    return Event.objects.filter(type="review.verdict_bound", payload__gate_id=gate.id).count()


def test_agent_claims_reads_and_binds_a_typed_verdict(world, agent_gate):
    gate, session, api = agent_gate
    packet = api.get(f"/review-packets/{gate.packet.id}").json()
    assert packet["fingerprint"] == gate.packet.fingerprint and packet["state"] == "assigned"
    assert packet["content"]["candidate"]["fingerprint"] == world.version.fingerprint
    assert packet["verdict"] is None
    resp = api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate))
    assert resp.status_code == 201, resp.content
    out = resp.json()
    assert out["decision"] == "revise" and out["scores"] == {"clarity": 4, "pacing": 6} and out["channel"] == "api"
    assert out["reviewer"] == f"session:{session.id}"
    gate.refresh_from_db()
    assert gate.state == "complete" and gate.outcome == "revise" and gate.bound_verdicts == 1
    assert ReviewAssignment.objects.get(packet=gate.packet).state == "submitted"
    assert api.get(f"/review-packets/{gate.packet.id}").json()["verdict"]["id"] == out["id"]
    assert [p["state"] for p in api.get("/review-packets").json()["items"]] == ["submitted"]
    world.refresh()
    assert world.writer.status == "running"  # the agent route never waited on a person


def test_wrong_packet_fingerprint_is_stale_and_stores_nothing(agent_gate):
    gate, _, api = agent_gate
    err = refused(api.post(f"/review-packets/{gate.packet.id}/verdicts",
                                agent_verdict(gate, packet_fingerprint="sha256:" + "f" * 64)), 409, "stale_fingerprint")
    assert err["details"]["field"] == "packet_fingerprint"
    assert Verdict.objects.count() == 0 and bound_events(gate) == 0


def test_wrong_artifact_fingerprint_is_stale(agent_gate):
    gate, _, api = agent_gate
    err = refused(api.post(f"/review-packets/{gate.packet.id}/verdicts",
                                agent_verdict(gate, artifact_fingerprint="sha256:" + "e" * 64)), 409, "stale_fingerprint")
    assert err["details"]["field"] == "artifact_fingerprint"
    assert Verdict.objects.count() == 0


def test_candidate_changed_since_freeze_is_stale(world, agent_gate):
    gate, _, api = agent_gate
    newer = add_artifact_version(world.writer_caller, world.version.artifact_id, content="A different chapter.")
    # Making a version current is an approved write elsewhere; here we only need its effect.
    Artifact.objects.filter(id=world.version.artifact_id).update(current_version=newer)
    err = refused(api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate)), 409, "stale_fingerprint")
    assert err["details"]["reason"] == "candidate_changed"
    gate.refresh_from_db()
    assert Verdict.objects.count() == 0 and gate.state == "pending" and gate.bound_verdicts == 0
    assert ReviewAssignment.objects.get(packet=gate.packet).state == "assigned"


def test_a_new_version_that_is_not_current_does_not_make_the_review_stale(world, agent_gate):
    gate, _, api = agent_gate
    add_artifact_version(world.writer_caller, world.version.artifact_id, content="Unapproved next draft.")
    assert api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate)).status_code == 201


def test_out_of_scale_score_is_422_naming_the_field(agent_gate):
    gate, _, api = agent_gate
    err = refused(api.post(f"/review-packets/{gate.packet.id}/verdicts",
                                agent_verdict(gate, scores={"clarity": 9, "pacing": 3})), 422, "validation_error")
    assert err["details"]["field"] == "scores.clarity"
    assert Verdict.objects.count() == 0


def test_malformed_json_is_400(agent_gate):
    gate, _, api = agent_gate
    refused(api.post(f"/review-packets/{gate.packet.id}/verdicts", raw="{nope"), 400, "malformed_body")


def test_identical_resubmission_is_idempotent(agent_gate):
    gate, _, api = agent_gate
    first = api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate))
    # Same content, different key order and 0.7 written as 0.70 → the same verdict.
    again = api.post(f"/review-packets/{gate.packet.id}/verdicts",
                     raw=json.dumps(dict(reversed(list(agent_verdict(gate).items())))).replace("0.7", "0.70"))
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert Verdict.objects.count() == 1 and bound_events(gate) == 1


def test_conflicting_resubmission_is_refused(agent_gate):
    gate, _, api = agent_gate
    first = api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate)).json()
    err = refused(api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, decision="reject")),
                       409, "verdict_conflict")
    assert err["details"]["verdict_id"] == first["id"]
    assert list(Verdict.objects.values_list("decision", flat=True)) == ["revise"] and bound_events(gate) == 1


def test_the_db_refuses_a_second_verdict_from_one_reviewer_on_one_packet(agent_gate):
    from django.db import IntegrityError, transaction

    gate, session, api = agent_gate
    api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate))
    v = Verdict.objects.get()
    other_slot = ReviewAssignment.objects.create(packet=gate.packet, reviewer="user:999", state="assigned")
    with pytest.raises(IntegrityError), transaction.atomic():
        Verdict.objects.create(
            packet=gate.packet, assignment=other_slot, reviewer=v.reviewer, channel="api", decision="pass",
            scores=v.scores, confidence=0.5, packet_fingerprint=v.packet_fingerprint,
            artifact_fingerprint=v.artifact_fingerprint, fingerprint="sha256:" + "0" * 64,
        )


def test_a_reviewer_cannot_open_another_reviewers_packet(world):
    gate = world.gate(route="agent", required_verdicts=1)
    _, first = agent_reviewer(world.project)
    _, second = agent_reviewer(world.project)
    assert first.post("/review-packets/claim").json()["packet"]["id"] == gate.packet.id
    assert second.post("/review-packets/claim").json() == {"packet": None, "lease": None}
    refused(second.get(f"/review-packets/{gate.packet.id}"), 404, "not_found")
    refused(second.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate)), 404, "not_found")
    assert second.get("/review-packets").json()["items"] == []
    assert Verdict.objects.count() == 0


def test_claim_skips_packets_the_reviewer_is_not_independent_of(world):
    """A reviewer session whose token wrote the candidate never receives that packet."""
    session, api = agent_reviewer(world.project, permissions=("review", "write", "read"))
    from novelforge_sessions.apikit.auth import caller_for_token

    own = create_artifact(caller_for_token(api.token), name="reviewers-own", kind="chapter", content="My own words.")
    # the writer is given it (an orchestrator's checkpoint on its run cites it: a citation by the
    # bound writer itself names only what it already reaches): a bound token gates only what it reaches
    record_checkpoint(orchestrator(world.project), world.run.id, {
        "boundary": "context_freeze", "cursor": {"step": "given"},
        "artifacts": [{"artifact_id": own.id, "fingerprint": own.current_version.fingerprint}]})
    world.gate(route="agent", candidate_version_id=own.current_version_id)
    assert api.post("/review-packets/claim").json() == {"packet": None, "lease": None}
    # Pre-assigned anyway (the gate cannot see token labels)? Binding re-checks and refuses.
    gate = world.gate(route="agent", candidate_version_id=own.current_version_id, reviewer_session_ids=[session.id])
    err = refused(api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate)), 403,
                       "independence_violation")
    assert Verdict.objects.count() == 0 and err["message"]


def test_a_token_not_bound_to_a_reviewer_session_cannot_review(world):
    world.gate(route="agent")
    _, unbound = agent_reviewer(world.project, bound=False)
    refused(unbound.post("/review-packets/claim"), 403, "independence_violation")
    _, bounded_memory = agent_reviewer(world.project, memory="session")
    refused(bounded_memory.post("/review-packets/claim"), 403, "independence_violation")
    _, no_permission = agent_reviewer(world.project, permissions=("read",))
    refused(no_permission.post("/review-packets/claim"), 403, "forbidden")
    assert ReviewAssignment.objects.filter(state="open").count() == 1


def test_the_writer_session_cannot_review_its_own_candidate(world):
    from novelforge_sessions.actions.tokens import create_token

    world.gate(route="agent")
    _, raw = create_token(world.project, name="writer-review", permissions=["review"], session=world.writer)
    refused(Api(raw).post("/review-packets/claim"), 403, "independence_violation")


def test_human_reviewer_cannot_bind_on_a_packet_not_assigned_to_them(world, as_user):
    gate = world.gate(reviewers=["alice"])
    resp = as_user("bob").post(f"/reviews/packets/{gate.packet.id}/", {"decision": "pass"})
    assert resp.status_code == 404
    assert as_user("bob").get(f"/reviews/packets/{gate.packet.id}/").status_code == 404
    assert as_user("bob").get(f"/reviews/packets/{gate.packet.id}/relay.txt").status_code == 404
    assert Verdict.objects.count() == 0


def test_a_cancelled_gate_takes_no_verdict(world, agent_gate):
    gate, _, api = agent_gate
    assert world.writer_api.post(f"/review-gates/{gate.id}/cancel").status_code == 200
    refused(api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate)), 409, "gate_closed")
    assert Verdict.objects.count() == 0


def test_a_complete_gate_still_records_a_late_assigned_reviewer(world):
    from reviews.access import reviewer_for_user
    from reviews.actions import bind_verdict

    gate = world.gate(reviewers=["alice", "bob"], required_verdicts=1)
    first = bind_verdict(reviewer_for_user(world.users["alice"]), gate.packet.id, verdict_for(gate), channel="page")
    late = bind_verdict(reviewer_for_user(world.users["bob"]), gate.packet.id, verdict_for(gate, decision="reject"),
                        channel="page")
    assert first.created and late.created
    gate.refresh_from_db()
    # The outcome was settled by the required verdict; the late one counts for calibration only.
    assert (gate.state, gate.outcome, gate.bound_verdicts) == ("complete", "revise", 2)
    assert Event.objects.filter(type="review.gate_completed").count() == 1


def test_reviewing_a_version_that_is_not_yet_current(world):
    """The usual flow: draft v2 (not current), review it, approve it. Promoting the candidate
    itself is not a change; promoting anything else is."""
    v2 = add_artifact_version(world.writer_caller, world.version.artifact_id, content="Second draft.")
    gate = world.gate(route="agent", required_verdicts=2, candidate_version_id=v2.id)
    _, one = agent_reviewer(world.project)
    _, two = agent_reviewer(world.project)
    one.post("/review-packets/claim"), two.post("/review-packets/claim")
    Artifact.objects.filter(id=v2.artifact_id).update(current_version=v2)
    assert one.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate)).status_code == 201
    v3 = add_artifact_version(world.writer_caller, world.version.artifact_id, content="Third draft.")
    Artifact.objects.filter(id=v2.artifact_id).update(current_version=v3)
    refused(two.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate)), 409, "stale_fingerprint")
    assert Verdict.objects.count() == 1


def test_binding_rechecks_that_a_human_is_not_the_author(world, as_user):
    """Even with a slot on the packet (say, assigned by hand), the candidate's author is refused."""
    from novelforge_sessions.models import ArtifactVersion
    from reviews.packets import sha256_fingerprint

    mine = ArtifactVersion.objects.create(artifact=world.version.artifact, number=2, content="alice wrote this",
                                          fingerprint=sha256_fingerprint(b"alice wrote this"), created_by="user:alice")
    gate = world.gate(reviewers=["bob"], candidate_version_id=mine.id)
    ReviewAssignment.objects.create(packet=gate.packet, reviewer=f"user:{world.users['alice'].id}",
                                    reviewer_user=world.users["alice"], state="assigned")
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/", {
        "packet_fingerprint": gate.packet.fingerprint, "artifact_fingerprint": gate.candidate_fingerprint,
        "decision": "pass", "score-clarity": "5", "score-pacing": "5", "confidence": "1"})
    assert resp.status_code == 403 and b"independence_violation" in resp.content
    assert Verdict.objects.count() == 0


def test_a_nul_in_a_verdict_is_422_and_stores_nothing(agent_gate):
    """The verdict body is parsed by hand; text PostgreSQL cannot store is refused there too."""
    gate, _, api = agent_gate
    body = agent_verdict(gate, findings=[{"location": "L1", "severity": "minor", "note": "bad\x00byte"}])
    err = refused(api.post(f"/review-packets/{gate.packet.id}/verdicts", body), 422, "validation_error")
    assert err["details"]["field"] == "findings[0].note"
    assert Verdict.objects.count() == 0 and bound_events(gate) == 0


@pytest.mark.parametrize("depth", [900, 5000])
def test_a_verdict_nested_too_deep_is_400_not_500(agent_gate, depth):
    """The hand parser: 5,000 levels overflow json.loads itself; 900 parse but cannot be stored."""
    gate, _, api = agent_gate
    verdict = {**agent_verdict(gate), "scores": {"clarity": "DEEP"}}  # replaced, not repeated: keys are unique
    raw = json.dumps(verdict).replace('"DEEP"', "[" * depth + "]" * depth)
    refused(api.post(f"/review-packets/{gate.packet.id}/verdicts", raw=raw), 400, "malformed_body")
    assert Verdict.objects.count() == 0
