"""The live feed's own reader (``live/fanout.Reader``): one async psycopg connection running
the statement compiled from ``events.events_after``'s queryset (through ``events.visible``).
It must return exactly what the ORM reader returns, byte for byte, for every event shape."""
from __future__ import annotations

import asyncio
import json

import psycopg
import pytest
from channels.db import database_sync_to_async
from django.db import transaction

from novelforge_sessions import events
from novelforge_sessions.actions.sessions import NewSession, create_session
from novelforge_sessions.event_types import EventType
from novelforge_sessions.live import fanout
from tests.support.factories import SESSION, caller_for, make_project

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

#: Test-only event types (not in the catalog: production code emits only catalog constants).
ODD = EventType("test.odd", frozenset({"text", "n", "x", "nested"}))
PLAIN = EventType("test.plain", frozenset())


def _world() -> tuple[int, int, list[int]]:
    a, b = make_project("reader-a"), make_project("reader-b")
    s1 = create_session(caller_for(a), NewSession(**SESSION))
    s2 = create_session(caller_for(a), NewSession(**SESSION))
    sb = create_session(caller_for(b), NewSession(**SESSION))
    with transaction.atomic():
        events.order_lock(s1.id, s2.id, sb.id)  # a session's events under its ordering lock
        start = events.latest_visible_id()
        for i in range(7):  # both projects interleaved; sessions, no session, a run-less event
            events.append(project_id=a.id, session_id=(s1.id, s2.id, None)[i % 3], type=ODD, actor=f"actor-{i}",
                          payload={"text": "é — ✓ \"q\"", "n": i, "x": 0.1 * i, "nested": {"k": [1, None, True]}})
            events.append(project_id=b.id, session_id=sb.id, type=PLAIN)
    return a.id, b.id, [start]


async def test_the_feed_reader_returns_exactly_what_the_orm_reader_returns(settings):
    project_a, project_b, [start] = await database_sync_to_async(_world)()
    reader = fanout.Reader()
    try:
        for project_id in (project_a, project_b):
            expected = await database_sync_to_async(fanout._read_after)(project_id, start, 200)
            assert len(expected) == 7
            assert await reader.page(project_id, start, 200) == expected
            # Keyset pages: after a cursor, and a limit.
            assert await reader.page(project_id, expected[2][0], 3) == expected[3:6]
            assert await reader.page(project_id, expected[-1][0], 200) == []
        got = [json.loads(text) for _, _, text in await reader.page(project_a, start, 200)]
        assert {e["session_id"] is None for e in got} == {True, False}
        assert all(e["project_id"] == project_a and e["type"] == "test.odd" and e["family"] == "other" for e in got)
    finally:
        await reader.close()


async def test_a_dropped_connection_is_replaced_on_the_next_read(settings):
    project_a, _, [start] = await database_sync_to_async(_world)()
    reader = fanout.Reader()
    try:
        first = await reader.page(project_a, start, 200)
        assert reader.conn is not None
        pid = reader.conn.info.backend_pid

        def terminate() -> None:
            from django.db import connection

            with connection.cursor() as cur:  # the server drops the reader's connection
                cur.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])

        await database_sync_to_async(terminate)()
        with pytest.raises(psycopg.OperationalError):
            await reader.page(project_a, start, 200)
        assert reader.conn is None  # dropped: the next read opens a new one
        # Two feeds reading at once after the drop: both served, over ONE new connection.
        both = await asyncio.gather(reader.page(project_a, start, 200), reader.page(project_a, start, 100))
        assert both == [first, first]

        def readers() -> int:
            from django.db import connection

            with connection.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                            [fanout.READER_APPLICATION_NAME])
                return cur.fetchone()[0]

        assert await database_sync_to_async(readers)() == 1
    finally:
        await reader.close()


async def test_a_statement_that_cannot_be_compiled_falls_back_to_the_orm(settings, monkeypatch):
    project_a, _, [start] = await database_sync_to_async(_world)()

    def refuse(limit: int):
        raise ValueError("a rule with a Python-side value")

    monkeypatch.setattr(events, "project_page_statement", refuse)
    reader = fanout.Reader()
    try:
        expected = await database_sync_to_async(fanout._read_after)(project_a, start, 200)
        assert await reader.page(project_a, start, 200) == expected
        assert reader.conn is None  # no connection of its own
    finally:
        await reader.close()


async def test_the_statement_comes_from_the_visible_queryset(settings):
    sql, params = await database_sync_to_async(events.project_page_statement)(50)
    assert params.count(events.PROJECT_PARAM) == 1 and params.count(events.AFTER_PARAM) == 1
    assert '"novelforge_sessions_event"' in sql and "ORDER BY" in sql and "LIMIT 50" in sql


async def test_a_feed_remembers_the_announced_id_and_a_sweep_is_not_an_announcement():
    hub = fanout.Hub(asyncio.get_running_loop(), layer=None)
    feed = fanout.Feed(hub, 1)
    feed.head = 10
    feed.wake(9)  # already read
    assert feed.announced == 9 and not feed._wanted.is_set()
    feed.wake(12)
    assert feed.announced == 12 and feed._wanted.is_set()
    feed._wanted.clear()
    feed.wake(events.WAKE_ALL)  # "read once" (the sweep): a read, not an id to wait for
    assert feed.announced == 12 and feed._wanted.is_set()


async def test_a_read_that_fails_after_its_first_page_still_tells_the_members_what_it_read():
    """The read's first page is in the buffer when its second page fails: the sockets are told
    (they send what the buffer holds), and the next read goes on from the new head."""
    from novelforge_sessions.live import replay

    class FailingSecondPage:
        def __init__(self) -> None:
            self.calls: list[int] = []

        async def page(self, project_id: int, after: int, limit: int) -> list[tuple[int, int | None, str]]:
            self.calls.append(after)
            if len(self.calls) == 2:
                raise psycopg.OperationalError("connection lost mid-read")
            return [(after + i, None, "{}") for i in range(1, limit + 1)]

    class Member:
        def __init__(self) -> None:
            self.told = asyncio.Event()

        def feed_advanced(self, project_id: int) -> None:
            self.told.set()

    hub = fanout.Hub(asyncio.get_running_loop(), layer=None)
    hub.reader = FailingSecondPage()
    feed = fanout.Feed(hub, 1)
    member = Member()
    feed.members.add(member)
    feed.head = feed.start = 10
    task = asyncio.ensure_future(feed._run())
    try:
        feed.wake(10 + replay.PAGE_SIZE + 5)
        await asyncio.wait_for(member.told.wait(), 10)
        assert feed.head == 10 + replay.PAGE_SIZE and hub.reader.calls == [10, 10 + replay.PAGE_SIZE]
        assert [e[0] for e in feed.events_after(10, None)] == list(range(11, 11 + replay.PAGE_SIZE))
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
