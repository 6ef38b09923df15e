"""Email to the people a wait names (docs/notifications.md), received by a real SMTP server:
the reviewer's mail with the packet's link, at most once per batching window, the opt-out, and
nobody mailed whom the wait does not name."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F
from django.test import Client
from django.utils import timezone

from novelforge_sessions.actions.runtimes import reconcile_expired_runtimes
from novelforge_sessions.models import RuntimeAttachment
from novelforge_sessions.notify import mailer
from novelforge_sessions.notify.models import EmailCursor, EmailNotice, EmailPreference
from tests.control.test_write_intents import propose_current
from tests.notify.conftest import BASE_URL, body_of
from novelforge_sessions.actions import artifacts, runs
from novelforge_sessions.apikit.auth import caller_for_token
from reviews import actions
from tests.reviews.factories import CHAPTER, RUBRIC, add_writer, make_user, make_world
from tests.support.responses import ok

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world(project):
    world = make_world(project)
    world.users["carl"] = make_user(project, "carl", "reviewer")
    for name, user in world.users.items():
        user.email = f"{name}@example.org"
        user.save(update_fields=["email"])
    return world


def open_gate(world, reviewers: list[str], route: str = "page"):
    """A review gate on a draft of a new writer session (a session waits on one gate at a time)."""
    writer, raw = add_writer(world.project)
    caller = caller_for_token(raw)
    artifact = artifacts.create_artifact(caller, name=f"chapter-{writer.id}", kind="chapter", content=CHAPTER)
    runs.start_run(caller, writer.id, cursor={"step": "draft"})
    spec = actions.GateSpec(candidate_version_id=artifact.current_version.id, rubric=RUBRIC, route=route,
                            reviewers=reviewers)
    return actions.open_gate(caller, writer.id, spec)


def end_window(user) -> None:
    """The batching window's end, without waiting it out: the last mail moved back by one window."""
    EmailPreference.objects.filter(user=user).update(last_mail_at=F("last_mail_at") - timedelta(minutes=10, seconds=1))


def test_the_assigned_reviewer_gets_the_packet_link_at_most_once_per_window(world, smtp):
    gate = open_gate(world, ["alice"])
    counts = mailer.run_once()
    assert counts["mails"] == 1
    [mail] = smtp.to("alice@example.org")
    link = f"{BASE_URL}/reviews/packets/{gate.packet.id}/"
    assert link in body_of(mail)
    assert mail["Subject"] == "NovelForge: a review is waiting for you"
    assert f"{BASE_URL}/notifications/" in body_of(mail)
    # Nobody else was named by the wait: not the other reviewers, not the manager.
    assert smtp.recipients() == {"alice@example.org"}

    # A second packet within the window: no second mail yet, however often the mailer runs.
    second = open_gate(world, ["alice", "bob"], "relay")
    assert mailer.run_once()["mails"] == 1  # bob's first mail; alice waits for her window
    assert len(smtp.to("alice@example.org")) == 1
    assert mailer.run_once()["mails"] == 0
    assert len(smtp.to("alice@example.org")) == 1
    [bobs] = smtp.to("bob@example.org")
    assert f"{BASE_URL}/reviews/packets/{second.packet.id}/" in body_of(bobs)

    # The window over: one mail with what waited meanwhile, and nothing already sent.
    end_window(world.users["alice"])
    assert mailer.run_once()["mails"] == 1
    first, later = smtp.to("alice@example.org")
    assert f"{BASE_URL}/reviews/packets/{second.packet.id}/" in body_of(later)
    assert link not in body_of(later)
    assert mailer.run_once()["mails"] == 0
    assert len(smtp.messages) == 3
    assert "carl@example.org" not in smtp.recipients() and "mia@example.org" not in smtp.recipients()


def test_notices_within_one_window_come_in_one_mail(world, smtp):
    gates = [open_gate(world, ["bob"]) for _ in range(3)]
    assert mailer.run_once()["mails"] == 1
    [mail] = smtp.to("bob@example.org")
    assert mail["Subject"] == "NovelForge: 3 things are waiting for you"
    for gate in gates:
        assert f"{BASE_URL}/reviews/packets/{gate.packet.id}/" in body_of(mail)


def test_an_agent_reviewers_gate_mails_nobody(world, smtp):
    from tests.reviews.factories import agent_reviewer

    agent_reviewer(world.project)
    world.gate(route="agent")
    counts = mailer.run_once()
    assert counts["events"] >= 1 and counts["mails"] == 0
    assert smtp.messages == [] and not EmailNotice.objects.exists()


def test_an_opted_out_reviewer_gets_no_mail_and_the_change_needs_csrf(world, smtp):
    alice = world.users["alice"]
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    page = browser.get("/notifications/")
    assert page.status_code == 200 and b"checked" in page.content and b"alice@example.org" in page.content
    # Without the CSRF token: refused, nothing changed.
    assert browser.post("/notifications/", {}).status_code == 403
    assert mailer.preference_of(alice).email_enabled is True
    token = page.cookies["csrftoken"].value
    saved = browser.post("/notifications/", {"csrfmiddlewaretoken": token})  # the box unticked
    assert saved.status_code == 302
    assert mailer.preference_of(alice).email_enabled is False
    assert b"checked" not in browser.get("/notifications/").content

    open_gate(world, ["alice", "bob"])
    assert mailer.run_once()["mails"] == 1
    assert smtp.recipients() == {"bob@example.org"}
    # Her notice was dropped, not kept for later: turning mail back on sends no old news.
    assert EmailNotice.objects.get(user=alice).dropped_at is not None
    browser.post("/notifications/", {"csrfmiddlewaretoken": token, "email_enabled": "on"})
    assert mailer.preference_of(alice).email_enabled is True
    end_window(world.users["bob"])
    assert mailer.run_once()["mails"] == 0 and smtp.to("alice@example.org") == []


def test_the_preference_page_needs_a_login(db):
    resp = Client().get("/notifications/")
    assert resp.status_code == 302 and "/login/" in resp["Location"]


def test_approvers_hear_of_a_write_that_needs_approval_and_managers_of_a_failed_session(world, smtp, owner):
    from tests.control.conftest import make_artifact

    art = make_artifact(owner, "chapter-9", "first draft")
    v2 = ok(owner.post(f"/artifacts/{art['id']}/versions", {"content": "second draft"}), 201)
    intent = ok(propose_current(owner, {"artifact": art, "v2": v2}), 201)
    assert intent["requires_approval"] is True
    # The writer's runtime stops heartbeating: the reconciler fails its session.
    RuntimeAttachment.objects.filter(session=world.writer).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    reconcile_expired_runtimes()

    assert mailer.run_once()["mails"] == 1
    assert smtp.recipients() == {"mia@example.org"}  # the project's only manager
    [mail] = smtp.to("mia@example.org")
    body = body_of(mail)
    assert f"{BASE_URL}/projects/{world.project.id}/#intent-{intent['id']}" in body
    assert f"{BASE_URL}/sessions/{world.writer.id}/" in body
    assert {n.kind for n in EmailNotice.objects.all()} == {"approval", "session_failed"}


def test_an_smtp_server_that_is_down_loses_nothing(world, smtp, settings):
    open_gate(world, ["alice"])
    port = settings.EMAIL_PORT
    settings.EMAIL_PORT = 1  # nothing listens there
    counts = mailer.run_once()
    assert counts["failed"] == 1 and counts["mails"] == 0 and smtp.messages == []
    notice = EmailNotice.objects.get()
    assert notice.sent_at is None and notice.dropped_at is None
    settings.EMAIL_PORT = port
    EmailPreference.objects.update(leased_until=timezone.now() - timedelta(seconds=1))  # the retry is due
    assert mailer.run_once()["mails"] == 1
    assert len(smtp.to("alice@example.org")) == 1


def test_the_cursor_resumes_where_it_stopped(world, smtp):
    """Events made while no mailer runs are mailed by the next pass, from the cursor."""
    mailer.run_once()
    cursor = EmailCursor.objects.get(id=1).last_event_id
    gate = open_gate(world, ["carl"])
    assert EmailCursor.objects.get(id=1).last_event_id == cursor  # no mailer ran
    assert mailer.run_once()["mails"] == 1
    assert f"/reviews/packets/{gate.packet.id}/" in body_of(smtp.to("carl@example.org")[0])
    assert EmailCursor.objects.get(id=1).last_event_id > cursor


def test_the_command_makes_one_pass_and_refuses_loop_with_once(world, smtp):
    from io import StringIO

    from django.core.management import call_command

    open_gate(world, ["bob"])
    out = StringIO()
    call_command("send_notifications", "--once", stdout=out)
    assert "1 mails sent, 0 failed" in out.getvalue()
    assert len(smtp.to("bob@example.org")) == 1
    with pytest.raises(SystemExit) as exit_:
        call_command("send_notifications", "--once", "--loop", stderr=StringIO())
    assert exit_.value.code == 2
