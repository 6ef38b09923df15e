"""The event stream against a real daphne: replay after reconnect, no gap / no duplicate while
events commit during the backlog, and live delivery afterwards."""
from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from novelforge_sessions import events
from novelforge_sessions.event_types import EventType
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.actions.transcript import append_transcript
from novelforge_sessions.live import replay
from novelforge_sessions.models import Event

#: Test-only event types (not in the catalog: production code emits only catalog constants).
BACKLOG = EventType("test.backlog", frozenset({"n"}))
DIRECT = EventType("test.direct", frozenset({"n"}))
from tests.support.factories import SESSION, caller_for, make_project
from tests.live.conftest import api_post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world():
    """A project, an all-permission token, and one session created through the actions."""
    from novelforge_sessions.actions.sessions import NewSession, create_session

    project = make_project("stream")
    _, raw = create_token(project, name="agent", permissions=ALL_PERMISSIONS)
    session = create_session(caller_for(project), NewSession(**SESSION))
    return project, raw, session


def table_ids(project_id: int, after: int = 0) -> list[int]:
    return list(Event.objects.filter(project_id=project_id, id__gt=after).order_by("id").values_list("id", flat=True))


def test_reconnect_with_the_last_id_gets_exactly_the_missed_events_then_live_ones(ws_server, open_socket, world):
    project, token, session = world
    first = open_socket(ws_server, token=token)
    backlog = first.subscribe(project_id=project.id, after=0)
    assert [e["id"] for e in backlog] == table_ids(project.id) and backlog[0]["type"] == "session.created"
    last_seen = backlog[-1]["id"]
    first.close()

    # While nobody is connected, N events commit (in this process: no wake-up reaches the server).
    who = caller_for(project)
    for n in range(7):
        append_transcript(who, session.id, role="assistant", content=f"line {n}")
    missed = table_ids(project.id, after=last_seen)
    assert len(missed) == 7

    again = open_socket(ws_server, token=token)
    replayed = again.subscribe(project_id=project.id, after=last_seen)
    assert [e["id"] for e in replayed] == missed
    assert [e["payload"]["seq"] for e in replayed] == [1, 2, 3, 4, 5, 6, 7]
    assert all(e["type"] == "transcript.appended" and e["project_id"] == project.id for e in replayed)

    # Then live: a change committed through the server arrives next, and only it.
    api_post(ws_server, token, f"/sessions/{session.id}/transcript", {"role": "user", "content": "live one"})
    live = again.next_event()
    assert live["id"] == table_ids(project.id)[-1] and live["id"] > missed[-1]
    assert live["type"] == "transcript.appended" and live["payload"]["seq"] == 8


@pytest.mark.parametrize("batch", [False, True], ids=["a frame per event", "batched"])
def test_events_committed_while_the_backlog_streams_arrive_once_each_in_order(ws_server, open_socket, world, batch):
    project, token, session = world
    # A backlog longer than one page, so it is streamed in several reads.
    with transaction.atomic():
        events.order_lock(session.id)  # a session's events under its ordering lock (events.order_lock)
        for n in range(2 * replay.PAGE_SIZE + 50):
            events.append(project_id=project.id, session_id=session.id, type=BACKLOG, payload={"n": n})
    before = len(table_ids(project.id))

    writers, per_writer = 4, 25
    start = threading.Barrier(writers + 1)
    errors: list[BaseException] = []

    def through_the_server() -> None:
        start.wait()
        try:
            for n in range(per_writer):
                api_post(ws_server, token, f"/sessions/{session.id}/transcript", {"role": "tool", "content": f"api {n}"})
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def straight_to_the_table() -> None:
        # Commits with no wake-up at the server: only the cursor logic can deliver these.
        start.wait()
        try:
            for n in range(per_writer):
                with transaction.atomic():
                    events.order_lock(session.id)
                    events.append(project_id=project.id, session_id=session.id, type=DIRECT, payload={"n": n})
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=through_the_server) for _ in range(writers // 2)]
    threads += [threading.Thread(target=straight_to_the_table) for _ in range(writers // 2)]
    for t in threads:
        t.start()
    sock = open_socket(ws_server, token=token, batch=batch)
    start.wait()  # writers go while we subscribe and the backlog streams
    received = sock.subscribe(project_id=project.id, after=0)
    for t in threads:
        t.join()
    assert not errors, errors
    # One last change through the server wakes the socket for whatever committed unannounced.
    api_post(ws_server, token, f"/sessions/{session.id}/transcript", {"role": "tool", "content": "final"})
    expected = table_ids(project.id)
    assert len(expected) == before + writers * per_writer + 1
    received += sock.events_until(expected[-1])

    ids = [e["id"] for e in received]
    assert ids == expected, "every committed event exactly once, in id order, no gap, no duplicate"
    assert all(a < b for a, b in zip(ids, ids[1:]))
    if batch:  # the backlog's pages came a page to a frame, never more than a page
        assert sock.event_frames <= len(ids) - 2 * replay.PAGE_SIZE
    else:
        assert sock.event_frames == len(ids)


def test_subscribing_without_after_starts_from_now(ws_server, open_socket, world):
    project, token, session = world
    sock = open_socket(ws_server, token=token)
    assert sock.subscribe(project_id=project.id) == []
    api_post(ws_server, token, f"/sessions/{session.id}/transcript", {"role": "user", "content": "hello"})
    event = sock.next_event()
    assert event["id"] == table_ids(project.id)[-1] and event["type"] == "transcript.appended"


def test_a_session_subscription_streams_only_that_session(ws_server, open_socket, world):
    project, token, session = world
    other = api_post(ws_server, token, "/sessions", SESSION)
    sock = open_socket(ws_server, token=token)
    backlog = sock.subscribe(session_id=session.id, after=0)
    assert {e["session_id"] for e in backlog} == {session.id}
    api_post(ws_server, token, f"/sessions/{other['id']}/transcript", {"role": "user", "content": "elsewhere"})
    api_post(ws_server, token, f"/sessions/{session.id}/transcript", {"role": "user", "content": "here"})
    event = sock.next_event()
    assert event["session_id"] == session.id and event["payload"]["seq"] == 1
