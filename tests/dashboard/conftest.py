"""Personas for the manager pages: a manager of ``project``, a manager of ``other_project``,
a reviewer, and sessions in known states made through the actions."""
from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from novelforge_sessions.actions import runs
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.sessions import NewSession, create_session
from novelforge_sessions.models import Membership, Project, Session
from tests.support.factories import SESSION, caller_for

PASSWORD = "correct-horse-battery"


def make_user(username: str, project: Project | None = None, role: str = Membership.Role.MANAGER):
    user = get_user_model().objects.create_user(username, password=PASSWORD)
    if project is not None:
        Membership.objects.create(user=user, project=project, role=role)
    return user


def logged_in(user, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


@pytest.fixture
def manager(project):
    return make_user("manager", project)


@pytest.fixture
def other_manager(other_project):
    return make_user("other-manager", other_project)


@pytest.fixture
def mgr_client(manager) -> Client:
    """A manager's browser session (CSRF enforced, as for a real browser)."""
    return logged_in(manager, csrf=True)


@pytest.fixture
def make_session(project):
    """Factory: a session of ``project``, optionally attached and running, through the actions."""

    def make(*, attach: bool = True, run: bool = False, in_project: Project | None = None, **overrides: Any) -> Session:
        target = in_project or project
        who = caller_for(target)
        spec = NewSession(**{**SESSION, **overrides})
        runtime = RuntimeSpec(runtime_family=spec.runtime_family, capabilities=["draft"], lease_seconds=600) if attach else None
        session = create_session(who, spec, runtime=runtime)
        if run:
            runs.start_run(who, session.id, cursor={"step": "start"})
        session.refresh_from_db()
        return session

    return make


def csrf_token(client: Client, url: str) -> str:
    """GET a page (which sets the CSRF cookie) and return the token a form would post."""
    resp = client.get(url)
    assert resp.status_code == 200
    return client.cookies["csrftoken"].value
