"""Shared fixtures: personas (owner token, read-only token, outsider in another project),
each an API client that speaks JSON with a bearer token, and sessions built through the API.
The builders themselves are in ``tests/support/factories.py``. Everything runs on real PostgreSQL."""
from __future__ import annotations

import gc
import os
import sys
from typing import Any

# The event log's ordering rule is verified on every write of the suite (novelforge_sessions.events:
# each session's events under its ordering lock, taken before the transaction's first write).
# Set before any server process starts, so the daphnes the live tests start check it too.
os.environ.setdefault("NOVELFORGE_EVENT_ORDER_CHECKS", "1")

import pytest

from novelforge_sessions.access import Caller
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.models import Project
from tests.support.factories import Api, api_session, caller_for, make_project


@pytest.fixture(scope="session", autouse=True)
def _compiled_catalogs():
    """The pages' translations compiled, as scripts/bootstrap.sh does (a fresh clone has no .mo:
    they are never committed), before any test or server process reads them. Only what changed
    is compiled; without GNU gettext's msgfmt this fails with Django's message naming it."""
    from django.core.management import call_command

    call_command("compilemessages", ignore_patterns=["*"], verbosity=0)


@pytest.fixture(scope="session", autouse=True)
def _connections_closed(django_db_setup):
    """The lean API's threads of the application served in this process (``novelforge_sessions.asgi``,
    imported by the tests that serve it in-process) keep their database connections for their life:
    they are stopped, their connections closed, before the test database is dropped (else the drop
    finds the database in use). A thread of a test that ended with a connection open left it to the
    collector (a connection is in reference cycles), whose thresholds ``novelforge_sessions.asgi``
    raises: collected now too."""
    yield
    served = sys.modules.get("novelforge_sessions.asgi")
    if served is not None:
        served.lean_api.pool.shutdown()
    gc.collect()


@pytest.fixture(autouse=True)
def _default_language():
    """Each test starts and ends in the default language: a page request in Chinese through the test
    client leaves Chinese active in the thread (LocaleMiddleware activates it for its request)."""
    from django.utils import translation

    translation.deactivate()
    yield
    translation.deactivate()


@pytest.fixture(autouse=True)
def _no_recalled_tokens():
    """Each test starts with no token recalled from an earlier one (apikit/auth.py)."""
    from novelforge_sessions.apikit.auth import forget_recalled

    forget_recalled()
    yield
    forget_recalled()


@pytest.fixture
def project(db) -> Project:
    return make_project("novel")


@pytest.fixture
def other_project(db) -> Project:
    return make_project("other")


@pytest.fixture
def owner(project) -> Api:
    """An agent with every permission on ``project``."""
    _, raw = create_token(project, name="owner", permissions=ALL_PERMISSIONS)
    return Api(raw)


@pytest.fixture
def reader(project) -> Api:
    _, raw = create_token(project, name="reader", permissions=["read"])
    return Api(raw)


@pytest.fixture
def outsider(other_project) -> Api:
    """An agent with every permission, but on another project."""
    _, raw = create_token(other_project, name="outsider", permissions=ALL_PERMISSIONS)
    return Api(raw)


@pytest.fixture
def caller(project) -> Caller:
    return caller_for(project)


@pytest.fixture
def new_session(owner):
    """Factory: create a session through the API, optionally attached and running."""

    def make(*, attach: bool = True, run: bool = False, **overrides: Any) -> dict:
        return api_session(owner, attach=attach, run=run, **overrides)

    return make
