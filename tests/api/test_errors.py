"""Bad input gets a clear, typed 4xx in one shape; never a 500, never half a write."""
from __future__ import annotations

import pytest

from novelforge_sessions.models import Event, Run, Session

from tests.support.factories import SESSION
from tests.support.responses import refused

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("raw", ["{bad", "[1,2", "\x00\x01", '{"role": "writer",}', "null]"])
def test_malformed_json_is_400(owner, raw):
    refused(owner.post("/sessions", raw=raw), 400, "malformed_body")
    assert Session.objects.count() == 0


# Oversized bodies (413 payload_too_large, refused while they stream in, before Django):
# tests/api/test_body_limit.py (the ASGI layer) and tests/live/test_body_limits.py (real servers).


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**SESSION, "role": "boss"}, "role"),
        ({**SESSION, "memory_policy": "forever"}, "memory_policy"),
        ({k: v for k, v in SESSION.items() if k != "task_mode"}, "task_mode"),
        ({**SESSION, "task_mode": "Has Spaces"}, "task_mode"),
        ({**SESSION, "surprise": 1}, "surprise"),
        ({**SESSION, "provider_metadata": {"x": "y" * 9000}}, "provider_metadata"),
        ({**SESSION, "runtime": {"runtime_family": "cli", "lease_seconds": 0}}, "runtime.lease_seconds"),
        ({**SESSION, "runtime": {"runtime_family": "cli", "capabilities": ["OK?"]}}, "capabilities"),
    ],
)
def test_validation_errors_name_the_field(owner, body, field):
    err = refused(owner.post("/sessions", body), 422, "validation_error")
    assert err["details"]["field"] == field
    assert Session.objects.count() == 0


def test_a_schema_refusal_says_what_the_value_broke_in_its_message(owner):
    """The message names the field and the rule, in words a reader can act on (not only in details)."""
    err = refused(owner.post("/sessions", {**SESSION, "task_mode": "t" * 65}), 422, "validation_error")
    assert err["message"] == f"invalid value for task_mode: {err['details']['errors'][0]['message']}"
    assert "at most 64 characters" in err["message"]
    assert Session.objects.count() == 0


def test_wrong_types_in_path_and_query_are_422(owner):
    refused(owner.get("/sessions/abc"), 422, "validation_error")
    refused(owner.get("/sessions", limit="many"), 422, "validation_error")


def test_unknown_transition_target_is_422(owner, new_session):
    s = new_session()
    err = refused(owner.post(f"/sessions/{s['id']}/transition", {"to": "paused"}), 422, "validation_error")
    assert err["details"]["field"] == "to"


def test_bad_inputs_never_500(owner, new_session):
    """A sweep of odd bodies over every write route: all answered with a typed 4xx."""
    s = new_session(run=True)
    paths = [
        "/sessions", f"/sessions/{s['id']}/transition", f"/sessions/{s['id']}/close", f"/sessions/{s['id']}/abort",
        f"/sessions/{s['id']}/resume", f"/sessions/{s['id']}/runtimes", f"/sessions/{s['id']}/runs",
        f"/sessions/{s['id']}/transcript", f"/runs/{s['run']['id']}/cursor", f"/runs/{s['run']['id']}/end",
        f"/runs/{s['run']['id']}/checkpoints", "/artifacts",
    ]
    bodies = ["[]", '"text"', "123", '{"to": null}', '{"cursor": "flat"}', '{"boundary": 7, "cursor": []}',
              '{"runtime": "cli"}', '{"outcome": "won"}', '{"content": 5}']
    events = Event.objects.count()
    for path in paths:
        for raw in bodies:
            resp = owner.post(path, raw=raw)
            assert 400 <= resp.status_code < 500 or resp.status_code in (200, 201), (path, raw, resp.content)
            assert resp.status_code != 500
            if resp.status_code >= 400:
                assert "code" in resp.json()["error"], (path, raw)
    # Only the bodies valid for close/abort (which accept an empty-ish body) could have written.
    assert Event.objects.count() - events <= 4


# ---- found by the schema fuzz (tests/api/test_fuzz.py) ------------------------------------------
def test_a_method_a_path_does_not_serve_is_405_in_the_one_shape(owner):
    resp = owner.client.put("/api/v1/sessions", "{}", content_type="application/json", **owner._headers())
    err = refused(resp, 405, "method_not_allowed")
    assert err["details"]["allowed"] == ["GET", "POST"]
    assert resp["Allow"] == "GET, POST" and resp["Content-Type"].startswith("application/json")
    refused(owner.delete("/project"), 405, "method_not_allowed")


@pytest.mark.parametrize(
    ("path", "raw", "field"),
    [
        ("/transition", '{"to": "idle", "expected_version": "1"}', "expected_version"),
        ("/transition", '{"to": "idle", "expected_version": true}', "expected_version"),
        ("/resume", '{"runtime": {"runtime_family": "cli"}, "dry_run": "true"}', "dry_run"),
        ("/runtimes", '{"runtime_family": "cli", "lease_seconds": 60.5}', "lease_seconds"),
        ("/runtimes", '{"runtime_family": "cli", "lease_seconds": "60"}', "lease_seconds"),
    ],
)
def test_json_values_are_not_coerced_into_the_declared_type(owner, new_session, path, raw, field):
    """The schema says integer/boolean: `"1"`, `true`, `"true"`, `60.5` are refused, not coerced.
    (`60.0` is the integer 60 to JSON Schema, so an integer field takes it: see below.)"""
    s = new_session()
    events = Event.objects.count()
    err = refused(owner.post(f"/sessions/{s['id']}{path}", raw=raw), 422, "validation_error")
    assert err["details"]["field"] == field
    assert Event.objects.count() == events


def test_an_integral_number_is_the_integer_json_schema_says_it_is(owner, new_session):
    """Schemathesis (and any JSON Schema validator) counts 60.0 as an integer: the API agrees."""
    s = new_session()
    resp = owner.post(f"/sessions/{s['id']}/transition", raw='{"to": "idle", "expected_version": 1.0}')
    assert resp.status_code in (200, 409), resp.content  # parsed as 1, not refused as a float
    assert resp.status_code != 422


@pytest.mark.parametrize(
    ("path", "raw", "field"),
    [
        ("/transcript", '{"role": "user", "content": "a\\u0000b"}', "content"),
        ("/transcript", '{"role": "user", "content": "\\ud800"}', "content"),  # an unpaired surrogate
        ("/transition", '{"to": "idle", "reason": "\\u0000"}', "reason"),
        ("/runtimes", '{"runtime_family": "cli", "provider_metadata": {"a": ["ok", "\\u0000"]}}',
         "provider_metadata.a[1]"),
        ("/runtimes", '{"runtime_family": "cli", "provider_metadata": {"k\\u0000": 1}}', "provider_metadata.k\\x00"),
    ],
)
def test_text_postgres_cannot_store_is_422_not_500(owner, new_session, path, raw, field):
    s = new_session(attach=False)
    events = Event.objects.count()
    err = refused(owner.post(f"/sessions/{s['id']}{path}", raw=raw), 422, "validation_error")
    assert err["details"]["field"] == field
    assert Event.objects.count() == events


def test_a_nul_in_a_query_filter_is_422_not_500(owner, new_session):
    new_session()
    assert refused(owner.get("/events", type="a\x00b"), 422, "validation_error")["details"]["field"] == "type"
    assert refused(owner.get("/sessions", role="\x00"), 422, "validation_error")["details"]["field"] == "role"


def test_a_close_reason_longer_than_the_runtime_end_reason_is_422_not_500(owner, new_session):
    """The reason is stored as the runtime's end_reason (64 characters): the schema says so."""
    s = new_session(run=True)
    err = refused(owner.post(f"/sessions/{s['id']}/close", {"reason": "x" * 65}), 422, "validation_error")
    assert err["details"]["field"] == "reason"
    assert Session.objects.get(id=s["id"]).status == "running"
    closed = owner.post(f"/sessions/{s['id']}/close", {"reason": "x" * 64})
    assert closed.status_code == 200 and closed.json()["session"]["status"] == "idle"


def test_a_body_nested_too_deep_to_store_is_400_not_500(owner, new_session):
    """~900 levels still parse, but could not be re-encoded for storage (a RecursionError)."""
    s = new_session(run=True)
    deep = "[" * 900 + "]" * 900
    err = refused(owner.post(f"/runs/{s['run']['id']}/cursor", raw='{"cursor": {"a": %s}}' % deep),
                       400, "malformed_body")
    assert err["details"] == {"max_depth": 100}
    assert Run.objects.get(id=s["run"]["id"]).cursor == {"step": "start"}


@pytest.mark.parametrize("path", ["/api/v1/nope", "/api/v1/sessions/1/nope", "/api/v1/sessions/a%2Fb", "/api/"])
def test_a_path_no_api_route_serves_is_404_in_the_one_shape(owner, path):
    for resp in (owner.client.get(path, **owner._headers()),
                 owner.client.post(path, "{}", content_type="application/json", **owner._headers())):
        assert resp["Content-Type"].startswith("application/json")
        assert refused(resp, 404, "not_found")["details"]["path"] == resp.wsgi_request.path


def test_query_values_postgres_cannot_take_are_answered_not_500(owner, new_session):
    """An outside check found three 500s in query strings: a session filter beyond bigint on the
    event log, NUL or a lone surrogate inside the graph checkpoints' ``metadata`` JSON, and more
    query parameters than Django parses."""
    s = new_session()
    for session_id in (2**63, -(2**63) - 1, 10**30):
        resp = owner.get("/events", session_id=session_id)
        assert resp.status_code == 200 and resp.json()["items"] == [], resp.content
    assert owner.get("/events", session_id=s["id"]).json()["items"]  # a real one still filters
    for metadata, field in (('{"a": "\\u0000"}', "metadata.a"), ('{"\\u0000": 1}', "metadata"),
                            ('{"a": "\\ud800"}', "metadata.a")):
        err = refused(owner.get("/graph-threads/checkpoints", thread_id="t", metadata=metadata), 422,
                           "validation_error")
        assert err["details"]["field"].startswith(field), err
    events = Event.objects.count()
    resp = owner.client.get("/api/v1/sessions?" + "&".join(["a=1"] * 1001), **owner._headers())
    err = refused(resp, 400, "http_error")
    assert "too many query parameters" in err["message"]
    assert Event.objects.count() == events
