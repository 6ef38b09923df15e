"""Fixtures for the client tests: one real daphne server (for the whole package) against the test
database, and tokens."""
from __future__ import annotations

import pytest

from novelforge_sessions.actions.tokens import create_token

from tests.support.servers import DaphneServer


@pytest.fixture(scope="package")
def server(django_db_setup, django_db_blocker):
    srv = DaphneServer(extra_env={"SHUTDOWN_GRACE_SECONDS": "1"})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def graph_server(django_db_setup, django_db_blocker):
    """A server of the LangGraph checkpointer's own for each test module that asks for it."""
    srv = DaphneServer()
    yield srv
    srv.stop()


@pytest.fixture
def graph_token(project) -> str:
    return create_token(project, name="graph", permissions=["read", "write"])[1]


@pytest.fixture
def token(project):
    """An agent token: read and write."""
    _, raw = create_token(project, name="agent", permissions=["read", "write"])
    return raw


@pytest.fixture
def worker_token(project):
    _, raw = create_token(project, name="worker", permissions=["read", "work"])
    return raw
