"""One read of the event log per project per process per wake-up, fanned out to the sockets.

If every socket subscribed to a project ran its own ``events_after`` query on every wake-up,
the cost of streaming would grow with sockets × commits, all of it queued on asgiref's single
shared database thread. So each server process (each event loop) has one ``Hub``:

- the hub holds ONE channel-layer channel and joins each watched project's group with it, so a
  commit's wake-up reaches the process once (not once per socket);
- per project there is one ``Feed``: on a wake-up announcing an id past what it has read, it
  reads the log after its ``head`` page by page, keeps the last ``LIVE_BUFFER_EVENTS`` events
  serialised once (JSON text), and tells its members; wake-ups that arrive during a read
  coalesce into one more read;
- the feeds read on the hub's own connection (``Reader``): one async psycopg connection, used
  on the event loop: ``events.WATERMARK_SQL``, then ``events.project_page_statement`` (the
  page ``events.events_after`` reads, with ``events.visible``'s watermark rule as a parameter,
  compiled to SQL once per process), so a
  read needs no ``database_sync_to_async`` hop onto asgiref's one shared thread, no pool
  checkout with its health-check query, and no ORM building the query and model instances;
- each socket (``EventStreamConsumer``) sends from the buffer what lies after its own cursor,
  filtered to its subscription (a session, or a session-bound token's session).

The log stays the truth. A subscription's cursor is a *position*: every event of the project
with an id at or below it has been sent (when it belongs to the subscription) or skipped (when
it does not). The buffer holds every event of the project with ``start < id <= head``; a socket
whose cursor is at or past ``start`` is served from memory, exactly once and in id order. A
socket behind ``start`` (a backlog on subscribe, a reconnect with an old ``after``, a socket
that could not keep up while ``LIVE_BUFFER_EVENTS`` events went by) reads the log after its
own cursor first, as before, then continues from the buffer. A lost wake-up is caught by the
hub's sweep (every ``LIVE_SWEEP_SECONDS``: re-join the groups, one read per feed).

Under sustained writing a feed reads at most ``LIVE_FEED_READS_PER_SECOND`` times a second
(``ReadPacer``: a token bucket of ``READ_BURST`` reads). A wake-up after a quiet moment is read
at once; when commits arrive faster than that, the wake-ups that arrive while a feed waits for
its turn join its next read, so its sockets get one frame with several events instead of one
frame per commit. What streaming costs the server then grows with the sockets and the reads a
second, not with the write rate: at 25 reads a second an event waits at most 40 ms more for its
read, and only while the project's writers outrun that pace.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections import deque
from typing import Any, Protocol

import psycopg
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from novelforge_sessions import events
from novelforge_sessions.live import connparams, replay

log = logging.getLogger("novelforge.live")


#: Re-reads of a feed whose announced event is not readable yet: first after 2 ms, doubling to 250 ms.
_RECHECK_FIRST, _RECHECK_MAX = 0.002, 0.25


#: A feed's reads that may follow each other at once before ``LIVE_FEED_READS_PER_SECOND`` applies.
READ_BURST = 4


class ReadPacer:
    """A token bucket: ``burst`` reads at once, then ``per_second`` reads a second (0: no limit).

    ``delay(now)`` takes the next read's turn and answers how long to wait for it (0.0: read now).
    Pure (the caller passes the clock), so it is tested without waiting.
    """

    def __init__(self, per_second: float, burst: int = READ_BURST, now: float = 0.0) -> None:
        self.per_second = per_second
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = now

    def delay(self, now: float) -> float:
        if self.per_second <= 0:
            return 0.0
        self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.per_second) - 1.0
        self.stamp = now
        # A negative balance is the wait: by then it has been paid back (a debt, not a refusal).
        return 0.0 if self.tokens >= 0 else -self.tokens / self.per_second


class Member(Protocol):
    def feed_advanced(self, project_id: int) -> None:
        """Called (synchronously, on the loop) after the feed read new events; must not block."""


#: ``application_name`` of a hub's reading connection: this prefix and the process id.
READER_APPLICATION_NAME = f"novelforge-live-feed-{os.getpid()}"


def _read_after(project_id: int, after: int, limit: int) -> list[tuple[int, int | None, str]]:
    """Sync, through the ORM: the project's events after ``after`` as (id, session_id, JSON
    text), oldest first (``Reader``'s fallback when its statement cannot be compiled)."""
    sub = replay.Subscription(key=f"project:{project_id}", project_id=project_id, session_id=None)
    return [
        (e["id"], e["session_id"], json.dumps(e, separators=(",", ":")))
        for e in replay.events_after(sub, after, limit)
    ]


class Reader:
    """A hub's reads of the log: one async psycopg connection (autocommit: each read its own
    snapshot), used on the hub's event loop, with ``events.project_page_statement`` compiled
    once. A failed read drops the connection; the next read opens a new one."""

    def __init__(self) -> None:
        self.conn: psycopg.AsyncConnection | None = None
        self.statements: dict[int, tuple[str, list[Any]] | None] = {}  # limit -> (sql, params); None: use the ORM
        self._conninfo: dict[str, Any] | None = None
        self._opening = asyncio.Lock()  # two feeds reading after a drop open one connection, not two

    async def prepare(self, limit: int) -> None:
        """Compile the statement and open the connection (done when the hub starts, so the
        first live event does not pay for either)."""
        if limit not in self.statements:
            try:
                self.statements[limit] = await database_sync_to_async(events.project_page_statement)(limit)
            except ValueError:
                log.warning("event feed statement not compilable; the feeds read through the ORM", exc_info=True)
                self.statements[limit] = None
        if self.statements[limit] is not None and (self.conn is None or self.conn.closed):
            async with self._opening:
                if self.conn is None or self.conn.closed:
                    if self._conninfo is None:
                        self._conninfo = await database_sync_to_async(connparams.plain_conninfo)(READER_APPLICATION_NAME)
                    conn = await psycopg.AsyncConnection.connect(autocommit=True, **self._conninfo)
                    # The backend's first call of the watermark function compiles it (plpgsql):
                    # a few ms the first live event would otherwise pay.
                    await conn.execute(events.WATERMARK_SQL)
                    self.conn = conn

    async def page(self, project_id: int, after: int, limit: int) -> list[tuple[int, int | None, str]]:
        """Up to ``limit`` of the project's events after ``after``: (id, session_id, JSON text)."""
        await self.prepare(limit)
        statement = self.statements[limit]
        if statement is None:
            return await database_sync_to_async(_read_after)(project_id, after, limit)
        sql, template = statement
        assert self.conn is not None
        # Shielded: a feed closed mid-read (its last socket left) must not cancel a statement
        # halfway on the connection the other feeds share; the read finishes and is dropped.
        rows = await asyncio.shield(self._fetch(self.conn, sql, template, project_id, after))
        dumps = json.dumps
        return [(row[0], row[2], dumps(events.serialize_values(*row), separators=(",", ":"))) for row in rows]

    async def _fetch(
        self, conn: psycopg.AsyncConnection, sql: str, template: list[Any], project_id: int, after: int,
    ) -> list[tuple[Any, ...]]:
        try:
            # The watermark first, in its own statement (events.project_page_statement): the
            # page's later snapshot holds everything that had finished when it was taken.
            mark = (await (await conn.execute(events.WATERMARK_SQL)).fetchone())[0]
            values = {events.PROJECT_PARAM: project_id, events.AFTER_PARAM: after, events.WATERMARK_PARAM: mark}
            cursor = await conn.execute(sql, [values.get(p, p) if isinstance(p, int) else p for p in template])
            return await cursor.fetchall()
        except BaseException:
            if self.conn is conn:
                await self.close()
            raise

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


class Feed:
    """One project's events for this process: a read per wake-up, a buffer, its members."""

    def __init__(self, hub: Hub, project_id: int) -> None:
        self.hub = hub
        self.project_id = project_id
        self.group = events.project_group(project_id)
        self.members: set[Member] = set()
        self.head = 0  # every event of the project with id <= head has been read (or predates the feed)
        # The highest id a wake-up announced. Never assume a read right after a wake-up returns
        # it: with a reader-side visibility rule an announced id may become readable a little
        # later, so "announced > head after a read" means "read again", not a gap.
        self.announced = 0
        self.start = 0  # the buffer holds every event of the project with start < id <= head
        self.buffer: deque[tuple[int, int | None, str]] = deque()
        self.reads = 0  # log reads made by this feed (observability and tests)
        self.pacer = ReadPacer(float(settings.LIVE_FEED_READS_PER_SECOND), now=asyncio.get_running_loop().time())
        self._wanted = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def open(self) -> None:
        # Join the group FIRST: a commit from here on wakes the feed; anything committed
        # before is at or below the head read next (or, not yet visible, read at a later wake-up).
        await self.hub.layer.group_add(self.group, self.hub.channel)
        self.head = self.start = await database_sync_to_async(replay.latest_event_id)()
        self._task = asyncio.ensure_future(self._run())

    def wake(self, max_id: int) -> None:
        if max_id >= events.WAKE_ALL:  # "read once", not an id (the sweep, a reconnected listener)
            self._wanted.set()
            return
        if max_id > self.announced:
            self.announced = max_id
        if max_id > self.head:
            self._wanted.set()

    def events_after(self, position: int, session_id: int | None) -> list[tuple[int, str]]:
        """Buffered (id, JSON) after ``position``, of one session or all; caller checked ``start``."""
        out = []
        for event_id, sid, text in reversed(self.buffer):
            if event_id <= position:
                break
            if session_id is None or sid == session_id:
                out.append((event_id, text))
        out.reverse()
        return out

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wanted.wait()
            delay, waited = _RECHECK_FIRST, 0.0
            while True:
                # Every read waits for its turn (ReadPacer); wake-ups that arrive meanwhile are
                # covered by this read, so the flag is cleared only once the turn has come.
                pause = self.pacer.delay(loop.time())
                if pause > 0:
                    await asyncio.sleep(pause)  # pacing the reads, not a synchronisation
                self._wanted.clear()
                head, failed = self.head, False
                try:
                    await self._read()
                except asyncio.CancelledError:
                    raise
                except Exception:  # a database hiccup: the next wake-up or the sweep reads again
                    log.warning("event feed read for project %s failed", self.project_id, exc_info=True)
                    failed = True
                # Told whenever the head moved, even by a read that failed after its first page.
                if self.head > head:
                    for member in list(self.members):
                        member.feed_advanced(self.project_id)
                if failed:
                    break
                if self.head >= self.announced or waited >= float(settings.LIVE_SWEEP_SECONDS):
                    break
                # The announced event is committed but not readable yet: it sits above the log's
                # watermark while an older transaction of this database is still open
                # (novelforge_sessions.events). Nothing announces that transaction's end, so
                # re-read shortly, backing off; a new wake-up reads at once (at its turn).
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wanted.wait(), delay)
                waited += delay
                delay = min(delay * 2, _RECHECK_MAX)

    async def _read(self) -> None:
        limit = replay.PAGE_SIZE
        keep = int(settings.LIVE_BUFFER_EVENTS)
        while True:
            page = await self.hub.reader.page(self.project_id, self.head, limit)
            self.reads += 1
            if page:
                self.buffer.extend(page)
                self.head = page[-1][0]
                while len(self.buffer) > keep:
                    self.start = self.buffer.popleft()[0]
            if len(page) < limit:
                return

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        with contextlib.suppress(Exception):
            await self.hub.layer.group_discard(self.group, self.hub.channel)


class Hub:
    """This event loop's feeds, its one layer channel, and the sweep."""

    def __init__(self, loop: asyncio.AbstractEventLoop, layer: Any) -> None:
        self.loop = loop
        self.layer = layer
        self.channel = ""
        self.feeds: dict[int, Feed] = {}
        self.reader = Reader()
        self._tasks: list[asyncio.Task] = []
        self._lock = asyncio.Lock()

    def wake_threadsafe(self, project_id: int, max_id: int) -> None:
        """From any thread (a writer's after-commit, ``events.LOCAL_WAKERS``): wake the
        project's feed on this hub's loop."""
        try:
            self.loop.call_soon_threadsafe(self._wake, project_id, max_id)
        except RuntimeError:  # the loop is closed: nobody is listening here any more
            pass

    def _wake(self, project_id: int, max_id: int) -> None:
        feed = self.feeds.get(project_id)
        if feed is not None:
            feed.wake(max_id)

    async def join(self, member: Member, project_id: int) -> Feed:
        async with self._lock:
            if not self.channel:
                await self.reader.prepare(replay.PAGE_SIZE)
                self.channel = await self.layer.new_channel(prefix="nf-live-hub")
                events.LOCAL_WAKERS[self.channel] = self.wake_threadsafe
                self._tasks = [asyncio.ensure_future(self._receive()), asyncio.ensure_future(self._sweep())]
            feed = self.feeds.get(project_id)
            if feed is None:
                feed = self.feeds[project_id] = Feed(self, project_id)
                try:
                    await feed.open()
                except BaseException:
                    del self.feeds[project_id]
                    raise
            feed.members.add(member)
            return feed

    async def leave(self, member: Member, project_id: int) -> None:
        async with self._lock:
            feed = self.feeds.get(project_id)
            if feed is None:
                return
            feed.members.discard(member)
            if not feed.members:
                del self.feeds[project_id]
                await feed.close()
            if not self.feeds:
                await self._stop()

    async def _stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        events.LOCAL_WAKERS.pop(self.channel, None)
        self.channel = ""
        await self.reader.close()

    async def _receive(self) -> None:
        channel = self.channel
        while True:
            try:
                message = await self.layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # the layer went away for a moment (Redis): the sweep covers the gap
                log.warning("event hub lost its channel layer; retrying", exc_info=True)
                await asyncio.sleep(1.0)  # backoff between attempts, not a synchronisation
                continue
            if message.get("type") != "events.wakeup":
                continue
            self._wake(message.get("project_id"), int(message.get("max_id") or 0))

    async def _sweep(self) -> None:
        """Lost wake-ups and expired group memberships: re-join, one read per feed."""
        while True:
            await asyncio.sleep(float(settings.LIVE_SWEEP_SECONDS))
            for feed in list(self.feeds.values()):
                try:
                    await self.layer.group_add(feed.group, self.channel)
                except Exception:
                    log.warning("event hub could not re-join %s", feed.group, exc_info=True)
                feed.wake(events.WAKE_ALL)


_hubs: dict[int, Hub] = {}


def hub() -> Hub:
    """This event loop's hub (a server process has one loop, so one hub)."""
    loop = asyncio.get_running_loop()
    layer = get_channel_layer()
    found = _hubs.get(id(loop))
    if found is None or found.loop is not loop or found.layer is not layer:
        found = _hubs[id(loop)] = Hub(loop, layer)
    return found


def snapshot() -> tuple[int, list[tuple[int, int]]]:
    """This process's subscribed sockets (each counted once, however many feeds it is a member
    of) and each live feed's ``(project_id, head)``. Read from any thread (``/metrics``): copies of
    the hubs' dicts and sets, nothing awaited, nothing changed."""
    members: set[int] = set()
    feeds: list[tuple[int, int]] = []
    for hub_ in list(_hubs.values()):
        for feed in list(hub_.feeds.values()):
            members.update(id(m) for m in list(feed.members))
            feeds.append((feed.project_id, feed.head))
    return len(members), feeds
