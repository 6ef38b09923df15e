"""What a JSON body may hold, as RFC 8259 and docs/api.md say.

Each rule is a typed refusal that writes nothing: numbers the service would not store as written
(an integer beyond a double's range, a non-zero number that rounds to 0), duplicate keys at any
depth, and a body sent as another media type or encoding. Before, each of these wrote a
checkpoint (or, past 4,300 digits, was an untyped "not valid JSON").
"""
from __future__ import annotations

import json
import re
import sys

import pytest

from novelforge_sessions.routers import api
from novelforge_sessions.models import Checkpoint
from tests.api.test_non_finite import BODY_OPERATIONS
from tests.reviews.factories import agent_reviewer, make_world
from tests.support.responses import refused
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

BOUNDARY = '"boundary": "context_freeze"'


def post_raw(client, path: str, raw: str | bytes, content_type: str = "application/json"):
    return client.client.generic("POST", f"/api/v1{path}", raw, content_type=content_type, **client._headers())


def test_integers_beyond_a_doubles_range_and_numbers_that_round_to_zero_are_refused_by_field(owner, new_session):
    run_id = new_session(run=True)["run"]["id"]
    path = f"/runs/{run_id}/checkpoints"
    largest = int(sys.float_info.max)  # 309 digits: the largest integer within a double's range
    before = snapshot()
    for literal in ("9" * 4300, "9" * 5000, "-" + "9" * 5000, str(largest + 1), "1" + "0" * 309, "1e-999", "-2.5e-400"):
        err = refused(owner.post(path, raw=f'{{{BOUNDARY}, "cursor": {{"step": "s", "a": {literal}}}}}'),
                      422, "validation_error", "cursor.a")
        assert err["details"]["value"] == literal[:40]
        assert "finite" in err["message"]
    assert snapshot() == before
    for literal, stored in ((str(largest), largest), (str(-largest), -largest), ("5e-324", 5e-324), ("0e-999", 0.0),
                            ("-0.0", 0.0)):
        resp = owner.post(path, raw=f'{{{BOUNDARY}, "cursor": {{"step": "s", "a": {literal}}}}}')
        assert resp.status_code == 201, (literal, resp.content)
        assert Checkpoint.objects.get(id=resp.json()["id"]).cursor["a"] == stored


def test_duplicate_keys_at_any_depth_are_refused_naming_the_key_path(owner, new_session):
    run_id = new_session(run=True)["run"]["id"]
    cases = [
        (f"/runs/{run_id}/checkpoints", '{"boundary": "context_freeze", "boundary": "user_wait", "cursor": {"s": 1}}',
         "boundary"),
        (f"/runs/{run_id}/checkpoints", f'{{{BOUNDARY}, "cursor": {{"a": 1, "a": 2}}}}', "cursor.a"),
        (f"/runs/{run_id}/checkpoints", f'{{{BOUNDARY}, "cursor": {{"s": [{{"k": 1}}, {{"k": 1, "k": 1}}]}}}}',
         "cursor.s[1].k"),
        (f"/runs/{run_id}/batch",
         f'{{"items": [{{"kind": "checkpoint", "checkpoint": {{{BOUNDARY}, "cursor": {{"s": 1}}, "cursor": {{"s": 2}}}}}}]}}',
         "items[0].checkpoint.cursor"),
        ("/handoffs/999999/results", '{"result": {"v": "x", "v": 5}}', "result.v"),
    ]
    before = snapshot()
    for path, raw, field in cases:
        json.loads(raw)  # valid JSON to Python (the last key wins): the service must not guess
        err = refused(owner.post(path, raw=raw), 422, "validation_error", field)
        assert err["details"]["key"] == field.rsplit(".", 1)[-1].split("[")[0], err
    assert snapshot() == before


@pytest.mark.parametrize("content_type", [
    "text/plain", "application/x-www-form-urlencoded", "application/jsonx", "application/json; charset=latin-1",
    "application/json; charset=utf-16", "multipart/form-data; boundary=x", "application/json; version=2",
    "application/octet-stream",
])
def test_a_body_sent_as_another_media_type_is_415(owner, new_session, content_type):
    run_id = new_session(run=True)["run"]["id"]
    raw = json.dumps({"boundary": "context_freeze", "cursor": {"step": "s"}})
    before = snapshot()
    err = refused(post_raw(owner, f"/runs/{run_id}/checkpoints", raw, content_type), 415, "unsupported_media_type")
    assert err["details"]["content_type"] == content_type
    assert snapshot() == before


def test_json_without_a_content_type_or_with_charset_utf8_is_accepted(owner, new_session):
    run_id = new_session(run=True)["run"]["id"]
    raw = json.dumps({"boundary": "context_freeze", "cursor": {"step": "s"}})
    for content_type in ("", "application/json", "Application/JSON", "application/json; charset=utf-8",
                         'application/json;charset="UTF-8"'):
        resp = post_raw(owner, f"/runs/{run_id}/checkpoints", raw, content_type)
        assert resp.status_code == 201, (content_type, resp.content)


def test_a_body_that_is_not_utf8_or_starts_with_a_bom_is_malformed(owner, new_session):
    run_id = new_session(run=True)["run"]["id"]
    text = json.dumps({"boundary": "context_freeze", "cursor": {"step": "é"}}, ensure_ascii=False)
    before = snapshot()
    for raw in (b"\xef\xbb\xbf" + text.encode(), text.encode("utf-16"), text.encode("utf-16-le"),
                text.encode("utf-32"), text.encode("latin-1")):
        refused(owner.post(f"/runs/{run_id}/checkpoints", raw=raw), 400, "malformed_body")
    assert snapshot() == before
    assert owner.post(f"/runs/{run_id}/checkpoints", raw=text.encode()).status_code == 201


def test_every_operation_with_a_body_refuses_another_media_type(project, owner):
    """The OpenAPI sweep of test_non_finite: each body sent as text/plain is a 415 (declared), the
    hand-parsed verdict route included."""
    world = make_world(project)
    gate = world.gate(route="agent", required_verdicts=1)
    _, reviewer_api = agent_reviewer(project)
    assert reviewer_api.post("/review-packets/claim", {"worker": "w"}).status_code == 200
    schema = api.get_openapi_schema()
    before = snapshot()
    for method, path, field in BODY_OPERATIONS:
        client = reviewer_api if path.startswith("/api/v1/review-packets") else owner
        url = re.sub(r"\{[a-z_]+\}", "1", re.sub(r"\{packet_id\}", str(gate.packet.id), path))
        resp = client.client.generic(method, url, json.dumps({field: 1}), content_type="text/plain", **client._headers())
        refused(resp, 415, "unsupported_media_type")
        assert 415 in schema["paths"][path][method.lower()]["responses"], (method, path)
    assert snapshot() == before
