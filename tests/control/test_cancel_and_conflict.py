"""A cancelled handoff is recorded as cancelled, not as "external
results bound"; a conflicting result always raises ``Session.open_conflict`` — also when the
session goes ``failed`` — so the 409, the session read-out and the session page all say so,
and the failed session does not resume until a manager resolves the conflict."""
from __future__ import annotations

import pytest

from novelforge_sessions.models import Event, Membership, Session
from tests.control.conftest import claim, deliver, make_handoff
from tests.support.responses import ok, refused
from tests.control.test_resume_control import checkpoint, close, resume
from tests.dashboard.conftest import logged_in, make_user

pytestmark = pytest.mark.django_db

GOOD = {"verdict": "consistent"}
OTHER = {"verdict": "inconsistent"}


def last_transition(session_id: int) -> dict:
    return Event.objects.filter(session_id=session_id, type="session.transitioned").order_by("-id").first().payload


# ---- (a) the reason a waiting run settles -----------------------------------------------------------------
def test_cancelling_the_last_handoff_says_so_in_the_transition(owner, frozen):
    sid, h = frozen["session"]["id"], frozen["handoff"]
    ok(owner.post(f"/handoffs/{h['id']}/cancel", {"reason": "not needed"}))
    session = Session.objects.get(id=sid)
    want = f"handoff {h['logical_id']} cancelled"
    assert session.status == "running" and session.status_reason == want
    assert last_transition(sid) == {**last_transition(sid), "from": "awaiting_external", "to": "running", "reason": want}
    assert not Event.objects.filter(session_id=sid, type="session.transitioned",
                                    payload__reason="external results bound").exists()


def test_a_bound_result_still_says_external_results_bound(worker, frozen):
    sid = frozen["session"]["id"]
    got = claim(worker, ["continuity"])
    ok(deliver(worker, got, GOOD))
    session = Session.objects.get(id=sid)
    assert session.status == "running" and session.status_reason == "external results bound"
    assert last_transition(sid)["reason"] == "external results bound"


def test_cancelling_one_of_two_handoffs_keeps_waiting(owner, frozen):
    make_handoff(owner, frozen["run"]["id"], "chapter-1/style")
    before = Event.objects.filter(type="session.transitioned").count()
    ok(owner.post(f"/handoffs/{frozen['handoff']['id']}/cancel", {}))
    assert Session.objects.get(id=frozen["session"]["id"]).status == "awaiting_external"
    assert Event.objects.filter(type="session.transitioned").count() == before


# ---- (b) a conflict always raises open_conflict ----------------------------------------------------------
@pytest.fixture
def conflicted(owner, worker, frozen) -> dict:
    """A consumed result, then a different one: the hard stop fails the running session."""
    got = claim(worker, ["continuity"])
    ok(deliver(worker, got, GOOD))
    checkpoint(owner, frozen["run"]["id"], boundary="after_external_result", cursor={"step": "after"})
    err = refused(deliver(worker, got, OTHER), 409, "conflicting_result")
    return {**frozen, "handoff": got, "error": err}


def test_a_conflict_that_fails_the_session_still_sets_open_conflict(owner, conflicted):
    sid, reason = conflicted["session"]["id"], "conflicting_result: chapter-1/continuity"
    session = Session.objects.get(id=sid)
    assert session.status == "failed" and session.status_reason == reason
    assert session.open_conflict == reason
    assert conflicted["error"]["details"]["session_status"] == "failed"
    assert conflicted["error"]["details"]["open_conflict"] == reason
    assert ok(owner.get(f"/sessions/{sid}"))["open_conflict"] == reason
    ev = Event.objects.get(type="handoff.result_conflict")
    assert ev.payload["open_conflict"] == reason and ev.payload["session_status"] == "failed"


def test_the_session_page_shows_the_conflict_alert(project, conflicted):
    manager = make_user("boss", project, Membership.Role.MANAGER)
    html = logged_in(manager).get(f"/sessions/{conflicted['session']['id']}/").content.decode()
    assert ('role="alert"><strong>Open conflict:</strong> <span data-reason="conflicting_result: chapter-1/continuity">'
            "A different result arrived for handoff chapter-1/continuity after one was consumed</span>") in html


def test_a_failed_session_with_an_open_conflict_resumes_only_after_resolution(owner, manager, conflicted):
    sid = conflicted["session"]["id"]
    close(owner, sid)
    err = refused(resume(owner, sid), 409, "resume_refused")
    failed = [s for s in err["details"]["report"]["steps"] if not s["ok"]]
    assert failed[0]["step"] == "results" and failed[0]["data"]["open_conflict"].startswith("conflicting_result")
    assert Session.objects.get(id=sid).status == "failed"

    done = ok(manager.post(f"/handoffs/{conflicted['handoff']['id']}/resolve-conflict", {"resolution": "first stands"}))
    assert done["state"] == "bound"
    session = Session.objects.get(id=sid)
    assert session.open_conflict == "" and session.status == "failed"
    assert Event.objects.get(type="handoff.conflict_resolved").payload["open_conflict"] is None
    report = ok(resume(owner, sid))
    assert all(s["ok"] for s in report["steps"])
    assert Session.objects.get(id=sid).status == "running"


def test_an_open_conflict_blocks_a_manual_restart(owner, conflicted):
    sid = conflicted["session"]["id"]
    refused(owner.post(f"/sessions/{sid}/runs", {}), 409, "open_conflict")
    assert Session.objects.get(id=sid).status == "failed"
