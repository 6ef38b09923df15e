"""Two daphne processes sharing Redis (``channels_redis`` pub/sub): an event committed through
process A reaches a websocket held on process B."""
from __future__ import annotations

import pytest

from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.models import Event
from tests.support.factories import SESSION, make_project
from tests.live.conftest import api_post

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_event_committed_through_a_reaches_a_socket_on_b(two_servers, open_socket):
    a, b = two_servers
    project = make_project("shared")
    _, token = create_token(project, name="agent", permissions=ALL_PERMISSIONS)
    sock = open_socket(b, token=token)
    assert sock.subscribe(project_id=project.id) == []

    created = api_post(a, token, "/sessions", SESSION)  # committed by process A
    event = sock.next_event()
    assert event["type"] == "session.created" and event["session_id"] == created["id"]
    assert event["id"] == Event.objects.get(session_id=created["id"], type="session.created").id

    api_post(a, token, f"/sessions/{created['id']}/transcript", {"role": "user", "content": "via A"})
    assert sock.next_event()["type"] == "transcript.appended"
