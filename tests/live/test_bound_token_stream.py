"""Session-bound tokens on the live stream reach what BOUND_TOKEN_MATRIX says (docs/model.md#access,
for websockets): a project subscription carries only the token's own session's events
(``event`` is an own-session kind, never widened by the ``project`` permission), a reviewer's
token sees nothing of the writer it reviews, and any other session's stream is refused (4403)."""
from __future__ import annotations

import pytest

from novelforge_sessions.access import BOUND_TOKEN_MATRIX, PROJECT_WIDE, Reach
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.models import Session
from tests.support.factories import SESSION, make_project
from tests.live.conftest import api_post

pytestmark = pytest.mark.django_db(transaction=True)

REVIEWER = {"role": "semantic_reviewer", "memory_policy": "none", "task_mode": "review", "runtime_family": "codex"}


@pytest.fixture
def project_with_sessions(ws_server):
    project = make_project("alpha")
    _, owner = create_token(project, name="owner", permissions=ALL_PERMISSIONS)
    writer = api_post(ws_server, owner, "/sessions", SESSION)
    reviewer = api_post(ws_server, owner, "/sessions", REVIEWER)
    return project, owner, writer, reviewer


def test_the_matrix_keeps_events_to_the_bound_session():
    rule = BOUND_TOKEN_MATRIX["event"]
    assert rule.bound == Reach.OWN_SESSION and rule.path == "session_id" and not rule.widened


@pytest.mark.parametrize("permissions", [["read", "review"], ["read", "review", PROJECT_WIDE]],
                         ids=["reviewer", "reviewer-with-project"])
def test_a_bound_reviewer_token_streams_only_its_own_session(ws_server, open_socket, project_with_sessions, permissions):
    project, owner, writer, reviewer = project_with_sessions
    _, bound = create_token(project, name="rev", permissions=permissions, session=Session.objects.get(id=reviewer["id"]))
    sock = open_socket(ws_server, token=bound)
    backlog = sock.subscribe(project_id=project.id, after=0)
    assert backlog and {e["session_id"] for e in backlog} == {reviewer["id"]}
    # The writer's news first, then the reviewer's own: only the latter arrives.
    api_post(ws_server, owner, f"/sessions/{writer['id']}/transcript", {"role": "user", "content": "the writer's"})
    api_post(ws_server, owner, f"/sessions/{reviewer['id']}/transcript", {"role": "user", "content": "yours"})
    event = sock.next_event()
    assert event["session_id"] == reviewer["id"]

    for target in ({"session_id": writer["id"]}, {"project_id": make_project("beta").id}):
        refused = open_socket(ws_server, token=bound)
        refused.send({"type": "subscribe", **target})
        assert refused.closed_with()[0] == 4403, target


def test_a_bound_token_in_the_auth_frame_gets_the_same_reach(ws_server, open_socket, project_with_sessions):
    project, owner, writer, reviewer = project_with_sessions
    _, bound = create_token(project, name="w", permissions=["read", "write", PROJECT_WIDE],
                            session=Session.objects.get(id=writer["id"]))
    sock = open_socket(ws_server)
    sock.send({"type": "auth", "token": bound})
    assert sock.recv()["type"] == "authenticated"
    backlog = sock.subscribe(project_id=project.id, after=0)
    assert backlog and {e["session_id"] for e in backlog} == {writer["id"]}
    sock.send({"type": "subscribe", "session_id": reviewer["id"]})
    assert sock.closed_with()[0] == 4403
