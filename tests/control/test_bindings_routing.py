"""Binding invalidation (docs/model.md#stale-bindings) and runtime routing (docs/model.md#runtime-routing)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from novelforge_sessions.models import Event, RuntimeAttachment, Session
from tests.support.responses import ok, refused
from tests.control.test_resume_control import approve_and_execute, checkpoint, close, resume
from tests.control.test_write_intents import before

pytestmark = pytest.mark.django_db


def change_framework(owner, manager, version: str = "2") -> None:
    approve_and_execute(owner, manager, {
        "kind": "framework.change", "idempotency_key": f"fw-{version}",
        "before_fingerprint": before(owner, "framework.change"), "params": {"framework_version": version}})


@pytest.fixture
def fleet(owner, new_session) -> dict:
    """Sessions in several states, each bound to the current authority by a checkpoint."""
    made = {}
    for name, end in [("idle", "idle"), ("completed", "completed"), ("running", None), ("never", None)]:
        s = new_session(run=name != "never")
        if name != "never":
            checkpoint(owner, s["run"]["id"])
            if end:
                ok(owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed", "session_status": end}))
        made[name] = s["id"]
    return made


def test_nothing_is_invalidated_while_authority_is_unchanged(owner, fleet):
    assert ok(owner.get("/bindings/invalidated")) == []


def test_an_authority_change_is_reported_and_stale_marking_is_explicit(owner, manager, fleet):
    change_framework(owner, manager)
    report = {b["session_id"]: b for b in ok(manager.get("/bindings/invalidated"))}
    assert set(report) == {fleet["idle"], fleet["completed"], fleet["running"]}  # "never" binds nothing
    assert report[fleet["idle"]]["changed"] == {"framework_version": {"bound": "1", "current": "2"}}
    assert report[fleet["running"]]["markable"] is False and report[fleet["idle"]]["markable"] is True
    # reporting changed nothing
    assert Session.objects.get(id=fleet["idle"]).status == "idle"
    done = ok(manager.post("/bindings/mark-stale", {}))
    assert sorted(b["session_id"] for b in done["marked"]) == sorted([fleet["idle"], fleet["completed"]])
    assert Session.objects.get(id=fleet["idle"]).status == "stale"
    assert Session.objects.get(id=fleet["completed"]).status == "stale"
    assert Session.objects.get(id=fleet["running"]).status == "running"  # resume will refuse it instead
    ev = Event.objects.filter(type="session.binding_invalidated", session_id=fleet["idle"]).get()
    assert ev.payload["changed"]["framework_version"] == {"bound": "1", "current": "2"}
    assert Session.objects.get(id=fleet["idle"]).status_reason == "binding invalidated: framework 1→2"
    # idempotent: nothing left to mark
    assert ok(manager.post("/bindings/mark-stale", {}))["marked"] == []


def test_mark_stale_for_named_sessions_reports_the_ineligible(owner, manager, fleet):
    change_framework(owner, manager)
    done = ok(manager.post("/bindings/mark-stale", {"session_ids": [fleet["idle"], fleet["running"], 999999]}))
    assert [b["session_id"] for b in done["marked"]] == [fleet["idle"]]
    assert {s["session_id"]: s["reason"] for s in done["skipped"]} == {
        fleet["running"]: "status running is not idle/completed", 999999: "not found"}
    assert Session.objects.get(id=fleet["completed"]).status == "completed"


def test_marking_stale_needs_approve(owner, writer, fleet, manager):
    change_framework(owner, manager)
    refused(writer.post("/bindings/mark-stale", {}), 403, "forbidden")
    assert Session.objects.get(id=fleet["idle"]).status == "idle"


def test_a_stale_session_only_terminates(owner, manager, fleet):
    change_framework(owner, manager)
    ok(manager.post("/bindings/mark-stale", {}))
    close(owner, fleet["idle"])
    refused(resume(owner, fleet["idle"]), 409, "illegal_transition")
    assert ok(owner.post(f"/sessions/{fleet['idle']}/transition", {"to": "terminated"}))["status"] == "terminated"


# ---- routing ----------------------------------------------------------------------------------------
def test_routing_lists_live_runtimes_that_declare_the_capability(owner, reader, outsider, new_session):
    a = new_session(attach=False)
    ok(owner.post(f"/sessions/{a['id']}/runtimes", {"runtime_family": "codex", "capabilities": ["review", "draft"]}), 201)
    b = new_session()
    ok(owner.post(f"/sessions/{b['id']}/close", {}))
    ok(owner.post(f"/sessions/{b['id']}/runtimes", {"runtime_family": "chat", "capabilities": ["review"]}), 201)
    c = new_session()  # draft only
    expired = new_session()
    ok(owner.post(f"/sessions/{expired['id']}/close", {}))
    ok(owner.post(f"/sessions/{expired['id']}/runtimes", {"runtime_family": "chat", "capabilities": ["review"]}), 201)
    RuntimeAttachment.objects.filter(session_id=expired["id"], state="live").update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    found = ok(reader.get("/routing/runtimes", capability="review"))
    assert sorted(r["session_id"] for r in found) == sorted([a["id"], b["id"]])  # not c, not the expired one
    both = ok(reader.get("/routing/runtimes?capability=review&capability=draft"))
    assert [r["session_id"] for r in both] == [a["id"]]
    assert c["id"] not in {r["session_id"] for r in found}
    assert ok(outsider.get("/routing/runtimes", capability="review")) == []
    refused(reader.get("/routing/runtimes", capability="Not A Cap"), 422, "validation_error")
    refused(reader.get("/routing/runtimes"), 422, "validation_error")


# 7.5 is not an integer; 7.0 is (JSON Schema's integer, tests/api/test_errors.py), so it is not here.
@pytest.mark.parametrize("value", [False, "7", 7.5])
def test_mark_stale_takes_json_integer_ids_only(owner, manager, fleet, value):
    change_framework(owner, manager)
    err = refused(manager.post("/bindings/mark-stale", {"session_ids": [value]}), 422, "validation_error")
    assert err["details"]["field"] == "session_ids.0"
    assert Session.objects.get(id=fleet["idle"]).status == "idle"
