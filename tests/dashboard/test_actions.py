"""Manager actions from the pages: POST + CSRF + permissions, each one existing action."""
from __future__ import annotations

import pytest

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.models import Event, Project, Run, RuntimeAttachment
from tests.dashboard.conftest import csrf_token, logged_in
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

ACTIONS = ["close", "abort", "terminate", "resume"]


@pytest.mark.parametrize("action", ACTIONS)
def test_actions_without_a_csrf_token_are_refused(mgr_client, make_session, action):
    session = make_session(run=True)
    before = snapshot()
    resp = mgr_client.post(f"/sessions/{session.id}/{action}/", {"version": session.version})
    assert resp.status_code == 403
    assert snapshot() == before


@pytest.mark.parametrize("action", ACTIONS)
def test_a_manager_of_another_project_gets_404_and_nothing_changes(other_manager, make_session, action):
    session = make_session(run=True)
    before = snapshot()
    client = logged_in(other_manager, csrf=True)
    token = csrf_token(client, "/")
    resp = client.post(f"/sessions/{session.id}/{action}/", {"csrfmiddlewaretoken": token, "version": session.version})
    assert resp.status_code == 404
    assert snapshot() == before


@pytest.mark.parametrize("action", ACTIONS)
def test_actions_need_a_login_and_post(make_session, action):
    from django.test import Client

    session = make_session(run=True)
    before = snapshot()
    assert Client().post(f"/sessions/{session.id}/{action}/")["Location"].startswith("/login/")
    assert snapshot() == before


def test_get_is_not_an_action(mgr_client, make_session):
    session = make_session(run=True)
    for action in ("close", "abort", "terminate"):
        assert mgr_client.get(f"/sessions/{session.id}/{action}/").status_code == 405


def test_close_ends_the_live_runtime_and_idles_a_running_session(mgr_client, make_session):
    session = make_session(run=True)
    token = csrf_token(mgr_client, f"/sessions/{session.id}/")
    resp = mgr_client.post(f"/sessions/{session.id}/close/", {"csrfmiddlewaretoken": token}, follow=True)
    assert resp.redirect_chain[-1][0] == f"/sessions/{session.id}/"
    assert "Closed the live runtime" in resp.content.decode()
    session.refresh_from_db()
    assert session.status == "idle"
    assert list(RuntimeAttachment.objects.filter(session=session).values_list("state", "end_reason")) == [
        ("closed", "closed by manager")
    ]
    assert Run.objects.get(session=session).state == rt.RunState.INTERRUPTED
    # Idempotent: a second close changes nothing.
    count = Event.objects.filter(session_id=session.id).count()
    resp = mgr_client.post(f"/sessions/{session.id}/close/", {"csrfmiddlewaretoken": token}, follow=True)
    assert "nothing to close" in resp.content.decode()
    assert Event.objects.filter(session_id=session.id).count() == count


def test_abort_flags_the_open_run(mgr_client, make_session):
    session = make_session(run=True)
    token = csrf_token(mgr_client, f"/sessions/{session.id}/")
    mgr_client.post(f"/sessions/{session.id}/abort/", {"csrfmiddlewaretoken": token})
    run = Run.objects.get(session=session)
    assert run.abort_requested_at is not None and run.state == rt.RunState.OPEN
    session.refresh_from_db()
    assert session.status == "running", "abort is cooperative, not close"
    assert Event.objects.filter(session_id=session.id, type="run.abort_requested").count() == 1


def test_abort_without_an_open_run_reports_the_refusal(mgr_client, make_session):
    session = make_session()
    token = csrf_token(mgr_client, f"/sessions/{session.id}/")
    resp = mgr_client.post(f"/sessions/{session.id}/abort/", {"csrfmiddlewaretoken": token}, follow=True)
    assert "no_open_run" in resp.content.decode()


def test_terminate_checks_the_version_the_manager_saw(mgr_client, make_session):
    from novelforge_sessions.actions.sessions import transition_session
    from tests.support.factories import caller_for

    session = make_session(run=True)
    seen = session.version
    token = csrf_token(mgr_client, f"/sessions/{session.id}/")
    transition_session(caller_for(session.project), session.id, "awaiting_user")  # changes under the page
    resp = mgr_client.post(f"/sessions/{session.id}/terminate/", {"csrfmiddlewaretoken": token, "version": seen}, follow=True)
    assert "changed since you loaded the page" in resp.content.decode()
    session.refresh_from_db()
    assert session.status == "awaiting_user"

    mgr_client.post(f"/sessions/{session.id}/terminate/", {"csrfmiddlewaretoken": token, "version": session.version})
    session.refresh_from_db()
    assert session.status == "terminated" and session.status_reason == "terminated by manager"
    assert not RuntimeAttachment.objects.filter(session=session, state="live").exists()


def test_terminate_refused_by_the_table_changes_nothing(mgr_client, make_session):
    session = make_session()  # created: the table has no created → terminated
    before = snapshot()
    token = csrf_token(mgr_client, f"/sessions/{session.id}/")
    resp = mgr_client.post(f"/sessions/{session.id}/terminate/", {"csrfmiddlewaretoken": token, "version": session.version},
                           follow=True)
    assert "illegal_transition" in resp.content.decode()
    assert snapshot() == before


def failed_after_runtime_lost(make_session):
    from datetime import timedelta

    from django.utils import timezone

    from novelforge_sessions.control.checkpoints import record_checkpoint
    from novelforge_sessions.actions.runtimes import reconcile_expired_runtimes
    from tests.support.factories import caller_for

    session = make_session(run=True)
    record_checkpoint(caller_for(session.project), session.runs.get().id,
                      {"boundary": "external_wait", "cursor": {"step": "wait"}})
    reconcile_expired_runtimes(now=timezone.now() + timedelta(hours=1))
    session.refresh_from_db()
    assert session.status == "failed"
    return session


def test_resume_shows_the_dry_run_report_first_then_resumes_on_confirm(mgr_client, make_session):
    session = failed_after_runtime_lost(make_session)
    before = snapshot()
    resp = mgr_client.get(f"/sessions/{session.id}/resume/")
    html = resp.content.decode()
    assert resp.status_code == 200
    assert "dry run" in html and "Confirm resume" in html
    for step in ("load", "framework", "authority", "context", "artifacts", "continue"):
        assert f"<strong>{step}</strong>" in html
    assert 'class="step fail"' not in html
    assert snapshot() == before, "the report acts on nothing"

    token = mgr_client.cookies["csrftoken"].value
    checkpoint_id = session.checkpoints.get().id
    resp = mgr_client.post(f"/sessions/{session.id}/resume/", {"csrfmiddlewaretoken": token, "checkpoint_id": checkpoint_id})
    assert resp.status_code == 302 and resp["Location"] == f"/sessions/{session.id}/"
    session.refresh_from_db()
    assert session.status == "running" and session.generation == 2
    live = RuntimeAttachment.objects.get(session=session, state="live")
    assert live.runtime_family == session.runtime_family and live.capabilities == ["draft"]
    new_run = Run.objects.get(session=session, state="open")
    assert new_run.seq == 2 and new_run.resumed_from_id == checkpoint_id and new_run.cursor == {"step": "wait"}


def test_resume_refused_shows_the_failed_steps_and_repair_route(mgr_client, make_session):
    session = failed_after_runtime_lost(make_session)
    Project.objects.filter(id=session.project_id).update(authority_version=2)  # Canon moved on
    before = snapshot()
    resp = mgr_client.get(f"/sessions/{session.id}/resume/")
    html = resp.content.decode()
    assert resp.status_code == 409
    assert 'class="step fail"' in html and "repair: re-freeze" in html and "Confirm resume" not in html
    token = mgr_client.cookies["csrftoken"].value
    assert mgr_client.post(f"/sessions/{session.id}/resume/", {"csrfmiddlewaretoken": token}).status_code == 409
    assert snapshot() == before


def test_resume_while_a_runtime_is_live_is_refused_with_its_code(mgr_client, make_session):
    session = make_session(run=True)
    before = snapshot()
    resp = mgr_client.get(f"/sessions/{session.id}/resume/")
    assert resp.status_code == 409 and "live_runtime_exists" in resp.content.decode()
    assert snapshot() == before


def test_action_buttons_follow_the_state(mgr_client, make_session):
    running = make_session(run=True)
    html = mgr_client.get(f"/sessions/{running.id}/").content.decode()
    assert 'value="close">Close' in html and 'value="close" disabled' not in html
    assert 'value="terminate" disabled' not in html
    assert "the session is already running" in html and f'href="/sessions/{running.id}/resume/"' not in html
    fresh = make_session(attach=False)
    html = mgr_client.get(f"/sessions/{fresh.id}/").content.decode()
    assert 'value="close" disabled' in html and 'value="abort" disabled' in html and 'value="terminate" disabled' in html
    assert f'href="/sessions/{fresh.id}/resume/"' in html, "created → running is legal and no runtime is live"


def test_odd_form_values_never_500(mgr_client, make_session):
    session = make_session(run=True)
    token = csrf_token(mgr_client, f"/sessions/{session.id}/")
    for version in ("9" * 40, "", "v2"):
        resp = mgr_client.post(f"/sessions/{session.id}/terminate/", {"csrfmiddlewaretoken": token, "version": version})
        assert resp.status_code == 302
    session.refresh_from_db()
    assert session.status == "running", "no version, no terminate"
    resp = mgr_client.post(f"/sessions/{session.id}/resume/", {"csrfmiddlewaretoken": token, "checkpoint_id": "9" * 40})
    assert resp.status_code == 409  # a runtime is live: refused with its code, not a crash
