"""Review bodies are refused at the limits the schema declares (audit finding 11): gates
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
from tests.reviews.factories import RUBRIC, World, agent_reviewer, agent_verdict

pytestmark = pytest.mark.django_db


def gate_body(world: World, **over: Any) -> dict[str, Any]:
    return {"candidate_version_id": world.version.id, "rubric": RUBRIC, "route": "page", "reviewers": ["alice"], **over}


def anchored(label: str) -> dict[str, Any]:
    rubric = copy.deepcopy(RUBRIC)
    rubric["criteria"][0]["anchors"] = {"1": label}
    return rubric


def refused(resp, field: str) -> dict[str, Any]:
    assert resp.status_code == 422, resp.content
    err = resp.json()["error"]
    assert err["code"] == "validation_error" and err["details"]["field"] == field, err
    return err


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
    refused(world.writer_api.post(f"/sessions/{world.writer.id}/review-gates", gate_body(world, **over)), field)
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
    refused(reviewer.post(f"/review-packets/{gate.packet.id}/verdicts", body), field)
    assert not Verdict.objects.exists() and not ResultDelivery.objects.exists()
    gate.refresh_from_db()
    assert gate.state == "pending"
