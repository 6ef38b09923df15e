"""The session operations (docs/model.md#session-operations) through the API: create, close, resume, forget, abort; runs."""
from __future__ import annotations

import pytest

from novelforge_sessions.models import Event, Run, RuntimeAttachment, Session, TranscriptEntry

from tests.support.factories import RUNTIME

pytestmark = pytest.mark.django_db


def types_for(session_id: int) -> list[str]:
    return list(Event.objects.filter(session_id=session_id).order_by("id").values_list("type", flat=True))


def test_create_with_runtime_is_generation_one(owner, new_session):
    s = new_session()
    assert s["status"] == "created" and s["generation"] == 1 and s["version"] == 1
    assert RuntimeAttachment.objects.get(session_id=s["id"]).state == "live"
    assert types_for(s["id"]) == ["session.created", "runtime.attached"]


def test_role_other_needs_an_extension(owner):
    bad = owner.post("/sessions", {"role": "other", "memory_policy": "none", "task_mode": "x", "runtime_family": "y"})
    assert bad.status_code == 422 and bad.json()["error"]["details"]["field"] == "role_extension"
    good = owner.post("/sessions", {"role": "other", "role_extension": "illustrator", "memory_policy": "none",
                                    "task_mode": "x", "runtime_family": "y"})
    assert good.status_code == 201 and good.json()["role_extension"] == "illustrator"
    assert Session.objects.count() == 1


def test_start_run_moves_created_to_running_and_one_open_run_only(owner, new_session):
    s = new_session(run=True)
    assert s["status"] == "running" and s["run"]["seq"] == 1 and s["run"]["generation"] == 1
    again = owner.post(f"/sessions/{s['id']}/runs", {})
    assert again.status_code == 409 and again.json()["error"]["code"] == "open_run_exists"
    assert Run.objects.filter(session_id=s["id"]).count() == 1


def test_start_run_needs_a_live_runtime(owner, new_session):
    s = new_session(attach=False)
    resp = owner.post(f"/sessions/{s['id']}/runs", {})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "no_live_runtime"
    assert Session.objects.get(id=s["id"]).status == "created"


def test_end_run_goes_idle_then_a_second_run(owner, new_session):
    s = new_session(run=True)
    ended = owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed"})
    assert ended.status_code == 200 and ended.json()["state"] == "completed"
    assert owner.get(f"/sessions/{s['id']}").json()["status"] == "idle"
    second = owner.post(f"/sessions/{s['id']}/runs", {"cursor": {"step": "two"}})
    assert second.status_code == 201 and second.json()["seq"] == 2


def test_illegal_transition_is_409_and_writes_nothing(owner, new_session):
    s = new_session(run=True)
    owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed", "session_status": "completed"})
    before = Event.objects.count()
    resp = owner.post(f"/sessions/{s['id']}/transition", {"to": "running"})
    assert resp.status_code == 409
    err = resp.json()["error"]
    assert err["code"] == "illegal_transition"
    assert err["details"] == {"record": "session", "from": "completed", "to": "running", "allowed": ["stale"]}
    assert Event.objects.count() == before
    assert Session.objects.get(id=s["id"]).status == "completed"


def test_transition_to_running_from_idle_needs_a_run(owner, new_session):
    s = new_session(run=True)
    owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed"})
    resp = owner.post(f"/sessions/{s['id']}/transition", {"to": "running"})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "no_open_run"


def test_waiting_keeps_the_run_open_and_returns_to_running(owner, new_session):
    s = new_session(run=True)
    assert owner.post(f"/sessions/{s['id']}/transition", {"to": "awaiting_user"}).json()["status"] == "awaiting_user"
    assert Run.objects.get(id=s["run"]["id"]).state == "open"
    back = owner.post(f"/sessions/{s['id']}/transition", {"to": "running"})
    assert back.status_code == 200 and back.json()["status"] == "running"
    assert Run.objects.filter(session_id=s["id"]).count() == 1


def test_expected_version_guards_against_lost_updates(owner, new_session):
    s = new_session(run=True)
    resp = owner.post(f"/sessions/{s['id']}/transition", {"to": "idle", "expected_version": s["version"] - 1})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "version_conflict"
    ok = owner.post(f"/sessions/{s['id']}/transition", {"to": "idle", "expected_version": s["version"]})
    assert ok.status_code == 200 and ok.json()["version"] == s["version"] + 1


def test_terminate_ends_the_run_and_the_runtime(owner, new_session):
    s = new_session(run=True)
    resp = owner.post(f"/sessions/{s['id']}/transition", {"to": "terminated", "reason": "enough"})
    assert resp.status_code == 200 and resp.json()["allowed_transitions"] == []
    assert Run.objects.get(id=s["run"]["id"]).state == "terminated"
    assert RuntimeAttachment.objects.get(session_id=s["id"]).state == "closed"


# ---- close -----------------------------------------------------------------------------------
def test_close_is_idempotent_and_keeps_the_transcript(owner, new_session):
    s = new_session(run=True)
    owner.post(f"/sessions/{s['id']}/transcript", {"role": "user", "content": "hello"})
    first = owner.post(f"/sessions/{s['id']}/close")
    assert first.status_code == 200
    body = first.json()
    assert body["already_closed"] is False and body["closed_runtime_id"] is not None
    assert body["session"]["status"] == "idle"
    events_after_first = Event.objects.count()
    second = owner.post(f"/sessions/{s['id']}/close")
    assert second.status_code == 200 and second.json()["already_closed"] is True
    assert Event.objects.count() == events_after_first, "a repeated close writes nothing"
    assert list(TranscriptEntry.objects.filter(session_id=s["id"]).values_list("content", flat=True)) == ["hello"]
    assert Run.objects.get(id=s["run"]["id"]).state == "interrupted"
    assert owner.get(f"/sessions/{s['id']}/transcript").json()["items"][0]["content"] == "hello"


def test_close_of_a_waiting_session_keeps_it_waiting(owner, new_session):
    s = new_session(run=True)
    owner.post(f"/sessions/{s['id']}/transition", {"to": "awaiting_external"})
    body = owner.post(f"/sessions/{s['id']}/close").json()
    assert body["session"]["status"] == "awaiting_external"
    assert Run.objects.get(id=s["run"]["id"]).state == "open"


# ---- resume ----------------------------------------------------------------------------------
def test_resume_is_refused_while_a_runtime_is_live(owner, new_session):
    s = new_session(run=True)
    owner.post(f"/sessions/{s['id']}/transition", {"to": "failed"})
    resp = owner.post(f"/sessions/{s['id']}/resume", {"runtime": RUNTIME})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "live_runtime_exists"
    assert RuntimeAttachment.objects.filter(session_id=s["id"]).count() == 1


def test_resume_creates_generation_n_plus_one_and_a_new_run_at_the_cursor(owner, new_session):
    s = new_session(run=True)
    run_id = s["run"]["id"]
    cp = owner.post(f"/runs/{run_id}/checkpoints", {"boundary": "user_wait", "cursor": {"step": "chapter-2", "beat": 4}}).json()
    owner.post(f"/sessions/{s['id']}/close")
    resp = owner.post(f"/sessions/{s['id']}/resume", {"runtime": {**RUNTIME, "runtime_family": "codex"}})
    assert resp.status_code == 200, resp.content
    report = resp.json()
    assert report["ok"] is True and report["generation"] == 2 and report["checkpoint_id"] == cp["id"]
    assert [step["step"] for step in report["steps"]][0] == "load" and report["steps"][-1]["step"] == "continue"
    new_run = owner.get(f"/runs/{report['run_id']}").json()
    assert new_run["seq"] == 2 and new_run["generation"] == 2 and new_run["cursor"] == {"step": "chapter-2", "beat": 4}
    assert new_run["resumed_from_id"] == cp["id"]
    session = owner.get(f"/sessions/{s['id']}").json()
    assert session["status"] == "running" and session["generation"] == 2
    live = RuntimeAttachment.objects.get(session_id=s["id"], state="live")
    assert (live.generation, live.runtime_family) == (2, "codex")


def test_resume_of_a_completed_session_is_illegal(owner, new_session):
    s = new_session(run=True)
    owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed", "session_status": "completed"})
    owner.post(f"/sessions/{s['id']}/close")
    resp = owner.post(f"/sessions/{s['id']}/resume", {"runtime": RUNTIME})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "illegal_transition"


def test_resume_dry_run_changes_nothing(owner, new_session):
    s = new_session(run=True)
    owner.post(f"/sessions/{s['id']}/close")
    counts = (Event.objects.count(), Run.objects.count(), RuntimeAttachment.objects.count())
    resp = owner.post(f"/sessions/{s['id']}/resume", {"runtime": RUNTIME, "dry_run": True})
    assert resp.status_code == 200 and resp.json()["dry_run"] is True and resp.json()["run_id"] is None
    assert (Event.objects.count(), Run.objects.count(), RuntimeAttachment.objects.count()) == counts
    assert Session.objects.get(id=s["id"]).status == "idle"


def test_resume_never_reads_the_transcript(owner, new_session):
    """The report is built from checkpoints and current state; the transcript table is never queried."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    s = new_session(run=True)
    owner.post(f"/sessions/{s['id']}/transcript", {"role": "assistant", "content": "I remember step 9"})
    owner.post(f"/sessions/{s['id']}/close")
    with CaptureQueriesContext(connection) as ctx:
        resp = owner.post(f"/sessions/{s['id']}/resume", {"runtime": RUNTIME})
    assert resp.status_code == 200
    assert not [q for q in ctx.captured_queries if TranscriptEntry._meta.db_table in q["sql"]]


# ---- forget & abort ----------------------------------------------------------------------
def test_forget_is_refused_while_live_then_deletes_the_record(owner, new_session):
    s = new_session(run=True)
    owner.post(f"/sessions/{s['id']}/transcript", {"role": "user", "content": "x"})
    refused = owner.delete(f"/sessions/{s['id']}")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "live_runtime_exists"
    assert Session.objects.filter(id=s["id"]).exists()
    owner.post(f"/sessions/{s['id']}/close")
    assert owner.delete(f"/sessions/{s['id']}").status_code == 204
    assert not Session.objects.filter(id=s["id"]).exists()
    assert not TranscriptEntry.objects.filter(session_id=s["id"]).exists()
    assert owner.get(f"/sessions/{s['id']}").status_code == 404
    assert types_for(s["id"])[-1] == "session.forgotten", "the log outlives the record"


def test_abort_is_not_close(owner, new_session):
    s = new_session(run=True)
    resp = owner.post(f"/sessions/{s['id']}/abort", {"reason": "wrong chapter"})
    assert resp.status_code == 200 and resp.json()["already_requested"] is False
    # Not close: the runtime is still live and the run still open, flagged.
    runtime = RuntimeAttachment.objects.get(session_id=s["id"])
    assert runtime.state == "live"
    run = Run.objects.get(id=s["run"]["id"])
    assert run.state == "open" and run.abort_requested_at is not None
    # The runtime learns it on its next heartbeat and ends the run as aborted.
    beat = owner.post(f"/runtimes/{runtime.id}/heartbeat", {}).json()
    assert beat["abort_requested"] is True and beat["open_run_id"] == run.id
    owner.post(f"/runs/{run.id}/end", {"outcome": "aborted"})
    assert owner.get(f"/sessions/{s['id']}").json()["status"] == "idle"
    assert Run.objects.get(id=run.id).state == "aborted"
    assert RuntimeAttachment.objects.get(session_id=s["id"]).state == "live"
    again = owner.post(f"/sessions/{s['id']}/abort")
    assert again.status_code == 409 and again.json()["error"]["code"] == "no_open_run"


def test_repeated_abort_is_idempotent(owner, new_session):
    s = new_session(run=True)
    owner.post(f"/sessions/{s['id']}/abort")
    before = Event.objects.count()
    again = owner.post(f"/sessions/{s['id']}/abort")
    assert again.status_code == 200 and again.json()["already_requested"] is True
    assert Event.objects.count() == before


# ---- runtimes ----------------------------------------------------------------------------
def test_attach_refused_while_live_and_detach_is_close(owner, new_session):
    s = new_session()
    dup = owner.post(f"/sessions/{s['id']}/runtimes", RUNTIME)
    assert dup.status_code == 409 and dup.json()["error"]["code"] == "live_runtime_exists"
    runtime_id = RuntimeAttachment.objects.get(session_id=s["id"]).id
    detached = owner.post(f"/runtimes/{runtime_id}/detach")
    assert detached.status_code == 200 and detached.json()["state"] == "closed"
    attached = owner.post(f"/sessions/{s['id']}/runtimes", RUNTIME)
    assert attached.status_code == 201 and attached.json()["generation"] == 2


def test_heartbeat_of_a_closed_runtime_is_refused(owner, new_session):
    s = new_session()
    runtime_id = RuntimeAttachment.objects.get(session_id=s["id"]).id
    owner.post(f"/sessions/{s['id']}/close")
    resp = owner.post(f"/runtimes/{runtime_id}/heartbeat", {})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "runtime_not_live"
    assert resp.json()["error"]["details"]["state"] == "closed"


def test_transcript_is_bounded(owner, new_session, settings):
    settings.TRANSCRIPT_MAX_ENTRIES = 2
    s = new_session()
    for text in ("a", "b"):
        assert owner.post(f"/sessions/{s['id']}/transcript", {"role": "user", "content": text}).status_code == 201
    full = owner.post(f"/sessions/{s['id']}/transcript", {"role": "user", "content": "c"})
    assert full.status_code == 409 and full.json()["error"]["code"] == "transcript_full"
    settings.TRANSCRIPT_ENTRY_MAX_BYTES = 64
    settings.TRANSCRIPT_MAX_ENTRIES = 10
    big = owner.post(f"/sessions/{s['id']}/transcript", {"role": "user", "content": "x" * 65})
    assert big.status_code == 422 and big.json()["error"]["details"]["field"] == "content"
    assert TranscriptEntry.objects.filter(session_id=s["id"]).count() == 2


def test_an_open_conflict_blocks_new_work(owner, new_session):
    """A conflicting result (docs/model.md#results-and-idempotent-delivery) is a hard stop: no new run, no return to running."""
    s = new_session(run=True)
    owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed"})
    Session.objects.filter(id=s["id"]).update(open_conflict="conflicting_result for job-1")
    resp = owner.post(f"/sessions/{s['id']}/runs", {})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "open_conflict"
    assert Run.objects.filter(session_id=s["id"]).count() == 1
