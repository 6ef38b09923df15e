"""Control-plane fixtures: personas by permission, and a running session with a frozen job."""
from __future__ import annotations

from typing import Any

import pytest

from novelforge_sessions.actions.tokens import create_token
from tests.support.factories import Api
from tests.support.responses import ok


def token_api(project, name: str, permissions: list[str], session_id: int | None = None) -> Api:
    from novelforge_sessions.models import Session

    session = Session.objects.get(id=session_id) if session_id else None
    _, raw = create_token(project, name=name, permissions=permissions, session=session)
    return Api(raw)


@pytest.fixture
def worker(project) -> Api:
    """A worker: may claim handoffs and deliver results, and read."""
    return token_api(project, "worker", ["read", "work"])


@pytest.fixture
def writer(project) -> Api:
    """An agent that writes (sessions, runs, handoffs, intents) but cannot approve."""
    return token_api(project, "writer", ["read", "write"])


@pytest.fixture
def manager(project) -> Api:
    """A manager's token: reads and approves; cannot write."""
    return token_api(project, "manager", ["read", "approve"])


def make_artifact(api: Api, name: str = "chapter-1", content: str = "It was a dark night.") -> dict:
    return ok(api.post("/artifacts", {"name": name, "content": content}), 201)


def make_handoff(api: Api, run_id: int, logical_id: str = "job-1", **body: Any) -> dict:
    return ok(api.post(f"/runs/{run_id}/handoffs", {"logical_id": logical_id, **body}), 201)


def claim(api: Api, capabilities: list[str] | None = None, worker: str = "w1", **body: Any) -> dict | None:
    return ok(api.post("/handoffs/claim", {"worker": worker, "capabilities": capabilities or [], **body}))["handoff"]


def deliver(api: Api, handoff: dict, result: dict, *, token: int | None = None, job: str | None = None):
    return api.post(
        f"/handoffs/{handoff['id']}/results",
        {"fencing_token": token or handoff["fencing_token"], "job_fingerprint": job or handoff["job_fingerprint"],
         "result": result},
    )


@pytest.fixture
def running(owner, new_session) -> dict:
    """A running session (live runtime, open run) of the owner."""
    return new_session(run=True)


@pytest.fixture
def frozen(owner, running) -> dict:
    """A running session that handed off one job over one artifact version."""
    art = make_artifact(owner)
    handoff = make_handoff(
        owner, running["run"]["id"], "chapter-1/continuity",
        inputs=[{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}],
        params={"task": "check continuity"}, result_schema={"verdict": "string"},
        required_capabilities=["continuity"], timeout_seconds=60,
    )
    return {"session": running, "run": running["run"], "artifact": art, "handoff": handoff}


class Statements:
    """Count the SQL statements of a block, leaving out the SAVEPOINT bookkeeping that the
    test's own wrapping transaction adds (in production the action's atomic() is the outer
    transaction: BEGIN/COMMIT, not counted by Django either)."""

    def __init__(self) -> None:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        self._ctx = CaptureQueriesContext(connection)

    def __enter__(self) -> "Statements":
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)

    @property
    def sql(self) -> list[str]:
        return [q["sql"] for q in self._ctx.captured_queries if "SAVEPOINT" not in q["sql"]]

    def __len__(self) -> int:
        return len(self.sql)
