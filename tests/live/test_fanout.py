"""One read per project per process per wake-up, fanned out, against real daphnes.

The servers run with ``tests.live.sqlcount_settings``: every SELECT of the event table made in
the server process is appended to a file, so these tests count real statements. Sweeps are
off and NOTIFY is off, so every read counted comes from a wake-up of a commit made through the
server's API.
"""
from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest
from django.db import transaction

from novelforge_sessions import events
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.event_types import EventType
from novelforge_sessions.live import fanout
from novelforge_sessions.models import Event
from tests.support.factories import SESSION, caller_for, make_project
from tests.support.servers import DaphneServer
from tests.live.conftest import REDIS_URL, api_post

pytestmark = pytest.mark.django_db(transaction=True)

#: Test-only event type (not in the catalog).
BURST = EventType("test.burst", frozenset({"n"}))
QUIET = {"LIVE_SWEEP_SECONDS": "3600", "LIVE_PG_NOTIFY": "false", "DJANGO_SETTINGS_MODULE": "tests.live.sqlcount_settings"}


class SqlLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("")
        self.mark = 0

    def lines(self) -> list[str]:
        return self.path.read_text().splitlines()

    def set_mark(self) -> None:
        self.mark = len(self.lines())

    def since_mark(self) -> list[str]:
        return self.lines()[self.mark:]


def counting_server(tmp_path: Path, name: str, **env: str) -> tuple[DaphneServer, SqlLog]:
    log = SqlLog(tmp_path / f"{name}.sql")
    return DaphneServer(extra_env={**QUIET, "NF_SQL_LOG": str(log.path), **env}), log


@pytest.fixture
def world():
    from novelforge_sessions.actions.sessions import NewSession, create_session

    a, b = make_project("fan-a"), make_project("fan-b")
    _, token_a = create_token(a, name="agent", permissions=ALL_PERMISSIONS)
    _, token_b = create_token(b, name="agent", permissions=ALL_PERMISSIONS)
    s1 = create_session(caller_for(a), NewSession(**SESSION))
    s2 = create_session(caller_for(a), NewSession(**SESSION))
    sb = create_session(caller_for(b), NewSession(**SESSION))
    _, bound = create_token(a, name="bound", permissions=["read"], session=s2)
    return {"a": a, "b": b, "token_a": token_a, "token_b": token_b, "s1": s1, "s2": s2, "sb": sb, "bound": bound}


def ids(after: int, **where) -> list[int]:
    return list(Event.objects.filter(id__gt=after, **where).order_by("id").values_list("id", flat=True))


def write_concurrently(server: DaphneServer, plan: list[tuple[str, int, int]]) -> None:
    """One thread per (token, session id, n): n transcript entries through the server's API,
    all threads at once; returns when every thread is done, raising the first error any met."""
    errors: list[BaseException] = []

    def write(token: str, session_id: int, n: int) -> None:
        try:
            for i in range(n):
                api_post(server, token, f"/sessions/{session_id}/transcript", {"role": "tool", "content": f"w{i}"})
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=p) for p in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_one_wake_up_is_one_read_per_project_for_every_socket_and_each_gets_every_event_once(
    tmp_path, open_socket, world
):
    server, sql = counting_server(tmp_path, "one")
    try:
        w = world
        start = ids(0)[-1]
        # Half of them take their events several to a frame (``batch``): the same events each.
        project_a = [open_socket(server, token=w["token_a"], batch=i % 2 == 1) for i in range(24)]
        session_1 = [open_socket(server, token=w["token_a"], batch=i % 2 == 1) for i in range(6)]
        bound_2 = [open_socket(server, token=w["bound"]) for _ in range(4)]
        project_b = [open_socket(server, token=w["token_b"]) for _ in range(6)]
        for s in project_a + bound_2:
            assert s.subscribe(project_id=w["a"].id, after=start) == []
        for s in session_1:
            assert s.subscribe(session_id=w["s1"].id, after=start) == []
        for s in project_b:
            assert s.subscribe(project_id=w["b"].id, after=start) == []

        # One commit through the server: one wake-up for project A.
        sql.set_mark()
        api_post(server, w["token_a"], f"/sessions/{w['s1'].id}/transcript", {"role": "user", "content": "one"})
        [event_id] = ids(start)
        for s in project_a + session_1:
            assert s.next_event()["id"] == event_id
        reads = sql.since_mark()
        assert len(reads) == 1, reads  # 30 sockets woken, one SELECT of the event table

        # Then writers on both projects and both of A's sessions, concurrently; a last commit
        # on each project. Every socket: exactly its subscription's events, in id order.
        sql.set_mark()
        write_concurrently(server, [(w["token_a"], w["s1"].id, 15), (w["token_a"], w["s2"].id, 15),
                                    (w["token_b"], w["sb"].id, 15)])
        commits = {"a": 30, "b": 15}
        all_a = ids(start, project_id=w["a"].id)
        all_b = ids(start, project_id=w["b"].id)
        only_1 = ids(start, session_id=w["s1"].id)
        only_2 = ids(start, session_id=w["s2"].id)
        assert len(all_a) == 31 and len(all_b) == 15
        for s in project_a:
            got = [event_id] + [e["id"] for e in s.events_until(all_a[-1])]
            assert got == all_a
        for s in session_1:
            got = [event_id] + [e["id"] for e in s.events_until(only_1[-1])]
            assert got == only_1
        for s in bound_2:
            got = [e["id"] for e in s.events_until(only_2[-1])]
            assert got == only_2 and {e for e in got} <= set(all_a)
        for s in project_b:
            assert [e["id"] for e in s.events_until(all_b[-1])] == all_b
        reads = sql.since_mark()
        # About one read per wake-up and project (wake-ups during a read coalesce), never one
        # per socket: 40 sockets and 45 commits would otherwise be ~1 300 reads. A wake-up
        # whose event is still above the watermark (a concurrent writer's older transaction
        # was open) costs a re-read a few ms later (live/fanout.py), hence up to twice that.
        assert 2 <= len(reads) <= 2 * (commits["a"] + commits["b"]), len(reads)
    finally:
        server.stop()


def test_writers_faster_than_the_feeds_pace_share_reads_and_frames_and_every_event_arrives_once(
    tmp_path, open_socket, world
):
    """LIVE_FEED_READS_PER_SECOND=5: three writers commit 60 events through the server as fast
    as it answers. The feed reads at most its burst plus 5 a second of the time that took (one
    read per commit would be ~60), and each socket still gets every event once, in id order,
    a batched socket in fewer frames than events."""
    rate = 5
    server, sql = counting_server(tmp_path, "paced", LIVE_FEED_READS_PER_SECOND=str(rate))
    try:
        w = world
        start = ids(0)[-1]
        sockets = [open_socket(server, token=w["token_a"], batch=i % 2 == 0) for i in range(4)]
        for s in sockets:
            assert s.subscribe(project_id=w["a"].id, after=start) == []
        sql.set_mark()
        began = time.monotonic()
        write_concurrently(server, [(w["token_a"], sid, 20) for sid in (w["s1"].id, w["s2"].id, w["s1"].id)])
        expected = ids(start, project_id=w["a"].id)
        assert len(expected) == 60
        for s in sockets:
            assert [e["id"] for e in s.events_until(expected[-1])] == expected
        elapsed = time.monotonic() - began
        reads = sql.since_mark()
        assert 1 <= len(reads) <= fanout.READ_BURST + math.ceil(rate * elapsed) + 1, (len(reads), elapsed)
        assert all(s.event_frames < len(expected) for s in sockets if s.batch)
        assert all(s.event_frames == len(expected) for s in sockets if not s.batch)
        # One more commit after the writers stopped: one read (at its turn), every socket gets it.
        sql.set_mark()
        api_post(server, w["token_a"], f"/sessions/{w['s1'].id}/transcript", {"role": "user", "content": "later"})
        [last] = ids(expected[-1])
        for s in sockets:
            assert s.next_event()["id"] == last
        assert len(sql.since_mark()) == 1
    finally:
        server.stop()


def test_a_socket_behind_the_buffer_or_reconnecting_catches_up_from_the_log_with_no_gap(tmp_path, open_socket, world):
    """LIVE_BUFFER_EVENTS=8: a burst of 60 events in one transaction overflows every socket's
    buffer window, so each reads the log after its own cursor, then continues live."""
    server, sql = counting_server(tmp_path, "behind", LIVE_BUFFER_EVENTS="8")
    try:
        w = world
        start = ids(0)[-1]
        live = [open_socket(server, token=w["token_a"], batch=i % 2 == 1) for i in range(5)]
        for s in live:
            assert s.subscribe(project_id=w["a"].id, after=start) == []
        leaver = open_socket(server, token=w["token_a"])
        assert leaver.subscribe(project_id=w["a"].id, after=start) == []
        api_post(server, w["token_a"], f"/sessions/{w['s1'].id}/transcript", {"role": "user", "content": "first"})
        first = leaver.next_event()["id"]
        leaver.close()  # disconnects, remembering its cursor

        # 60 events in one transaction, committed here (no wake-up reaches the server)...
        with transaction.atomic():
            events.order_lock(w["s2"].id)  # a session's events under its ordering lock (events.order_lock)
            for n in range(60):
                events.append(project_id=w["a"].id, session_id=w["s2"].id, type=BURST, payload={"n": n})
        # ... then one commit through the server wakes the feed: 61 new events, 8 kept.
        sql.set_mark()
        api_post(server, w["token_a"], f"/sessions/{w['s1'].id}/transcript", {"role": "user", "content": "wake"})
        expected = ids(start, project_id=w["a"].id)
        assert len(expected) == 62
        for s in live:
            assert [e["id"] for e in s.events_until(expected[-1])] == expected
        # A batched socket got the burst (read from the log, one page) in fewer frames than events.
        assert all(s.event_frames < len(expected) for s in live if s.batch)
        assert all(s.event_frames == len(expected) for s in live if not s.batch)
        # The feed read once; each socket, behind the 8 kept, read the log after its cursor.
        assert len(sql.since_mark()) >= 1 + len(live)

        # The leaver reconnects with its last id: exactly what it missed, then live again.
        again = open_socket(server, token=w["token_a"])
        missed = again.subscribe(project_id=w["a"].id, after=first)
        assert [e["id"] for e in missed] == [i for i in expected if i > first]
        api_post(server, w["token_a"], f"/sessions/{w['s1'].id}/transcript", {"role": "user", "content": "after"})
        [last] = ids(expected[-1])
        assert again.next_event()["id"] == last
        for s in live:
            assert s.next_event()["id"] == last
    finally:
        server.stop()


def test_two_processes_each_read_once_per_wake_up(tmp_path, open_socket, world):
    """Over Redis, a commit on process A wakes B's feed too: one read in each process."""
    a, log_a = counting_server(tmp_path, "pa", REDIS_URL=REDIS_URL)
    try:
        b, log_b = counting_server(tmp_path, "pb", REDIS_URL=REDIS_URL)
    except BaseException:
        a.stop()
        raise
    try:
        w = world
        start = ids(0)[-1]
        on_a = [open_socket(a, token=w["token_a"]) for _ in range(8)]
        on_b = [open_socket(b, token=w["token_a"]) for _ in range(8)]
        for s in on_a + on_b:
            assert s.subscribe(project_id=w["a"].id, after=start) == []
        log_a.set_mark()
        log_b.set_mark()
        api_post(a, w["token_a"], f"/sessions/{w['s1'].id}/transcript", {"role": "user", "content": "x"})
        [event_id] = ids(start)
        for s in on_a + on_b:
            assert s.next_event()["id"] == event_id
        assert len(log_a.since_mark()) == 1, log_a.since_mark()
        assert len(log_b.since_mark()) == 1, log_b.since_mark()
    finally:
        a.stop()
        b.stop()


def test_over_redis_a_socket_adds_no_subscription_of_its_own(open_socket, world):
    """The hub is the process's one layer channel: a socket takes none (channel_layer_alias =
    None), so connecting and closing sockets costs Redis no SUBSCRIBE / UNSUBSCRIBE each."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    server = DaphneServer(redis_url=REDIS_URL)
    try:
        def channels() -> set[bytes]:
            return set(client.pubsub_channels("asgi*"))

        before = channels()
        first = open_socket(server, token=world["token_a"])
        first.subscribe(project_id=world["a"].id)
        with_hub = channels()
        assert len(with_hub - before) >= 1  # the hub's channel (and its project's group)
        more = [open_socket(server, token=world["token_a"]) for _ in range(6)]
        for sock in more:
            sock.subscribe(project_id=world["a"].id)
        api_post(server, world["token_a"], f"/sessions/{world['s1'].id}/transcript", {"role": "user", "content": "x"})
        for sock in [first, *more]:  # every socket still gets the event, through the hub
            assert sock.next_event()["type"] == "transcript.appended"
        assert channels() == with_hub
    finally:
        server.stop()
        client.close()
