"""A small review world: a running writer session with an open run and a chapter draft,
human reviewers and a manager, and helpers for gates, agent reviewers and verdicts.

Everything goes through the real actions (and the real PostgreSQL); nothing is mocked.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password

from novelforge_sessions.access import Caller
from novelforge_sessions.actions import artifacts, runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.apikit.auth import caller_for_token
from novelforge_sessions.models import ArtifactVersion, Membership, Project, Run, Session
from reviews import actions
from reviews.models import ReviewGate
from tests.support.factories import Api

RUBRIC: dict[str, Any] = {
    "criteria": [
        {"key": "clarity", "label": "Clarity", "scale": {"min": 1, "max": 5}, "description": "Can a reader follow every sentence?"},
        {"key": "pacing", "label": "Pacing", "scale": {"min": 0, "max": 10}, "description": "Does the scene move?"},
    ],
    "evidence": ["style_guide"],
}
CHAPTER = (
    "The lamp had not failed in forty years.\n"
    "Tonight it flickered twice, and Mara counted the seconds between.\n"
    "\n"
    "Below, the sea kept its own time."
)
PASSWORD = "review-pass-123"


@dataclass
class World:
    project: Project
    writer: Session
    run: Run
    version: ArtifactVersion
    writer_caller: Caller
    writer_api: Api
    users: dict[str, Any] = field(default_factory=dict)

    def gate(self, route: str = "page", reviewers: list[str] | None = None, **kw: Any) -> ReviewGate:
        spec = actions.GateSpec(
            candidate_version_id=kw.pop("candidate_version_id", self.version.id),
            rubric=kw.pop("rubric", RUBRIC),
            route=route,
            reviewers=(["alice"] if reviewers is None and route != "agent" else (reviewers or [])),
            **kw,
        )
        return actions.open_gate(self.writer_caller, self.writer.id, spec)

    def refresh(self) -> None:
        self.writer.refresh_from_db()
        self.run.refresh_from_db()


@cache
def _password_hash() -> str:
    """Hash the shared password once per process (PBKDF2 is slow on purpose)."""
    return make_password(PASSWORD)


def make_user(project: Project, username: str, role: str) -> Any:
    user = get_user_model().objects.create(username=username, password=_password_hash())
    Membership.objects.create(user=user, project=project, role=role)
    return user


def citing(version) -> list[dict[str, Any]]:
    """Frozen inputs that give a run's session ``version``'s artifact (id and fingerprint): a
    session-bound token opens a gate only on a version within its reach. Only a caller that
    already reaches the version may cite it (:func:`orchestrator`, the artifact's own session)."""
    return [{"artifact_id": version.artifact_id, "fingerprint": version.fingerprint}]


def orchestrator(project: Project) -> Caller:
    """An unbound caller of the project: it reaches every artifact, so it gives a session one by
    citing it (e.g. ``start_run(orchestrator(p), s.id, frozen_inputs=citing(v))``)."""
    return Caller(label="test:setup", project_ids=frozenset({project.id}), permissions=frozenset({"read", "write"}),
                  project=project)


def add_writer(project: Project) -> tuple[Session, str]:
    """A writer session with a live runtime and a token bound to it."""
    setup = orchestrator(project)
    writer = sessions.create_session(
        setup,
        sessions.NewSession(role="writer", memory_policy="session", task_mode="drafting", runtime_family="claude-code"),
        runtime=RuntimeSpec(runtime_family="claude-code", capabilities=["draft"], lease_seconds=600),
    )
    _, raw = create_token(project, name=f"writer-{writer.id}", permissions=["read", "write"], session=writer)
    return writer, raw


def make_world(project: Project, *, cursor: dict | None = None, frozen_inputs: list | None = None) -> World:
    writer, raw = add_writer(project)
    writer_caller = caller_for_token(raw)
    artifact = artifacts.create_artifact(writer_caller, name="chapter-01", kind="chapter", content=CHAPTER)
    run = runs.start_run(writer_caller, writer.id, cursor=cursor or {"step": "draft"}, frozen_inputs=frozen_inputs)
    writer.refresh_from_db()
    world = World(
        project=project, writer=writer, run=run, version=artifact.current_version, writer_caller=writer_caller,
        writer_api=Api(raw),
    )
    world.users = {
        "alice": make_user(project, "alice", "reviewer"),
        "bob": make_user(project, "bob", "reviewer"),
        "mia": make_user(project, "mia", "manager"),
    }
    return world


def agent_reviewer(project: Project, *, memory: str = "none", role: str = "semantic_reviewer",
                   permissions: tuple[str, ...] = ("review",), bound: bool = True) -> tuple[Session, Api]:
    setup = Caller(label="test:setup", project_ids=frozenset({project.id}), permissions=frozenset({"write"}),
                   project=project)
    session = sessions.create_session(
        setup, sessions.NewSession(role=role, memory_policy=memory, task_mode="review", runtime_family="codex"),
        runtime=RuntimeSpec(runtime_family="codex", capabilities=["review"], lease_seconds=600),
    )
    _, raw = create_token(project, name=f"reviewer-{session.id}", permissions=list(permissions),
                          session=session if bound else None)
    return session, Api(raw)


def verdict_for(gate: ReviewGate, **overrides: Any) -> dict[str, Any]:
    body = {
        "packet_fingerprint": gate.packet.fingerprint,
        "artifact_fingerprint": gate.candidate_fingerprint,
        "decision": "revise",
        "scores": {"clarity": 4, "pacing": 6},
        # L1: a line every candidate has (locations are checked against the candidate's lines).
        "findings": [{"location": "L1", "severity": "minor", "note": "'not failed in forty years' — since when?"}],
        "confidence": 0.7,
    }
    body.update(overrides)
    return body


def agent_verdict(gate: ReviewGate, fencing_token: int = 1, **overrides: Any) -> dict[str, Any]:
    """An agent reviewer's verdict body: the verdict plus its claim's fencing token (1 = the first claim)."""
    return {**verdict_for(gate, **overrides), "fencing_token": fencing_token}
