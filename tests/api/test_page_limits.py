"""Every list route declares ``limit`` as 1..MAX_PAGE and refuses anything else with the typed
422: out of range is refused, never clamped; enum-like filters are
enums in the schema and refused like ``status``."""
from __future__ import annotations

import pytest
from django.test import Client

from novelforge_sessions.apikit.schemas import MAX_PAGE
from novelforge_sessions.control.models import Handoff, WriteIntent
from novelforge_sessions.models import Session

pytestmark = pytest.mark.django_db


def served_schema() -> dict:
    return Client().get("/api/openapi.json").json()


def list_routes(schema: dict) -> list[str]:
    """GET operations answering a page (``Page_…``) or taking a ``limit``."""
    found = []
    for path, item in schema["paths"].items():
        op = item.get("get")
        if op is None:
            continue
        ok = op["responses"].get("200", {}).get("content", {}).get("application/json", {}).get("schema", {})
        pages = ok.get("$ref", "").rsplit("/", 1)[-1].startswith("Page_")
        if pages or any(p["name"] == "limit" for p in op.get("parameters", [])):
            found.append(path)
    return found


def test_every_list_route_declares_its_limit_bounds():
    schema = served_schema()
    routes = list_routes(schema)
    assert len(routes) >= 15  # sessions, runs, checkpoints, events, handoffs, …: the walk found them
    for path in routes:
        params = {p["name"]: p for p in schema["paths"][path]["get"].get("parameters", [])}
        assert "limit" in params, f"{path} pages without a limit"
        limit = params["limit"]["schema"]
        assert (limit["type"], limit["minimum"], limit["maximum"]) == ("integer", 1, MAX_PAGE), path
        assert 1 <= limit["default"] <= MAX_PAGE, path


@pytest.mark.parametrize("limit", [0, -5, MAX_PAGE + 1, 100_000])
def test_out_of_range_limits_are_refused_on_every_list_route(owner, limit):
    schema = served_schema()
    for path in list_routes(schema):
        url = path.removeprefix("/api/v1")
        for name in ("session_id", "run_id", "handoff_id"):
            url = url.replace("{" + name + "}", "1")
        resp = owner.get(url, limit=limit)
        assert resp.status_code == 422, (path, resp.content)
        err = resp.json()["error"]
        assert err["code"] == "validation_error" and err["details"]["field"] == "limit", (path, err)


def test_limit_bounds_are_accepted_and_honoured(owner, new_session):
    for _ in range(3):
        new_session(attach=False)
    assert len(owner.get("/sessions", limit=1).json()["items"]) == 1
    page = owner.get("/sessions", limit=MAX_PAGE).json()
    assert len(page["items"]) == 3 and page["next_after"] is None


@pytest.mark.parametrize(("path", "param"), [
    ("/sessions", "role"),
    ("/sessions", "status"),
    ("/handoffs", "state"),
    ("/write-intents", "state"),
    ("/sessions/1/runs", "state"),
])
def test_enum_filters_refuse_unknown_values(owner, new_session, path, param):
    new_session(attach=False)
    resp = owner.get(path, **{param: "bogus"})
    assert resp.status_code == 422, resp.content
    err = resp.json()["error"]
    assert err["code"] == "validation_error" and err["details"]["field"] == param


def test_enum_filters_are_declared_from_the_lifecycles():
    from novelforge_sessions import lifecycles as lc
    from novelforge_sessions import session_runtime as rt

    schema = served_schema()

    def enum(path: str, name: str) -> set[str]:
        param = next(p for p in schema["paths"][path]["get"]["parameters"] if p["name"] == name)
        return {v for option in param["schema"]["anyOf"] for v in option.get("enum", [])}

    assert enum("/api/v1/sessions", "role") == {r.value for r in rt.SessionRole}
    assert enum("/api/v1/handoffs", "state") == {s.value for s in lc.HandoffState}
    assert enum("/api/v1/write-intents", "state") == {s.value for s in lc.IntentState}
    assert enum("/api/v1/sessions/{session_id}/runs", "state") == {s.value for s in rt.RunState}


def test_valid_enum_filters_still_filter(owner, new_session):
    new_session(attach=False)
    assert owner.get("/sessions", role="writer").json()["items"]
    assert owner.get("/sessions", role="manager").json()["items"] == []
    assert owner.get("/handoffs", state="pending").json()["items"] == []
    assert owner.get("/write-intents", state="proposed").json()["items"] == []
    assert Session.objects.count() == 1 and not Handoff.objects.exists() and not WriteIntent.objects.exists()
