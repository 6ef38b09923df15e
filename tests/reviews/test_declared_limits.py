"""Review bodies are refused at the limits the schema declares: gates
(reviewers, evidence, answer key, anchor labels) and verdicts (fencing token, findings, notes,
locations). Each refusal is a typed 422 naming the field; nothing is opened or bound."""
from __future__ import annotations

import copy
from typing import Any

import pytest

from novelforge_sessions.actions.lifecycle import BIGINT_MAX
from novelforge_sessions.control.models import ResultDelivery
from reviews import actions, packets
from reviews.models import ReviewGate, Verdict
from tests.api.declared import declared_valid
from tests.reviews.factories import RUBRIC, World, agent_reviewer, agent_verdict
from tests.support.responses import refused

pytestmark = pytest.mark.django_db


def gate_body(world: World, **over: Any) -> dict[str, Any]:
    return {"candidate_version_id": world.version.id, "rubric": RUBRIC, "route": "page", "reviewers": ["alice"], **over}


def anchored(label: str) -> dict[str, Any]:
    rubric = copy.deepcopy(RUBRIC)
    rubric["criteria"][0]["anchors"] = {"1": label}
    return rubric


EVIDENCE = {"key": "style_guide", "label": "House style", "content": "Short sentences."}


@pytest.mark.parametrize(("over", "field"), [
    ({"reviewers": [f"r{i}" for i in range(actions.MAX_REVIEWERS + 1)]}, "reviewers"),
    ({"evidence": [EVIDENCE] * (packets.MAX_EVIDENCE_ITEMS + 1)}, "evidence"),
    ({"calibration": {"answer_key": "x" * (actions.MAX_ANSWER_KEY + 1)}}, "calibration.answer_key"),
    ({"rubric": anchored("x" * (packets.MAX_ANCHOR + 1))}, "rubric.criteria[0].anchors.1"),
    # measured as sent: padding does not make a long label fit
    ({"rubric": anchored("x" * packets.MAX_ANCHOR + "  ")}, "rubric.criteria[0].anchors.1"),
])
def test_gate_limits_are_refused_and_open_nothing(world, over, field):
    refused(world.writer_api.post(f"/sessions/{world.writer.id}/review-gates", gate_body(world, **over)),
            422, "validation_error", field)
    assert not ReviewGate.objects.exists()
    world.refresh()
    assert world.writer.status == "running"


def test_an_anchor_label_at_its_limit_is_accepted(world):
    resp = world.writer_api.post(f"/sessions/{world.writer.id}/review-gates",
                                 gate_body(world, rubric=anchored("x" * packets.MAX_ANCHOR)))
    assert resp.status_code == 201, resp.content


def finding(**over: Any) -> dict[str, Any]:
    return {"location": "L1", "severity": "minor", "note": "vague", **over}


@pytest.mark.parametrize(("over", "field"), [
    ({"fencing_token": BIGINT_MAX + 1}, "fencing_token"),
    ({"findings": [finding()] * (packets.MAX_FINDINGS + 1)}, "findings"),
    ({"findings": [finding(note="n" * (packets.MAX_NOTE + 1))]}, "findings[0].note"),
    ({"findings": [finding(location="L1" + " " * packets.MAX_LOCATION)]}, "findings[0].location"),
])
def test_verdict_limits_are_refused_and_bind_nothing(world, over, field):
    gate = world.gate(route="agent")
    _, reviewer = agent_reviewer(world.project)
    lease = reviewer.post("/review-packets/claim").json()["lease"]
    body = {**agent_verdict(gate, lease["fencing_token"]), **over}
    refused(reviewer.post(f"/review-packets/{gate.packet.id}/verdicts", body), 422, "validation_error", field)
    assert not Verdict.objects.exists() and not ResultDelivery.objects.exists()
    gate.refresh_from_db()
    assert gate.state == "pending"


# ---- declared = enforced, both directions ---------------------------
def open_gate(world: World, body: dict[str, Any]):
    return world.writer_api.post(f"/sessions/{world.writer.id}/review-gates", body)


def agent_body(world: World, **over: Any) -> dict[str, Any]:
    return {"candidate_version_id": world.version.id, "rubric": RUBRIC, "route": "agent", **over}


def assert_nothing_opened(world: World) -> None:
    assert not ReviewGate.objects.exists()
    world.refresh()
    assert world.writer.status == "running"


@pytest.mark.parametrize(("required", "accepted"), [
    (actions.MAX_AGENT_VERDICTS, True), (actions.MAX_AGENT_VERDICTS + 1, False), (actions.MAX_REVIEWERS, False),
])
def test_the_agent_routes_verdict_count_is_declared_as_enforced(world, required, accepted):
    """`required_verdicts` was declared 1..20 for every route, but the agent route takes
    at most MAX_AGENT_VERDICTS. The schema now says so for that route (if/then)."""
    body = agent_body(world, required_verdicts=required)
    assert declared_valid("GateIn", body) is accepted
    resp = open_gate(world, body)
    if accepted:
        assert resp.status_code == 201, resp.content
        assert resp.json()["required_verdicts"] == required
    else:
        refused(resp, 422, "validation_error", "required_verdicts")
        assert_nothing_opened(world)
    # page and relay routes keep the higher bound (up to the number of reviewers they name)
    assert declared_valid("GateIn", gate_body(world, required_verdicts=actions.MAX_REVIEWERS,
                                              reviewers=[f"r{i}" for i in range(actions.MAX_REVIEWERS)]))


def test_too_many_reviewer_sessions_are_refused_naming_them(world):
    """11 reviewer sessions were refused as "required_verdicts must be from 11 to 10",
    naming a field the body did not send. Declared (maxItems) and refused naming the list."""
    ids = [agent_reviewer(world.project)[0].id for _ in range(actions.MAX_AGENT_VERDICTS + 1)]
    body = agent_body(world, reviewer_session_ids=ids)
    assert not declared_valid("GateIn", body)
    err = refused(open_gate(world, body), 422, "validation_error", "reviewer_session_ids")
    assert f"at most {actions.MAX_AGENT_VERDICTS} reviewer sessions" in err["message"]
    assert "required_verdicts" not in err["message"]
    assert_nothing_opened(world)
    within = agent_body(world, reviewer_session_ids=ids[:actions.MAX_AGENT_VERDICTS])
    assert declared_valid("GateIn", within)
    assert open_gate(world, within).status_code == 201


@pytest.mark.parametrize(("over", "field"), [
    ({"reviewer_session_ids": [1]}, "reviewer_session_ids"),  # page route: users, not sessions
    ({"reviewers": []}, "reviewers"),                          # page route: at least one user
])
def test_each_routes_reviewers_are_declared_as_enforced(world, over, field):
    body = gate_body(world, **over)
    assert not declared_valid("GateIn", body)
    refused(open_gate(world, body), 422, "validation_error", field)
    assert_nothing_opened(world)
    body = agent_body(world, reviewers=["alice"])  # agent route: sessions, not users
    assert not declared_valid("GateIn", body)
    refused(open_gate(world, body), 422, "validation_error", "reviewers")


def with_evidence(world: World, **item: Any) -> dict[str, Any]:
    return gate_body(world, evidence=[{**EVIDENCE, **item}])


def with_criterion(world: World, **criterion: Any) -> dict[str, Any]:
    rubric = copy.deepcopy(RUBRIC)
    rubric["criteria"][0].update(criterion)
    return gate_body(world, rubric=rubric)


@pytest.mark.parametrize(("make", "field"), [
    # counted in bytes: under maxLength in characters, over in bytes (x-max-bytes)
    (lambda w: with_evidence(w, content="é" * (packets.MAX_EVIDENCE_BYTES // 2 + 1)), "evidence[0].content"),
    (lambda w: with_evidence(w, label=""), "evidence[0].label"),
    (lambda w: with_evidence(w, label="   "), "evidence[0].label"),
    (lambda w: with_evidence(w, content=""), "evidence[0].content"),
    (lambda w: with_evidence(w, content=" \n\t "), "evidence[0].content"),
    (lambda w: with_criterion(w, label="  "), "rubric.criteria[0].label"),
    (lambda w: with_criterion(w, anchors={"good": "Good"}), "rubric.criteria[0].anchors.good"),
    (lambda w: with_criterion(w, anchors={"1": " "}), "rubric.criteria[0].anchors.1"),
])
def test_gate_rules_that_were_enforced_but_not_declared_are_declared(world, make, field):
    """Bodies the schema called valid were refused by rules it did not state (evidence
    counted in bytes, blank labels and content, anchor keys that are no score). Now each is
    declared invalid and refused, naming the field; nothing is opened."""
    body = make(world)
    assert not declared_valid("GateIn", body), body
    refused(open_gate(world, body), 422, "validation_error", field)
    assert_nothing_opened(world)


def test_evidence_at_its_byte_bound_is_declared_valid_and_accepted(world):
    body = with_evidence(world, content="é" * (packets.MAX_EVIDENCE_BYTES // 2))
    assert declared_valid("GateIn", body)
    assert open_gate(world, body).status_code == 201


def test_a_scale_span_is_a_cross_field_rule_stated_in_words(world):
    """``max - min <= MAX_SCALE_SPAN`` compares two fields, which JSON Schema cannot state: the
    schema says it in ScaleIn's description (the gate route is among the fuzz's exemptions for
    rules of that kind: tests/api/test_fuzz.py)."""
    from tests.api.declared import served

    assert f"max - min <= {packets.MAX_SCALE_SPAN}" in served()["components"]["schemas"]["ScaleIn"]["description"]
    body = with_criterion(world, scale={"min": 0, "max": packets.MAX_SCALE_SPAN + 1})
    refused(open_gate(world, body), 422, "validation_error", "rubric.criteria[0].scale.max")
    assert_nothing_opened(world)


def test_a_gate_whose_fields_are_each_within_their_maxima_can_be_over_the_body_limit():
    """10 evidence items of 30,000 characters are each within their maxima, and the body
    is over API_MAX_BODY_BYTES. That 413 is declared for the route, the limit is stated on its
    body (`x-max-body-bytes`), and the evidence field says its items do not all fit at their
    maximum (the choice docs/deployment.md states: the body limit stays the one combined bound)."""
    import json

    from django.conf import settings

    from tests.api.declared import served

    keys = [f"e{i}" for i in range(packets.MAX_EVIDENCE_ITEMS)]
    body = {"candidate_version_id": 1, "route": "page", "reviewers": ["alice"],
            "rubric": {"criteria": RUBRIC["criteria"], "evidence": keys},
            "evidence": [{"key": k, "label": k, "content": "x" * 30_000} for k in keys]}
    assert declared_valid("GateIn", body)
    assert len(json.dumps(body)) > settings.API_MAX_BODY_BYTES
    op = served()["paths"]["/api/v1/sessions/{session_id}/review-gates"]["post"]
    assert "413" in op["responses"] and op["requestBody"]["x-max-body-bytes"] == settings.API_MAX_BODY_BYTES
    assert "x-max-body-bytes" in served()["components"]["schemas"]["GateIn"]["properties"]["evidence"]["description"]
    verdict = served()["paths"]["/api/v1/review-packets/{packet_id}/verdicts"]["post"]
    assert "x-max-body-bytes" in verdict["requestBody"]["content"]["application/json"]["schema"][
        "properties"]["findings"]["description"]
