"""The leak test (docs/model.md#reviews-and-independence): nothing private reaches a reviewer.

A gate is seeded with unique markers wherever a writer might keep private material — the
transcript, the run's cursor and frozen inputs, a checkpoint's cursor — plus the gate's
hidden calibration (expected verdict, answer key) and other reviewers' verdicts. Then every
response a reviewer can obtain is scanned: the queue and packet pages, the relay export, the
packet JSON and verdict responses from the API, error bodies (404/409/422/400), the events the
review actions appended, and the event log an agent reviewer can read.
"""
from __future__ import annotations

import json

import pytest
from django.test import Client

from novelforge_sessions.control.checkpoints import record_checkpoint
from novelforge_sessions.actions.runs import start_run
from novelforge_sessions.actions.transcript import append_transcript
from novelforge_sessions.apikit.auth import caller_for_token
from novelforge_sessions.control.models import Handoff
from novelforge_sessions.models import Event
from reviews.actions import GateSpec, bind_verdict, open_gate
from reviews.access import reviewer_for_user
from tests.support.factories import Api
from tests.reviews.factories import RUBRIC, add_writer, agent_reviewer, agent_verdict, citing, make_world, orchestrator, verdict_for

pytestmark = pytest.mark.django_db

MARKERS = {
    "transcript": "MARKER-TRANSCRIPT-7f3a91",
    "reasoning_cursor": "MARKER-PRIVATE-REASONING-CURSOR-2b8e",
    "reasoning_inputs": "MARKER-PRIVATE-REASONING-INPUTS-c41d",
    "checkpoint": "MARKER-CHECKPOINT-PENDING-9e07",
    "answer_key_page": "MARKER-ANSWER-KEY-PAGE-5a5a",
    "answer_key_agent": "MARKER-ANSWER-KEY-AGENT-6b6b",
    "other_verdict_human": "MARKER-BOB-VERDICT-1c2d",
    "other_verdict_agent": "MARKER-AGENT1-VERDICT-3e4f",
}
#: Names of hidden material that must not appear either (the expected verdict is an enum value,
#: so its container's names are what can leak).
HIDDEN_NAMES = ("expected_decision", "expected_scores", "answer_key", "calibration")


def scan(label: str, text: str) -> None:
    for name, marker in MARKERS.items():
        assert marker not in text, f"{name} marker leaked into {label}"
    for name in HIDDEN_NAMES:
        assert name not in text, f"{name!r} leaked into {label}"


def test_no_private_material_reaches_any_reviewer_facing_response(project):
    world = make_world(
        project,
        cursor={"step": "draft", "note": MARKERS["reasoning_cursor"]},
        frozen_inputs=[{"kind": "scratch", "text": MARKERS["reasoning_inputs"]}],
    )
    # A second writer session for the page gate: an agent gate moves its session to
    # awaiting_external, which cannot also await a person. Both carry the private markers.
    raw2 = add_writer(project)[1]
    writer2 = caller_for_token(raw2)
    run2 = start_run(orchestrator(project), writer2.session_id, cursor={"step": "draft", "note": MARKERS["reasoning_cursor"]},
                     frozen_inputs=[{"kind": "scratch", "text": MARKERS["reasoning_inputs"]}, *citing(world.version)])
    for who, session_id, run_id in ((world.writer_caller, world.writer.id, world.run.id), (writer2, writer2.session_id, run2.id)):
        append_transcript(who, session_id, role="assistant",
                          content=f"Thinking privately: {MARKERS['transcript']}; the reviewer should pass this.")
        record_checkpoint(who, run_id, {
            "boundary": "candidate_frozen", "cursor": {"step": "review", "hint": MARKERS["checkpoint"]},
            "artifacts": [{"artifact_id": world.version.artifact_id, "fingerprint": world.version.fingerprint}],
        })

    # An agent gate (its session awaits external reviewers) and a page gate (its session awaits a person).
    agent_gate = world.gate(route="agent", required_verdicts=2, calibration={
        "expected_decision": "reject", "expected_scores": {"clarity": 1}, "answer_key": MARKERS["answer_key_agent"]})
    page_gate = open_gate(writer2, writer2.session_id, GateSpec(
        candidate_version_id=world.version.id, rubric=RUBRIC, route="page", reviewers=["alice", "bob"],
        required_verdicts=2, calibration={"expected_decision": "revise", "answer_key": MARKERS["answer_key_page"]}))
    first_event = Event.objects.order_by("id").last().id

    # Other reviewers' verdicts, each carrying a marker.
    bind_verdict(reviewer_for_user(world.users["bob"]), page_gate.packet.id, verdict_for(
        page_gate, findings=[{"location": "L1", "severity": "major", "note": MARKERS["other_verdict_human"]}]), channel="page")
    _, agent1 = agent_reviewer(project)
    assert agent1.post("/review-packets/claim").status_code == 200
    assert agent1.post(f"/review-packets/{agent_gate.packet.id}/verdicts", agent_verdict(
        agent_gate, findings=[{"location": "L3", "severity": "minor", "note": MARKERS["other_verdict_agent"]}])).status_code == 201

    # --- the human reviewer alice -------------------------------------------------------
    alice = Client()
    alice.force_login(world.users["alice"])
    pid = page_gate.packet.id
    responses = {
        "queue": alice.get("/reviews/"),
        "packet page": alice.get(f"/reviews/packets/{pid}/"),
        "relay export": alice.get(f"/reviews/packets/{pid}/relay.txt"),
        "404 other packet": alice.get(f"/reviews/packets/{agent_gate.packet.id}/"),
        "404 other relay": alice.get(f"/reviews/packets/{agent_gate.packet.id}/relay.txt"),
        "calibration page (not a manager)": alice.get("/reviews/calibration/"),
        "409 stale form": alice.post(f"/reviews/packets/{pid}/", {
            "packet_fingerprint": "sha256:" + "0" * 64, "artifact_fingerprint": page_gate.candidate_fingerprint,
            "decision": "pass", "score-clarity": "3", "score-pacing": "3", "confidence": "0.5"}),
        "422 form": alice.post(f"/reviews/packets/{pid}/", {
            "packet_fingerprint": page_gate.packet.fingerprint, "artifact_fingerprint": page_gate.candidate_fingerprint,
            "decision": "pass", "score-clarity": "99", "score-pacing": "3", "confidence": "0.5"}),
        "400 relay": alice.post(f"/reviews/packets/{pid}/relay/", {"answer": "{not json"}),
        "422 relay": alice.post(f"/reviews/packets/{pid}/relay/", {"answer": json.dumps({"decision": "nope"})}),
    }
    expected_status = {"404 other packet": 404, "404 other relay": 404, "calibration page (not a manager)": 404,
                       "409 stale form": 409, "422 form": 422, "400 relay": 400, "422 relay": 422}
    bound = alice.post(f"/reviews/packets/{pid}/relay/", {"answer": json.dumps(verdict_for(page_gate, decision="pass"))})
    assert bound.status_code == 302
    responses["confirmation"] = alice.get(bound["Location"])
    responses["queue after"] = alice.get("/reviews/")
    for label, resp in responses.items():
        assert resp.status_code == expected_status.get(label, 200), label
        scan(label, resp.content.decode())
    # The page really shows the candidate (the scan is not vacuous).
    assert "Tonight it flickered twice" in responses["packet page"].content.decode()

    # --- the second agent reviewer ----------------------------------------------------------
    _, agent2 = agent_reviewer(project, permissions=("review", "read"))
    claim = agent2.post("/review-packets/claim")
    assert claim.json()["packet"]["id"] == agent_gate.packet.id
    api_responses = {
        "claim": claim,
        "packet json": agent2.get(f"/review-packets/{agent_gate.packet.id}"),
        "packet list": agent2.get("/review-packets"),
        "404 page packet": agent2.get(f"/review-packets/{page_gate.packet.id}"),
        "404 gate": agent2.get(f"/review-gates/{agent_gate.id}"),
        "404 transcript": agent2.get(f"/sessions/{world.writer.id}/transcript"),
        "409 stale": agent2.post(f"/review-packets/{agent_gate.packet.id}/verdicts",
                                 agent_verdict(agent_gate, packet_fingerprint="sha256:" + "0" * 64)),
        "422": agent2.post(f"/review-packets/{agent_gate.packet.id}/verdicts",
                           agent_verdict(agent_gate, scores={"clarity": 0, "pacing": 0})),
        "400": agent2.post(f"/review-packets/{agent_gate.packet.id}/verdicts", raw="{"),
        "201 verdict": agent2.post(f"/review-packets/{agent_gate.packet.id}/verdicts", agent_verdict(agent_gate)),
        "200 again": agent2.post(f"/review-packets/{agent_gate.packet.id}/verdicts", agent_verdict(agent_gate)),
        "409 conflict": agent2.post(f"/review-packets/{agent_gate.packet.id}/verdicts",
                                    agent_verdict(agent_gate, decision="pass")),
        "events": agent2.get("/events"),
    }
    statuses = {k: r.status_code for k, r in api_responses.items()}
    assert statuses == {"claim": 200, "packet json": 200, "packet list": 200, "404 page packet": 404, "404 gate": 404,
                        "404 transcript": 404, "409 stale": 409, "422": 422, "400": 400, "201 verdict": 201,
                        "200 again": 200, "409 conflict": 409, "events": 200}
    for label, resp in api_responses.items():
        scan(label, resp.content.decode())
    assert api_responses["packet json"].json()["content"]["candidate"]["content"].startswith("The lamp")

    # --- the events the review actions appended ----------------------------------------------
    review_events = list(Event.objects.filter(type__startswith="review."))
    assert {e.type for e in review_events} >= {"review.gate_opened", "review.packet_claimed", "review.verdict_bound",
                                               "review.gate_completed"}
    allowed = {"gate_id", "packet_id", "verdict_id", "assignment_id", "route", "required_verdicts", "bound_verdicts",
               "candidate_version_id", "candidate_fingerprint", "packet_fingerprint", "artifact_fingerprint",
               "verdict_fingerprint", "state", "reviewer_session_id", "handoff_id", "attempt"}
    for event in review_events:
        scan(f"event {event.type}", json.dumps(event.payload) + event.actor)
        assert set(event.payload) <= allowed, (event.type, set(event.payload) - allowed)
    # The agent gate's control-plane handoffs and their events: ids and fingerprints only.
    handoff_events = list(Event.objects.filter(type__startswith="handoff."))
    assert {e.type for e in handoff_events} >= {"handoff.created", "handoff.claimed", "handoff.result_consumed"}
    for event in handoff_events:
        scan(f"event {event.type}", json.dumps(event.payload, default=str) + event.actor)
        assert "Tonight it flickered" not in json.dumps(event.payload, default=str)
    for handoff in Handoff.objects.filter(review_assignment__packet__gate=agent_gate):
        assert handoff.params == {"review_packet_id": agent_gate.packet.id, "packet_fingerprint": agent_gate.packet.fingerprint}
        scan(f"handoff {handoff.logical_id}", json.dumps([handoff.params, handoff.inputs, handoff.result_schema]))
    assert Event.objects.filter(id__gt=first_event, type__startswith="review.").count() >= 5

    # Sanity: the markers are real and reachable by the writer — just never by a reviewer.
    assert MARKERS["transcript"] in world.writer_api.get(f"/sessions/{world.writer.id}/transcript").content.decode()
    writer_view = Api(raw2).get(f"/review-gates/{page_gate.id}").content.decode()
    assert MARKERS["other_verdict_human"] in writer_view
    assert Event.objects.filter(payload__cursor__note=MARKERS["reasoning_cursor"]).exists()
