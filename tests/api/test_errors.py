"""Bad input gets a clear, typed 4xx in one shape; never a 500, never half a write."""
from __future__ import annotations

import json

import pytest

from novelforge_sessions.models import Event, Session

from tests.conftest import SESSION

pytestmark = pytest.mark.django_db


def assert_error(resp, status: int, code: str) -> dict:
    assert resp.status_code == status, resp.content
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code and body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize("raw", ["{bad", "[1,2", "\x00\x01", '{"role": "writer",}', "null]"])
def test_malformed_json_is_400(owner, raw):
    assert_error(owner.post("/sessions", raw=raw), 400, "malformed_body")
    assert Session.objects.count() == 0


def test_oversized_body_is_413_before_parsing(owner, settings):
    big = json.dumps({**SESSION, "provider_metadata": {"blob": "x" * (settings.API_MAX_BODY_BYTES + 10)}})
    err = assert_error(owner.post("/sessions", raw=big), 413, "payload_too_large")
    assert err["details"]["limit"] == settings.API_MAX_BODY_BYTES
    assert Session.objects.count() == 0


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
    err = assert_error(owner.post("/sessions", body), 422, "validation_error")
    assert err["details"]["field"] == field
    assert Session.objects.count() == 0


def test_wrong_types_in_path_and_query_are_422(owner):
    assert_error(owner.get("/sessions/abc"), 422, "validation_error")
    assert_error(owner.get("/sessions", limit="many"), 422, "validation_error")


def test_unknown_transition_target_is_422(owner, new_session):
    s = new_session()
    err = assert_error(owner.post(f"/sessions/{s['id']}/transition", {"to": "paused"}), 422, "validation_error")
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
