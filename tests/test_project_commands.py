"""Projects and their people without the admin: ``create_project`` and
``add_member`` create what is missing, change nothing on a second run, and refuse before writing."""
from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from novelforge_sessions.models import Membership, Project
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db
User = get_user_model()


def _run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def _roles(slug: str) -> set[tuple[str, str]]:
    return set(Membership.objects.filter(project__slug=slug).values_list("user__username", "role"))


def test_create_project_creates_the_project_its_users_and_their_roles_once(monkeypatch):
    monkeypatch.setenv("NOVELFORGE_PASSWORD_CAROL_2", "carol-secret-pass")
    args = ("create_project", "my-novel", "--name", "My Novel", "--manager", "alice",
            "--reviewer", "bob", "--reviewer", "carol.2", "--password", "alice=alice-secret-pass",
            "--password", "bob=bob-secret-pass")
    out = _run(*args)
    assert "project my-novel created" in out
    project = Project.objects.get(slug="my-novel")
    assert project.name == "My Novel"
    assert _roles("my-novel") == {("alice", "manager"), ("bob", "reviewer"), ("carol.2", "reviewer")}
    assert User.objects.get(username="carol.2").check_password("carol-secret-pass")
    assert Client().login(username="alice", password="alice-secret-pass")
    hashes = dict(User.objects.values_list("username", "password"))

    before = snapshot(include=['auth.User'])
    out = _run(*args[:-4])  # again, without the passwords: the users exist, nothing changes
    assert "project my-novel exists" in out and "created user" not in out and "is now" not in out
    assert snapshot(include=['auth.User']) == before
    assert dict(User.objects.values_list("username", "password")) == hashes, "passwords kept"


def test_create_project_refuses_a_new_user_without_a_password_and_writes_nothing():
    before = snapshot(include=['auth.User'])
    with pytest.raises(CommandError, match="NOVELFORGE_PASSWORD_DAVE"):
        call_command("create_project", "other-novel", "--manager", "dave")
    with pytest.raises(CommandError, match="too short"):
        call_command("create_project", "other-novel", "--manager", "dave", "--password", "dave=short")
    with pytest.raises(CommandError, match="invalid slug"):
        call_command("create_project", "not a slug", "--manager", "dave", "--password", "dave=dave-secret-pass")
    assert snapshot(include=['auth.User']) == before


def test_add_member_gives_an_existing_or_new_user_a_role_once():
    _run("create_project", "my-novel", "--manager", "alice", "--password", "alice=alice-secret-pass")
    out = _run("add_member", "my-novel", "alice", "--role", "reviewer")
    assert "alice is now reviewer of my-novel" in out
    out = _run("add_member", "my-novel", "erin", "--role", "reviewer", "--password", "erin=erin-secret-pass")
    assert "created user erin" in out
    assert _roles("my-novel") == {("alice", "manager"), ("alice", "reviewer"), ("erin", "reviewer")}
    before = snapshot(include=['auth.User'])
    assert "erin already is reviewer of my-novel" in _run("add_member", "my-novel", "erin", "--role", "reviewer")
    assert snapshot(include=['auth.User']) == before


def test_add_member_refuses_before_writing():
    _run("create_project", "my-novel")
    before = snapshot(include=['auth.User'])
    with pytest.raises(CommandError, match="no project with slug 'nope'"):
        call_command("add_member", "nope", "frank", "--role", "manager", "--password", "frank=frank-secret-pass")
    with pytest.raises(CommandError, match="NOVELFORGE_PASSWORD_FRANK"):
        call_command("add_member", "my-novel", "frank", "--role", "manager")
    with pytest.raises(CommandError):
        call_command("add_member", "my-novel", "frank", "--role", "owner", "--password", "frank=frank-secret-pass")
    assert snapshot(include=['auth.User']) == before
