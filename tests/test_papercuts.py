"""Deployment papercuts: a page reached by an address outside ALLOWED_HOSTS answers a 400 in plain
words (one log line, no traceback) while the probes answer it; ``/favicon.ico`` is the static icon;
the admin says "Transcript entries"; an approved write intent is no longer counted as awaiting
approval. (SECRET_KEY's one rule: tests/test_deploy_security.py and tests/test_service.py.)"""
from __future__ import annotations

import logging

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from novelforge_sessions.control import intents
from novelforge_sessions.models import Membership, TranscriptEntry
from tests.support.factories import caller_for

SECURITY_LOGGER = "django.security.DisallowedHost"


@pytest.mark.django_db
def test_a_page_by_ip_is_a_plain_400_in_one_log_line_and_the_probes_answer(caplog):
    by_ip = Client(HTTP_HOST="10.0.3.7:8000")
    with caplog.at_level(logging.INFO):
        page = by_ip.get("/login/")
        healthz, readyz = by_ip.get("/healthz"), by_ip.get("/readyz")
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html")
    html = page.content.decode()
    assert "<h1>Bad request</h1>" in html and "ALLOWED_HOSTS" in html and "10.0.3.7" not in html
    assert healthz.status_code == 200 and readyz.status_code == 200
    [record] = [r for r in caplog.records if r.name == SECURITY_LOGGER]
    assert record.exc_info is None and "\n" not in record.getMessage()


@pytest.mark.django_db
def test_the_favicon_is_served_on_every_allowed_host():
    resp = Client().get("/favicon.ico")
    assert resp.status_code == 200 and resp["Content-Type"] == "image/x-icon"
    assert resp.content[:4] == b"\x00\x00\x01\x00"  # an ICO header
    assert Client().post("/favicon.ico").status_code == 405
    assert '<link rel="icon" href="/favicon.ico"' in Client().get("/login/").content.decode()


@pytest.mark.django_db
def test_the_admin_says_transcript_entries():
    assert TranscriptEntry._meta.verbose_name_plural == "transcript entries"
    admin = get_user_model().objects.create_superuser("root", password="pw-root-123456")
    client = Client()
    client.force_login(admin)
    html = client.get("/admin/").content.decode()
    assert "Transcript entries" in html and "Transcript entrys" not in html


@pytest.mark.django_db
def test_after_approval_the_box_no_longer_says_awaiting_approval(project, django_user_model):
    from novelforge_sessions.actions import artifacts

    manager = django_user_model.objects.create_user("mgr", password="pw-mgr-123456")
    Membership.objects.create(user=manager, project=project, role=Membership.Role.MANAGER)
    who = caller_for(project)
    chapter = artifacts.create_artifact(who, name="chapter-9", kind="chapter", content="one")
    v2 = artifacts.add_artifact_version(who, chapter.id, content="two")
    before = intents.read_before_state(who, kind="artifact.make_current", artifact_id=chapter.id)
    intent = intents.create_intent(who, kind="artifact.make_current", idempotency_key="k-9",
                                   before_fingerprint=before.fingerprint, params={"version_id": v2.id},
                                   artifact_id=chapter.id).intent
    client = Client()
    client.force_login(manager)
    html = client.get(f"/projects/{project.id}/").content.decode()
    assert "1 awaiting approval · 0 approved" in html
    token = client.cookies["csrftoken"].value
    resp = client.post(f"/projects/{project.id}/intents/{intent.id}/approve/",
                       {"csrfmiddlewaretoken": token})
    assert resp.status_code == 302
    html = client.get(f"/projects/{project.id}/").content.decode()
    assert "0 awaiting approval · 1 approved" in html and "Write intents awaiting approval" not in html
