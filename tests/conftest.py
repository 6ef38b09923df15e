"""Shared fixtures: personas (owner token, read-only token, outsider in another project),
and an API client that speaks JSON with a bearer token. Everything runs on real PostgreSQL."""
from __future__ import annotations

import json
import os
from typing import Any

# The event log's ordering rule is verified on every write of the suite (novelforge_sessions.events:
# each session's events under its ordering lock, taken before the transaction's first write).
# Set before any server process starts, so the daphnes the live tests start check it too.
os.environ.setdefault("NOVELFORGE_EVENT_ORDER_CHECKS", "1")

import pytest
from django.test import Client

from novelforge_sessions.access import Caller
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.models import Project


@pytest.fixture(autouse=True)
def _no_recalled_tokens():
    """Each test starts with no token recalled from an earlier one (apikit/auth.py)."""
    from novelforge_sessions.apikit.auth import forget_recalled

    forget_recalled()
    yield
    forget_recalled()


class Api:
    """A tiny JSON client bound to one bearer token."""

    def __init__(self, token: str | None) -> None:
        self.client = Client()
        self.token = token

    def _headers(self) -> dict[str, str]:
        return {"HTTP_AUTHORIZATION": f"Bearer {self.token}"} if self.token else {}

    def get(self, path: str, **params: Any):
        return self.client.get(f"/api/v1{path}", params, **self._headers())

    def post(self, path: str, body: Any = None, *, raw: str | bytes | None = None):
        data = raw if raw is not None else json.dumps(body if body is not None else {})
        return self.client.post(f"/api/v1{path}", data=data, content_type="application/json", **self._headers())

    def delete(self, path: str):
        return self.client.delete(f"/api/v1{path}", **self._headers())


def make_project(slug: str, **kw: Any) -> Project:
    defaults = {"name": slug.title(), "lock_fingerprint": "sha256:" + "a" * 64, "framework_version": "1"}
    defaults.update(kw)
    return Project.objects.create(slug=slug, **defaults)


def caller_for(project: Project, permissions: list[str] | None = None) -> Caller:
    return Caller(
        label=f"test:{project.slug}", project_ids=frozenset({project.id}),
        permissions=frozenset(permissions or ALL_PERMISSIONS), project=project,
    )


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


SESSION = {"role": "writer", "memory_policy": "bounded", "task_mode": "drafting", "runtime_family": "claude-code"}
RUNTIME = {"runtime_family": "claude-code", "capabilities": ["draft"], "lease_seconds": 60}


@pytest.fixture
def new_session(owner):
    """Factory: create a session through the API, optionally attached and running."""

    def make(*, attach: bool = True, run: bool = False, **overrides: Any) -> dict:
        body = {**SESSION, **overrides}
        if attach:
            body["runtime"] = RUNTIME
        resp = owner.post("/sessions", body)
        assert resp.status_code == 201, resp.content
        session = resp.json()
        if run:
            r = owner.post(f"/sessions/{session['id']}/runs", {"cursor": {"step": "start"}})
            assert r.status_code == 201, r.content
            session = owner.get(f"/sessions/{session['id']}").json()
            session["run"] = r.json()
        return session

    return make
