"""Who may open the stream and what they receive: cookies, tokens, Origin, malformed frames."""
from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.models import Event, Membership
from tests.support.factories import SESSION, make_project
from tests.live.conftest import api_post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def two_projects():
    a, b = make_project("alpha"), make_project("beta")
    _, token_a = create_token(a, name="a", permissions=ALL_PERMISSIONS)
    _, token_b = create_token(b, name="b", permissions=ALL_PERMISSIONS)
    return a, b, token_a, token_b


def manager_cookie(project) -> str:
    """Log a manager of ``project`` in and return their session cookie header."""
    user = get_user_model().objects.create_user(f"mgr-{project.slug}", password="pw-123456789")
    Membership.objects.create(user=user, project=project, role=Membership.Role.MANAGER)
    client = Client()
    assert client.login(username=user.username, password="pw-123456789")
    return f"sessionid={client.cookies['sessionid'].value}"


def test_an_anonymous_socket_is_closed_with_4401_and_sees_nothing(ws_server, open_socket, two_projects):
    a, *_ = two_projects
    sock = open_socket(ws_server)
    sock.send({"type": "subscribe", "project_id": a.id, "after": 0})
    code, frames = sock.closed_with()
    assert code == 4401
    assert [f["type"] for f in frames] == ["error"] and frames[0]["error"]["code"] == "unauthorized"


def test_a_bad_bearer_token_is_closed_with_4401(ws_server, open_socket):
    code, frames = open_socket(ws_server, token="nfs_not-a-real-token").closed_with()
    assert code == 4401 and frames[0]["error"]["code"] == "unauthorized"


def test_a_token_in_the_first_message_authenticates(ws_server, open_socket, two_projects):
    a, _, token_a, _ = two_projects
    session = api_post(ws_server, token_a, "/sessions", SESSION)
    sock = open_socket(ws_server)
    sock.send({"type": "auth", "token": token_a})
    assert sock.recv()["type"] == "authenticated"
    backlog = sock.subscribe(project_id=a.id, after=0)
    assert [e["session_id"] for e in backlog] == [session["id"]]


@pytest.mark.parametrize("origin", ["http://evil.example", "http://127.0.0.1.evil.example"])
def test_a_foreign_origin_is_refused_at_the_handshake(ws_server, two_projects, origin):
    _, _, token_a, _ = two_projects
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_server.ws_url + "/ws/events/", origin=origin,
                additional_headers={"Authorization": f"Bearer {token_a}"}, open_timeout=10)
    assert refused.value.response.status_code == 403


def test_a_socket_without_origin_is_refused(ws_server, two_projects):
    _, _, token_a, _ = two_projects
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_server.ws_url + "/ws/events/", additional_headers={"Authorization": f"Bearer {token_a}"},
                open_timeout=10)
    assert refused.value.response.status_code == 403


def test_a_manager_of_a_receives_nothing_of_b(ws_server, open_socket, two_projects):
    a, b, token_a, token_b = two_projects
    session_b = api_post(ws_server, token_b, "/sessions", SESSION)
    cookie = manager_cookie(a)

    refused = open_socket(ws_server, cookie=cookie)
    refused.send({"type": "subscribe", "project_id": b.id, "after": 0})
    code, frames = refused.closed_with()
    assert code == 4403 and frames[-1]["error"]["code"] == "forbidden"
    assert not any(f["type"] == "event" for f in frames)

    refused = open_socket(ws_server, cookie=cookie)
    refused.send({"type": "subscribe", "session_id": session_b["id"], "after": 0})
    assert refused.closed_with()[0] == 4403

    sock = open_socket(ws_server, cookie=cookie)
    assert sock.subscribe(project_id=a.id, after=0) == []
    api_post(ws_server, token_b, f"/sessions/{session_b['id']}/transcript", {"role": "user", "content": "in b"})
    marker = api_post(ws_server, token_a, "/sessions", SESSION)
    first = sock.next_event()
    assert first["project_id"] == a.id and first["session_id"] == marker["id"] and first["type"] == "session.created"
    assert Event.objects.filter(project=b, id__lt=first["id"]).count() >= 2, "b's events committed before the marker"


def test_a_token_cannot_subscribe_to_another_project(ws_server, open_socket, two_projects):
    _, b, token_a, _ = two_projects
    sock = open_socket(ws_server, token=token_a)
    sock.send({"type": "subscribe", "project_id": b.id})
    assert sock.closed_with()[0] == 4403


def test_a_session_bound_token_sees_only_its_session(ws_server, open_socket, two_projects):
    from novelforge_sessions.models import Session

    a, _, token_a, _ = two_projects
    mine = api_post(ws_server, token_a, "/sessions", SESSION)
    other = api_post(ws_server, token_a, "/sessions", SESSION)
    _, bound = create_token(a, name="bound", permissions=["read", "write"], session=Session.objects.get(id=mine["id"]))
    sock = open_socket(ws_server, token=bound)
    backlog = sock.subscribe(project_id=a.id, after=0)
    assert backlog and {e["session_id"] for e in backlog} == {mine["id"]}
    api_post(ws_server, token_a, f"/sessions/{other['id']}/transcript", {"role": "user", "content": "not yours"})
    api_post(ws_server, token_a, f"/sessions/{mine['id']}/transcript", {"role": "user", "content": "yours"})
    assert sock.next_event()["session_id"] == mine["id"]

    refused = open_socket(ws_server, token=bound)
    refused.send({"type": "subscribe", "session_id": other["id"]})
    assert refused.closed_with()[0] == 4403


def test_a_token_without_read_permission_cannot_subscribe(ws_server, open_socket, two_projects):
    a, *_ = two_projects
    _, worker = create_token(a, name="worker", permissions=["work"])
    sock = open_socket(ws_server, token=worker)
    sock.send({"type": "subscribe", "project_id": a.id})
    assert sock.closed_with()[0] == 4403


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{not json", 4400),
        (b"\x00\x01binary", 4400),
        ('["a list"]', 4400),
        ('{"type": "dance"}', 4400),
        ('{"type": "subscribe", "project_id": 1, "session_id": 2}', 4400),
        ('{"type": "subscribe", "project_id": "1"}', 4400),
        ('{"type": "subscribe", "project_id": 1, "after": -5}', 4400),
        ('{"type": "subscribe", "project_id": true}', 4400),
        ('{"type": "subscribe", "project_id": 1, "after": 99999999999999999999999}', 4400),
        ('{"type": "subscribe", "project_id": 1, "batch": "yes"}', 4400),
        ('{"type": "subscribe", "project_id": 1, "batch": 1}', 4400),
        ('{"type": "ping", "pad": "' + "x" * 5000 + '"}', 4413),
    ],
    ids=["bad-json", "binary", "not-object", "unknown-type", "both-ids", "string-id", "negative-after", "bool-id",
         "huge-after", "string-batch", "number-batch", "oversized"],
)
def test_malformed_frames_close_the_socket_with_a_proper_code(ws_server, open_socket, two_projects, frame, code):
    _, _, token_a, _ = two_projects
    sock = open_socket(ws_server, token=token_a)
    sock.send(frame)
    got, frames = sock.closed_with()
    assert got == code and frames[-1]["type"] == "error"


def test_ping_is_answered(ws_server, open_socket, two_projects):
    _, _, token_a, _ = two_projects
    sock = open_socket(ws_server, token=token_a)
    sock.send({"type": "ping"})
    assert sock.recv() == {"type": "pong"}
