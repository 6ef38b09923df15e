"""Opening review gates through the API: the candidate and rubric are frozen, the packet built,
reviewers assigned and independent, the session waits on a person for page/relay routes."""
from __future__ import annotations

from typing import Any

import pytest

from novelforge_sessions.models import ArtifactVersion, Event
from reviews.models import GateCalibration, ReviewAssignment, ReviewGate, ReviewPacket
from tests.support.factories import Api
from tests.reviews.factories import RUBRIC, World, agent_reviewer
from tests.support.responses import refused

pytestmark = pytest.mark.django_db


def body(world: World, **over: Any) -> dict[str, Any]:
    b = {"candidate_version_id": world.version.id, "rubric": RUBRIC, "route": "page", "reviewers": ["alice"]}
    b.update(over)
    return b


def test_open_page_gate_freezes_candidate_and_waits_on_user(world):
    resp = world.writer_api.post(
        f"/sessions/{world.writer.id}/review-gates",
        body(world, reviewers=["alice", "bob"], required_verdicts=2,
             evidence=[{"key": "style_guide", "label": "House style", "content": "Short sentences."}],
             calibration={"expected_decision": "revise", "answer_key": "line 2 is vague"}),
    )
    assert resp.status_code == 201, resp.content
    out = resp.json()
    gate = ReviewGate.objects.get(id=out["id"])
    assert out["state"] == "pending" and out["route"] == "page" and out["required_verdicts"] == 2
    assert out["candidate_fingerprint"] == world.version.fingerprint == gate.candidate_fingerprint
    assert out["packet_fingerprint"] == gate.packet.fingerprint and out["has_calibration"] is True
    assert "calibration" not in out and "line 2 is vague" not in resp.content.decode()
    assert out["run_id"] == world.run.id
    assert [a["state"] for a in out["assignments"]] == ["assigned", "assigned"]
    assert gate.packet.content["evidence"] == [{"key": "style_guide", "label": "House style", "content": "Short sentences."}]
    assert GateCalibration.objects.get(gate=gate).answer_key == "line 2 is vague"
    world.refresh()
    assert world.writer.status == "awaiting_user" and world.run.state == "open"
    types = list(Event.objects.filter(session_id=world.writer.id).order_by("id").values_list("type", flat=True))
    assert types[-2:] == ["review.gate_opened", "session.transitioned"]


def test_agent_gate_hands_off_one_job_per_verdict_and_awaits_external(world):
    resp = world.writer_api.post(f"/sessions/{world.writer.id}/review-gates",
                                 body(world, route="agent", reviewers=[], required_verdicts=2))
    assert resp.status_code == 201, resp.content
    gate = resp.json()
    world.refresh()
    assert world.writer.status == "awaiting_external" and world.run.state == "open"
    slots = ReviewAssignment.objects.filter(packet__gate_id=gate["id"]).select_related("handoff").order_by("id")
    assert [a.state for a in slots] == ["open", "open"]
    handoffs = [a.handoff for a in slots]
    assert [h.logical_id for h in handoffs] == [f"review-{gate['id']}-1", f"review-{gate['id']}-2"]
    for h in handoffs:
        assert h.state == "pending" and h.required_capabilities == ["review"] and h.run_id == world.run.id
        assert h.inputs == [{"artifact_id": world.version.artifact_id, "fingerprint": world.version.fingerprint}]
        assert h.params == {"review_packet_id": gate["packet_id"], "packet_fingerprint": gate["packet_fingerprint"]}
    assert world.run.pending_external == [h.logical_id for h in handoffs]
    types = list(Event.objects.filter(session_id=world.writer.id).order_by("id").values_list("type", flat=True))
    assert types[-4:] == ["review.gate_opened", "handoff.created", "session.transitioned", "handoff.created"]


def test_routing_records_live_agent_reviewers_before_waiting_on_a_person(world, owner):
    reviewer, _ = agent_reviewer(world.project)
    resp = world.writer_api.post(f"/sessions/{world.writer.id}/review-gates", body(world))
    # the writer's bound token reaches no other session: it learns how many, not which
    assert resp.json()["routing"] == {"live_agent_reviewers": [], "live_agent_reviewer_count": 1}
    gate = resp.json()["id"]
    assert world.writer_api.get(f"/review-gates/{gate}").json()["routing"] == resp.json()["routing"]
    # the unbound project token reaches every session of the project
    assert owner.get(f"/review-gates/{gate}").json()["routing"] == {
        "live_agent_reviewers": [{"session_id": reviewer.id, "runtime_family": "codex"}], "live_agent_reviewer_count": 1}


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"route": "carrier-pigeon"}, "route"),
        ({"rubric": {"criteria": [{"key": "a", "label": "A", "scale": {"min": 3, "max": 1}}]}}, "rubric.criteria[0].scale.max"),
        ({"evidence": [{"key": "writer_notes", "label": "N", "content": "x"}]}, "evidence[0].key"),
        ({"reviewers": ["mallory"]}, "reviewers[0]"),
        ({"reviewers": ["mia"]}, "reviewers[0]"),  # a manager, not a reviewer
        ({"reviewers": []}, "reviewers"),
        ({"reviewers": ["alice"], "required_verdicts": 2}, "required_verdicts"),
        ({"calibration": {"expected_decision": "maybe"}}, "calibration.expected_decision"),
        ({"calibration": {"expected_scores": {"clarity": 9}}}, "calibration.expected_scores.clarity"),
        ({"surprise": True}, "surprise"),
    ],
)
def test_bad_gates_are_422_naming_the_field_and_write_nothing(world, over, field):
    err = refused(world.writer_api.post(f"/sessions/{world.writer.id}/review-gates", body(world, **over)), 422,
                       "validation_error")
    assert err["details"]["field"] == field
    assert ReviewGate.objects.count() == 0 and ReviewPacket.objects.count() == 0
    world.refresh()
    assert world.writer.status == "running"


def test_gate_needs_a_running_session(world):
    assert world.writer_api.post(f"/sessions/{world.writer.id}/review-gates", body(world)).status_code == 201
    # Now awaiting_user: a second gate cannot be opened until the run continues.
    refused(world.writer_api.post(f"/sessions/{world.writer.id}/review-gates", body(world)), 409, "session_not_running")
    assert ReviewGate.objects.count() == 1


def test_candidate_of_another_project_is_404(world, other_project):
    foreign = ArtifactVersion.objects.create(
        artifact=other_project.artifacts.create(name="x"), number=1, content="x",
        fingerprint="sha256:" + "b" * 64,
    )
    refused(world.writer_api.post(f"/sessions/{world.writer.id}/review-gates",
                                       body(world, candidate_version_id=foreign.id)), 404, "not_found")
    assert ReviewGate.objects.count() == 0


def test_reviewer_who_wrote_the_candidate_is_refused(world):
    mine = ArtifactVersion.objects.create(
        artifact=world.version.artifact, number=2, content="alice's draft",
        fingerprint="sha256:" + "c" * 64, created_by="user:alice",
    )
    err = refused(world.writer_api.post(f"/sessions/{world.writer.id}/review-gates",
                                             body(world, candidate_version_id=mine.id, reviewers=["bob", "alice"])),
                       403, "independence_violation")
    assert err["details"]["field"] == "reviewers[1]"
    assert ReviewGate.objects.count() == 0


@pytest.mark.parametrize(("role", "memory"), [("semantic_reviewer", "session"), ("specialist", "none")])
def test_agent_route_refuses_non_independent_sessions(world, role, memory):
    """The same 422 as an id that names no session, saying nothing of the session's role or
    memory policy (a bound token reaches no other session: ``tests/api/test_bound_tokens.py``)."""
    reviewer, _ = agent_reviewer(world.project, role=role, memory=memory)
    err = refused(world.writer_api.post(
        f"/sessions/{world.writer.id}/review-gates",
        body(world, route="agent", reviewers=[], reviewer_session_ids=[reviewer.id])), 422, "validation_error")
    assert err["details"] == {"field": "reviewer_session_ids[0]"}
    assert ReviewGate.objects.count() == 0


def test_agent_route_refuses_the_writer_as_its_own_reviewer(world):
    refused(world.writer_api.post(
        f"/sessions/{world.writer.id}/review-gates",
        body(world, route="agent", reviewers=[], reviewer_session_ids=[world.writer.id])), 403, "independence_violation")


def test_only_writer_or_manager_sessions_open_gates(world, owner, new_session):
    specialist = new_session(role="specialist", run=True)
    refused(owner.post(f"/sessions/{specialist['id']}/review-gates", body(world)), 403, "forbidden")


def test_gate_reads_are_scoped_to_the_callers_sessions(world):
    gate = world.gate()
    assert world.writer_api.get(f"/review-gates/{gate.id}").status_code == 200
    listing = world.writer_api.get(f"/sessions/{world.writer.id}/review-gates").json()
    assert [g["id"] for g in listing["items"]] == [gate.id]
    _, reviewer_api = agent_reviewer(world.project, permissions=("review", "read"))
    refused(reviewer_api.get(f"/review-gates/{gate.id}"), 404, "not_found")


def test_cancel_returns_the_session_to_running(world):
    gate = world.gate(route="relay")
    world.refresh()
    assert world.writer.status == "awaiting_user"
    resp = world.writer_api.post(f"/review-gates/{gate.id}/cancel")
    assert resp.status_code == 200 and resp.json()["state"] == "cancelled"
    world.refresh()
    assert world.writer.status == "running" and world.run.state == "open"
    assert world.writer_api.post(f"/review-gates/{gate.id}/cancel").status_code == 200  # idempotent


def test_openapi_documents_review_routes_without_calibration_in_packets():
    schema = Api(None).client.get("/api/openapi.json").json()
    for path in ["/api/v1/sessions/{session_id}/review-gates", "/api/v1/review-packets/claim",
                 "/api/v1/review-packets/{packet_id}", "/api/v1/review-packets/{packet_id}/verdicts",
                 "/api/v1/review-packets/{packet_id}/heartbeat"]:
        assert path in schema["paths"], path
    # The lease routes declare their refusals (409 stale_lease among them).
    for path, statuses in [("/api/v1/review-packets/claim", {"200", "403", "409", "422"}),
                           ("/api/v1/review-packets/{packet_id}/heartbeat", {"200", "403", "404", "409", "422"}),
                           ("/api/v1/review-packets/{packet_id}/verdicts", {"200", "201", "400", "403", "404", "409", "422"})]:
        assert statuses <= set(schema["paths"][path]["post"]["responses"]), path
    verdict_body = schema["paths"]["/api/v1/review-packets/{packet_id}/verdicts"]["post"]["requestBody"]
    assert "fencing_token" in verdict_body["content"]["application/json"]["schema"]["required"]
    comps = schema["components"]["schemas"]
    for name in ("PacketOut", "VerdictOut", "PacketClaimOut", "PacketSummaryOut", "PacketLeaseOut"):
        text = str(comps[name])
        assert "calibration" not in text and "answer_key" not in text and "expected" not in text


def test_a_superseded_generation_cannot_open_a_gate_on_the_resumed_run(world):
    """Generation fencing (docs/model.md#generation-fencing) covers opening a gate: after resume, generation 1's
    agent (same token) is refused — unnamed runtime_required, named stale_runtime — nothing written."""
    from novelforge_sessions.models import RuntimeAttachment

    gen1 = RuntimeAttachment.objects.get(session=world.writer, generation=1).id
    assert world.writer_api.post(f"/sessions/{world.writer.id}/close", {}).status_code == 200
    report = world.writer_api.post(f"/sessions/{world.writer.id}/resume",
                                   {"runtime": {"runtime_family": "claude-code", "lease_seconds": 600}}).json()
    assert report["ok"] and report["generation"] == 2
    counts = (ReviewGate.objects.count(), ReviewPacket.objects.count(), ReviewAssignment.objects.count(), Event.objects.count())

    refused(world.writer_api.post(f"/sessions/{world.writer.id}/review-gates", body(world)), 409, "runtime_required")
    err = refused(world.writer_api.post(f"/sessions/{world.writer.id}/review-gates", body(world, runtime_id=gen1)),
                       409, "stale_runtime")
    assert err["details"]["live_runtime_id"] == report["runtime_id"]
    assert (ReviewGate.objects.count(), ReviewPacket.objects.count(), ReviewAssignment.objects.count(),
            Event.objects.count()) == counts
    world.refresh()
    assert world.writer.status == "running"

    resp = world.writer_api.post(f"/sessions/{world.writer.id}/review-gates", body(world, runtime_id=report["runtime_id"]))
    assert resp.status_code == 201, resp.content
    assert resp.json()["run_id"] == report["run_id"]


@pytest.mark.parametrize("route", ["page", "agent"])
def test_a_gate_is_not_opened_once_the_writer_s_lease_ran_out(world, route):
    """Opening a gate is the run's own work: refused ``no_live_runtime`` the moment the runtime's
    lease ran out, before any reconciler pass, and nothing is written."""
    from novelforge_sessions.control.models import Handoff
    from tests.sessions.test_liveness import expire

    expire(world.writer.id)
    before = (Event.objects.count(), ReviewGate.objects.count(), ReviewPacket.objects.count(),
              ReviewAssignment.objects.count(), Handoff.objects.count())
    extra = {"reviewers": [], "required_verdicts": 1} if route == "agent" else {}
    err = refused(world.writer_api.post(f"/sessions/{world.writer.id}/review-gates", body(world, route=route, **extra)),
                       409, "no_live_runtime")
    assert err["details"] == {"session_id": world.writer.id, "status": "running"}
    assert (Event.objects.count(), ReviewGate.objects.count(), ReviewPacket.objects.count(),
            ReviewAssignment.objects.count(), Handoff.objects.count()) == before
    world.refresh()
    assert world.writer.status == "running" and world.run.state == "open"
