"""The admin renders every model for a superuser; runtime records are read-only there."""
from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from novelforge_sessions.models import ApiToken, Project, Session

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    call_command("load_demo", stdout=open("/dev/null", "w"))
    user = get_user_model().objects.create_superuser("root", "root@example.invalid", "pw-123456789")
    client = Client()
    client.force_login(user)
    return client


def test_every_registered_model_lists_and_shows(staff):
    for model, model_admin in admin.site._registry.items():
        meta = model._meta
        changelist = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        assert staff.get(changelist).status_code == 200, changelist
        obj = model.objects.first()
        if obj is not None:
            change = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk])
            assert staff.get(change).status_code == 200, change


def test_runtime_records_cannot_be_edited_in_the_admin(staff):
    session = Session.objects.exclude(status="completed").first()
    before = (session.status, session.version)
    url = reverse("admin:novelforge_sessions_session_change", args=[session.pk])
    assert staff.post(url, {"status": "completed"}).status_code == 403
    session.refresh_from_db()
    assert (session.status, session.version) == before
    assert staff.get(reverse("admin:novelforge_sessions_session_add")).status_code == 403


def test_creating_a_token_in_the_admin_shows_the_secret_once_and_stores_a_hash(staff):
    project = Project.objects.get(slug="demo-novel")
    resp = staff.post(
        reverse("admin:novelforge_sessions_apitoken_add"),
        {"name": "from-admin", "project": project.pk, "permissions": '["read"]', "revoked_at_0": "", "revoked_at_1": ""},
        follow=True,
    )
    assert resp.status_code == 200
    shown = re.findall(r"nfs_[A-Za-z0-9_-]{20,}", resp.content.decode())
    assert len(shown) == 1
    token = ApiToken.objects.get(name="from-admin")
    assert token.key_hash == ApiToken.hash_key(shown[0]) and token.permissions == ["read"]
