"""``NaN``, ``Infinity``, ``-Infinity`` and ``1e999`` in a JSON body.

Python's json reads all four (``1e999`` as an infinite float); none is a JSON number and
PostgreSQL refuses to store them, so on the original code they reached the insert and came
back as a 500 (``DataError``). Every body is parsed by one function (``schemas.loads_json``):
the answer is a typed 422 ``validation_error`` naming the field's path, and nothing is written.

Schemathesis never generates these values, so the sweep below walks the OpenAPI schema itself:
every operation that takes a JSON body gets each constant in one of its declared fields.
"""
from __future__ import annotations

import json
import re
from typing import Any

import pytest

from novelforge_sessions.routers import api
from novelforge_sessions.models import Event
from tests.support.factories import Api
from tests.reviews.factories import agent_reviewer, agent_verdict, make_world
from tests.support.responses import refused
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

CONSTANTS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]
BAD = "__NON_FINITE__"


def raw_with(body: Any, literal: str) -> str:
    """``body`` as JSON text with the placeholder string replaced by the bare ``literal``."""
    text = json.dumps(body)
    assert f'"{BAD}"' in text
    return text.replace(f'"{BAD}"', literal)


@pytest.mark.parametrize("literal", CONSTANTS)
def test_the_routes_the_issue_names_refuse_non_finite_numbers_by_field(owner, new_session, literal):
    running = new_session(run=True)
    run_id = running["run"]["id"]
    idle = new_session()
    cases = [
        ("/sessions", {**{"role": "writer", "memory_policy": "bounded", "task_mode": "drafting",
                          "runtime_family": "claude-code"}, "provider_metadata": {"temperature": BAD}},
         "provider_metadata.temperature"),
        (f"/sessions/{idle['id']}/runs", {"cursor": {"step": "a", "progress": BAD}}, "cursor.progress"),
        (f"/sessions/{idle['id']}/runs", {"cursor": {"step": "a"}, "frozen_inputs": [{"weight": BAD}]},
         "frozen_inputs[0].weight"),
        (f"/runs/{run_id}/cursor", {"cursor": {"step": "b", "scores": [1, BAD]}}, "cursor.scores[1]"),
        (f"/runs/{run_id}/checkpoints", {"boundary": "context_freeze", "cursor": {"step": "a", "x": BAD}}, "cursor.x"),
        (f"/runs/{run_id}/handoffs", {"logical_id": "job-nan", "params": {"threshold": BAD}}, "params.threshold"),
        (f"/runs/{run_id}/handoffs", {"logical_id": "job-nan", "timeout_seconds": BAD}, "timeout_seconds"),
    ]
    before = snapshot()
    for path, body, field in cases:
        refused(owner.post(path, raw=raw_with(body, literal)),
                422, "validation_error", field, details_has={"value": literal}, message="finite")
    assert snapshot() == before


@pytest.mark.parametrize("literal", CONSTANTS)
def test_a_bare_non_finite_body_is_refused_as_the_body(owner, literal):
    events = Event.objects.count()
    refused(owner.post("/sessions", raw=literal),
            422, "validation_error", "body", details_has={"value": literal}, message="finite")
    assert Event.objects.count() == events


def _body_operations() -> list[tuple[str, str, str]]:
    """(method, path, a declared body field) for every operation of the schema with a JSON body."""
    schema = api.get_openapi_schema()
    components = schema.get("components", {}).get("schemas", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = components[node["$ref"].rsplit("/", 1)[1]]
        return node

    ops = []
    for path, item in schema["paths"].items():
        for method, op in item.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body is None:
                continue
            props = resolve(body.get("schema", {})).get("properties") or {"x": {}}
            ops.append((method.upper(), path, sorted(props)[0]))
    return ops


BODY_OPERATIONS = _body_operations()


def test_the_sweep_covers_every_operation_with_a_body():
    assert len(BODY_OPERATIONS) >= 20, BODY_OPERATIONS
    assert ("POST", "/api/v1/review-packets/{packet_id}/verdicts") in {(m, p) for m, p, _ in BODY_OPERATIONS}


@pytest.mark.parametrize("literal", CONSTANTS)
def test_every_operation_with_a_body_refuses_non_finite_numbers(project, owner, literal):
    """Walks the OpenAPI schema: each bad constant in a declared field of every body is a 422
    naming that field — never a 5xx, and nothing is written. Ids point at real rows where it
    matters (the reviewer's packet) and at 1 elsewhere: the body is parsed before any lookup."""
    world = make_world(project)
    gate = world.gate(route="agent", required_verdicts=1)
    reviewer, reviewer_api = agent_reviewer(project)
    claimed = reviewer_api.post("/review-packets/claim", {"worker": "w"})
    assert claimed.status_code == 200, claimed.content
    before = snapshot()
    for method, path, field in BODY_OPERATIONS:
        client = reviewer_api if path.startswith("/api/v1/review-packets") else owner
        url = re.sub(r"\{packet_id\}", str(gate.packet.id), path)
        url = re.sub(r"\{[a-z_]+\}", "1", url)
        raw = raw_with({field: BAD}, literal)
        resp = client.client.generic(method, url, raw, content_type="application/json", **client._headers())
        assert resp.status_code < 500, (method, path, resp.content)
        refused(resp, 422, "validation_error", field, details_has={"value": literal}, message="finite")
    assert snapshot() == before


@pytest.mark.parametrize("literal", CONSTANTS)
def test_a_verdict_with_a_non_finite_score_names_the_score(project, literal):
    """The verdict route parses its body by hand: the same parser, the same refusal."""
    world = make_world(project)
    gate = world.gate(route="agent", required_verdicts=1)
    _, reviewer_api = agent_reviewer(project)
    assert reviewer_api.post("/review-packets/claim", {"worker": "w"}).status_code == 200
    body = agent_verdict(gate)
    body["scores"]["pacing"] = BAD
    before = snapshot()
    resp = reviewer_api.post(f"/review-packets/{gate.packet.id}/verdicts", raw=raw_with(body, literal))
    refused(resp, 422, "validation_error", "scores.pacing", details_has={"value": literal}, message="finite")
    assert snapshot() == before


def test_finite_numbers_still_pass(owner, new_session):
    s = new_session()
    resp = owner.post(f"/sessions/{s['id']}/runs", raw='{"cursor": {"step": "a", "p": 1e308, "q": -0.5, "r": 12}}')
    assert resp.status_code == 201, resp.content
    assert resp.json()["cursor"]["p"] == 1e308


def test_the_reviewer_page_paste_back_refuses_non_finite_numbers(project):
    """The relay paste-back parses pasted JSON with the same parser: a page that says which field."""
    from django.test import Client

    from reviews.models import Verdict

    world = make_world(project)
    gate = world.gate(route="relay", reviewers=["alice"])
    client = Client()
    client.force_login(world.users["alice"])
    body = {**{k: v for k, v in agent_verdict(gate).items() if k != "fencing_token"}, "confidence": BAD}
    before = snapshot()
    resp = client.post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": raw_with(body, "NaN")})
    assert resp.status_code == 422, resp.status_code
    assert b"confidence" in resp.content and b"finite" in resp.content
    assert snapshot() == before and Verdict.objects.count() == 0


def test_an_api_client_sees_the_refusal_shape(owner):
    resp = Api(owner.token).post("/sessions", raw='{"provider_metadata": {"a": NaN}}')
    refused(resp, 422, "validation_error", "provider_metadata.a", details_has={"value": "NaN"}, message="finite")
