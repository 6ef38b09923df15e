"""Builders of the suite's records: projects, callers, the API client, sessions with a run.

``tests/conftest.py`` turns them into fixtures (``project``, ``owner``, ``new_session``…).
"""
from __future__ import annotations

import json
from typing import Any

from django.test import Client

from novelforge_sessions.access import Caller
from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS
from novelforge_sessions.models import Project, Session

#: A new session's body (POST /sessions) and its runtime's.
SESSION = {"role": "writer", "memory_policy": "bounded", "task_mode": "drafting", "runtime_family": "claude-code"}
RUNTIME = {"runtime_family": "claude-code", "capabilities": ["draft"], "lease_seconds": 60}


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


def api_session(api: Api, *, attach: bool = True, run: bool = False, **overrides: Any) -> dict:
    """A session created through the API (``SESSION`` with ``overrides``), with a runtime
    (``attach``) and an open run (``run``: its body is under ``"run"``)."""
    body = {**SESSION, **overrides}
    if attach:
        body["runtime"] = RUNTIME
    resp = api.post("/sessions", body)
    assert resp.status_code == 201, resp.content
    session = resp.json()
    if run:
        r = api.post(f"/sessions/{session['id']}/runs", {"cursor": {"step": "start"}})
        assert r.status_code == 201, r.content
        session = api.get(f"/sessions/{session['id']}").json()
        session["run"] = r.json()
    return session


def running_session(who: Caller | Project | str, *, runtime_family: str = "cli", task_mode: str = "drafting",
                    capabilities: list[str] | None = None, cursor: dict[str, Any] | None = None) -> Session:
    """A running session built by the actions: a live runtime and an open run.

    ``who``: a caller, a project (its caller with every permission) or a new project's slug.
    Returns the session as stored after the run started; its run is ``session.started_run``.
    """
    if isinstance(who, str):
        who = make_project(who)
    if isinstance(who, Project):
        who = caller_for(who)
    s = sessions.create_session(
        who, sessions.NewSession(role="writer", memory_policy="bounded", task_mode=task_mode,
                                 runtime_family=runtime_family),
        runtime=RuntimeSpec(runtime_family=runtime_family, capabilities=capabilities or []),
    )
    run = runs.start_run(who, s.id, cursor=cursor if cursor is not None else {"step": 0})
    session = Session.objects.get(id=s.id)
    session.started_run = run
    session.caller = who
    return session
