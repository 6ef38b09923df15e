"""Generation fencing (docs/model.md#generation-fencing): every write a runtime makes names its generation.

After generation 1 is closed and resume attaches generation 2, the same token acting for
generation 1 must not move the session: a write naming generation 1 is ``stale_runtime``, an
unnamed one ``runtime_required``; nothing is written. Managers on the pages are their own
principal and stay unfenced.
"""
from __future__ import annotations

import pytest
from django.db import connection

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.models import Event, Run, RuntimeAttachment, Session, TranscriptEntry
from tests.support.factories import RUNTIME
from tests.dashboard.conftest import csrf_token, logged_in, make_user
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def resumed(owner, new_session):
    """The issue's scenario: generation 1 ran and was closed; resume attached generation 2."""
    s = new_session()
    gen1 = RuntimeAttachment.objects.get(session_id=s["id"], generation=1).id
    run1 = owner.post(f"/sessions/{s['id']}/runs", {"cursor": {"step": "outline"}}).json()
    assert owner.post(f"/runs/{run1['id']}/checkpoints", {"boundary": "context_freeze", "cursor": {"step": "outline"}}).status_code == 201
    closed = owner.post(f"/sessions/{s['id']}/close", {})
    assert closed.status_code == 200 and closed.json()["closed_runtime_id"] == gen1
    report = owner.post(f"/sessions/{s['id']}/resume", {"runtime": RUNTIME}).json()
    assert report["ok"] and report["generation"] == 2
    return {"id": s["id"], "gen1": gen1, "gen2": report["runtime_id"], "run1": run1["id"], "run2": report["run_id"]}


def test_create_with_a_runtime_returns_its_id(owner, new_session):
    s = new_session()
    assert s["runtime_id"] == RuntimeAttachment.objects.get(session_id=s["id"]).id
    assert new_session(attach=False)["runtime_id"] is None


def test_generation_one_cannot_complete_generation_twos_session(owner, resumed):
    sid, before = resumed["id"], snapshot()
    named = owner.post(f"/sessions/{sid}/transition", {"to": "completed", "runtime_id": resumed["gen1"]})
    assert named.status_code == 409
    err = named.json()["error"]
    assert err["code"] == "stale_runtime"
    assert err["details"] == {"runtime_id": resumed["gen1"], "live_runtime_id": resumed["gen2"], "live_generation": 2}
    assert snapshot() == before

    unnamed = owner.post(f"/sessions/{sid}/transition", {"to": "completed"})
    assert unnamed.status_code == 409 and unnamed.json()["error"]["code"] == "runtime_required"
    assert unnamed.json()["error"]["details"]["field"] == "runtime_id"
    assert snapshot() == before

    # Generation 2's session and run are untouched.
    assert Session.objects.get(id=sid).status == rt.SessionStatus.RUNNING
    assert Run.objects.get(id=resumed["run2"]).state == rt.RunState.OPEN
    assert RuntimeAttachment.objects.get(id=resumed["gen2"]).state == rt.RuntimeState.LIVE


def test_a_late_transcript_append_from_generation_one_is_not_stored(owner, resumed):
    sid, before = resumed["id"], snapshot()
    named = owner.post(f"/sessions/{sid}/transcript", {"role": "assistant", "content": "late", "runtime_id": resumed["gen1"]})
    assert named.status_code == 409 and named.json()["error"]["code"] == "stale_runtime"
    unnamed = owner.post(f"/sessions/{sid}/transcript", {"role": "assistant", "content": "late"})
    assert unnamed.status_code == 409 and unnamed.json()["error"]["code"] == "runtime_required"
    assert snapshot() == before
    assert not TranscriptEntry.objects.filter(session_id=sid).exists()


@pytest.mark.parametrize("write", ["close", "abort", "start_run", "cursor", "end_run"])
def test_every_other_runtime_write_from_generation_one_is_refused(owner, resumed, write):
    sid, gen1, before = resumed["id"], resumed["gen1"], snapshot()
    path, body = {
        "close": (f"/sessions/{sid}/close", {}),
        "abort": (f"/sessions/{sid}/abort", {}),
        "start_run": (f"/sessions/{sid}/runs", {}),
        "cursor": (f"/runs/{resumed['run2']}/cursor", {"cursor": {"step": "x"}}),
        "end_run": (f"/runs/{resumed['run2']}/end", {"outcome": "completed"}),
    }[write]
    resp = owner.post(path, {**body, "runtime_id": gen1})
    if write == "start_run":
        # The lifecycle answer comes first: generation 2's run is open.
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "open_run_exists"
    else:
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "stale_runtime", resp.content
    if write in ("close", "abort"):
        unnamed = owner.post(path, body)
        assert unnamed.status_code == 409 and unnamed.json()["error"]["code"] == "runtime_required"
    assert snapshot() == before


def test_generation_one_cannot_start_a_run_after_generation_two_went_idle(owner, resumed):
    sid = resumed["id"]
    assert owner.post(f"/runs/{resumed['run2']}/end", {"outcome": "completed", "runtime_id": resumed["gen2"]}).status_code == 200
    before = snapshot()
    named = owner.post(f"/sessions/{sid}/runs", {"runtime_id": resumed["gen1"]})
    assert named.status_code == 409 and named.json()["error"]["code"] == "stale_runtime"
    unnamed = owner.post(f"/sessions/{sid}/runs", {})
    assert unnamed.status_code == 409 and unnamed.json()["error"]["code"] == "runtime_required"
    assert snapshot() == before
    ok = owner.post(f"/sessions/{sid}/runs", {"runtime_id": resumed["gen2"]})
    assert ok.status_code == 201 and ok.json()["seq"] == 3


def test_generation_two_naming_its_runtime_succeeds(owner, resumed):
    sid, gen2, run2 = resumed["id"], resumed["gen2"], resumed["run2"]
    assert owner.post(f"/sessions/{sid}/transcript", {"role": "assistant", "content": "hi", "runtime_id": gen2}).status_code == 201
    assert owner.post(f"/runs/{run2}/cursor", {"cursor": {"step": "two"}, "runtime_id": gen2}).status_code == 200
    assert owner.post(f"/sessions/{sid}/abort", {"runtime_id": gen2}).json()["already_requested"] is False
    assert owner.post(f"/runs/{run2}/cursor", {"cursor": {"step": "three"}}).status_code == 200  # run-scoped: unnamed is fenced by the run
    done = owner.post(f"/sessions/{sid}/transition", {"to": "completed", "runtime_id": gen2})
    assert done.status_code == 200 and done.json()["status"] == "completed"
    assert Run.objects.get(id=run2).state == rt.RunState.COMPLETED
    closed = owner.post(f"/sessions/{sid}/close", {"runtime_id": gen2})
    assert closed.status_code == 200 and closed.json()["closed_runtime_id"] == gen2


def test_close_stays_idempotent_for_the_latest_generation_but_not_for_a_superseded_one(owner, resumed):
    sid, gen1, gen2 = resumed["id"], resumed["gen1"], resumed["gen2"]
    assert owner.post(f"/sessions/{sid}/close", {"runtime_id": gen2}).json()["closed_runtime_id"] == gen2
    before = snapshot()
    again = owner.post(f"/sessions/{sid}/close", {"runtime_id": gen2})
    assert again.status_code == 200 and again.json()["already_closed"] is True
    unnamed = owner.post(f"/sessions/{sid}/close", {})
    assert unnamed.status_code == 200 and unnamed.json()["already_closed"] is True
    stale = owner.post(f"/sessions/{sid}/close", {"runtime_id": gen1})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_runtime"
    assert stale.json()["error"]["details"] == {"runtime_id": gen1, "live_runtime_id": None, "live_generation": None}
    assert snapshot() == before


def test_a_runtime_whose_lease_ran_out_is_not_live_for_fencing(owner, resumed):
    sid, gen2 = resumed["id"], resumed["gen2"]
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {RuntimeAttachment._meta.db_table} SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [gen2])
    before = snapshot()
    resp = owner.post(f"/sessions/{sid}/transition", {"to": "completed", "runtime_id": gen2})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "stale_runtime"
    assert resp.json()["error"]["details"]["live_runtime_id"] is None
    assert snapshot() == before


def test_a_runtime_id_of_another_session_is_stale(owner, resumed, new_session):
    other = new_session()
    before = snapshot()
    resp = owner.post(f"/sessions/{resumed['id']}/transition", {"to": "idle", "runtime_id": other["runtime_id"]})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "stale_runtime"
    assert snapshot() == before


def test_a_single_generation_session_accepts_unnamed_writes(owner, new_session):
    s = new_session(run=True)
    assert owner.post(f"/sessions/{s['id']}/transcript", {"role": "user", "content": "hello"}).status_code == 201
    assert owner.post(f"/sessions/{s['id']}/transition", {"to": "awaiting_user"}).status_code == 200
    assert owner.post(f"/sessions/{s['id']}/transition", {"to": "running"}).status_code == 200
    # ... and a named one is checked even then.
    live = RuntimeAttachment.objects.get(session_id=s["id"]).id
    stale = owner.post(f"/sessions/{s['id']}/transition", {"to": "idle", "runtime_id": live + 1000})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_runtime"


def test_detach_after_resume_ends_only_its_own_generation(owner, resumed):
    sid = resumed["id"]
    before = snapshot()
    old = owner.post(f"/runtimes/{resumed['gen1']}/detach", {})
    assert old.status_code == 200 and old.json()["state"] == rt.RuntimeState.CLOSED
    assert snapshot() == before  # generation 1 was already closed: nothing happens to generation 2
    new = owner.post(f"/runtimes/{resumed['gen2']}/detach", {})
    assert new.status_code == 200 and new.json()["state"] == rt.RuntimeState.CLOSED
    assert Session.objects.get(id=sid).status == rt.SessionStatus.IDLE


@pytest.mark.parametrize("action", ["close", "abort", "terminate"])
def test_a_manager_on_the_pages_is_not_fenced(project, resumed, action):
    client = logged_in(make_user("manager", project), csrf=True)
    token = csrf_token(client, f"/sessions/{resumed['id']}/")
    session = Session.objects.get(id=resumed["id"])
    resp = client.post(f"/sessions/{session.id}/{action}/", {"csrfmiddlewaretoken": token, "version": session.version},
                       follow=True)
    assert resp.status_code == 200
    session.refresh_from_db()
    if action == "close":
        assert RuntimeAttachment.objects.get(id=resumed["gen2"]).state == rt.RuntimeState.CLOSED
        assert session.status == rt.SessionStatus.IDLE
    elif action == "abort":
        assert Run.objects.get(id=resumed["run2"]).abort_requested_at is not None
    else:
        assert session.status == rt.SessionStatus.TERMINATED
    assert Event.objects.filter(session_id=session.id, actor="user:manager").exists()
