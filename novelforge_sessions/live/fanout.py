"""One read of the event log per project per process per wake-up, fanned out to the sockets.

Before this, every socket subscribed to a project ran its own ``events_after`` query on every
wake-up, all of them queued on asgiref's single shared database thread: 50 sockets at 20
commits/s cost 0.83 core. Now each server process (each event loop) has one ``Hub``:

- the hub holds ONE channel-layer channel and joins each watched project's group with it, so a
  commit's wake-up reaches the process once (not once per socket);
- per project there is one ``Feed``: on a wake-up announcing an id past what it has read, it
  reads the log after its ``head`` (``replay.events_after``: the log's one reader, with its
  visibility rule) page by page, keeps the last ``LIVE_BUFFER_EVENTS`` events serialised once
  (JSON text), and tells its members; wake-ups that arrive during a read coalesce into one
  more read;
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
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from typing import Any, Protocol

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from novelforge_sessions import events
from novelforge_sessions.live import replay

log = logging.getLogger("novelforge.live")


#: Re-reads of a feed whose announced event is not readable yet: first after 2 ms, doubling to 250 ms.
_RECHECK_FIRST, _RECHECK_MAX = 0.002, 0.25
#: A wake-up's max_id that announces no particular event (live/pgnotify.py's "everyone, read").
_WAKE_ALL = 2**63 - 1


class Member(Protocol):
    def feed_advanced(self, project_id: int) -> None:
        """Called (synchronously, on the loop) after the feed read new events; must not block."""


def _read_after(project_id: int, after: int, limit: int) -> list[tuple[int, int | None, str]]:
    """Sync: the project's events after ``after`` as (id, session_id, JSON text), oldest first."""
    sub = replay.Subscription(key=f"project:{project_id}", project_id=project_id, session_id=None)
    return [
        (e["id"], e["session_id"], json.dumps(e, separators=(",", ":")))
        for e in replay.events_after(sub, after, limit)
    ]


class Feed:
    """One project's events for this process: a read per wake-up, a buffer, its members."""

    def __init__(self, hub: Hub, project_id: int) -> None:
        self.hub = hub
        self.project_id = project_id
        self.group = events.project_group(project_id)
        self.members: set[Member] = set()
        self.head = 0  # every event of the project with id <= head has been read (or predates the feed)
        self.start = 0  # the buffer holds every event of the project with start < id <= head
        self.buffer: deque[tuple[int, int | None, str]] = deque()
        self.reads = 0  # log reads made by this feed (observability and tests)
        self.announced = 0  # the highest id a wake-up announced for this project
        self._wanted = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def open(self) -> None:
        # Join the group FIRST: a commit from here on wakes the feed; anything committed
        # before is at or below the head read next (or, not yet visible, read at a later wake-up).
        await self.hub.layer.group_add(self.group, self.hub.channel)
        self.head = self.start = await database_sync_to_async(replay.latest_event_id)()
        self._task = asyncio.ensure_future(self._run())

    def wake(self, max_id: int) -> None:
        if max_id >= _WAKE_ALL:  # "read whatever is there" (pgnotify after a reconnect): no id to wait for
            self.sweep()
            return
        self.announced = max(self.announced, max_id)
        if max_id > self.head:
            self._wanted.set()

    def sweep(self) -> None:
        """Read once, whatever was announced (the sweep's safety net for lost wake-ups)."""
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
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            delay, waited = _RECHECK_FIRST, 0.0
            while True:
                try:
                    await self._read()
                except asyncio.CancelledError:
                    raise
                except Exception:  # a database hiccup: the next wake-up or the sweep reads again
                    log.warning("event feed read for project %s failed", self.project_id, exc_info=True)
                    break
                for member in list(self.members):
                    member.feed_advanced(self.project_id)
                if self.head >= self.announced or waited >= float(settings.LIVE_SWEEP_SECONDS):
                    break
                # The announced event is committed but not readable yet: it sits above the log's
                # watermark while an older transaction of this database is still open
                # (novelforge_sessions.events). Nothing announces that transaction's end, so
                # re-read shortly, backing off; a new wake-up reads at once.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wanted.wait(), delay)
                self._wanted.clear()
                waited += delay
                delay = min(delay * 2, _RECHECK_MAX)

    async def _read(self) -> None:
        limit = replay.PAGE_SIZE
        keep = int(settings.LIVE_BUFFER_EVENTS)
        while True:
            page = await database_sync_to_async(_read_after)(self.project_id, self.head, limit)
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
        self._tasks: list[asyncio.Task] = []
        self._lock = asyncio.Lock()

    async def join(self, member: Member, project_id: int) -> Feed:
        async with self._lock:
            if not self.channel:
                self.channel = await self.layer.new_channel(prefix="nf-live-hub")
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
        self.channel = ""

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
            feed = self.feeds.get(message.get("project_id"))
            if feed is not None:
                feed.wake(int(message.get("max_id") or 0))

    async def _sweep(self) -> None:
        """Lost wake-ups and expired group memberships: re-join, one read per feed."""
        while True:
            await asyncio.sleep(float(settings.LIVE_SWEEP_SECONDS))
            for feed in list(self.feeds.values()):
                try:
                    await self.layer.group_add(feed.group, self.channel)
                except Exception:
                    log.warning("event hub could not re-join %s", feed.group, exc_info=True)
                feed.sweep()


_hubs: dict[int, Hub] = {}


def hub() -> Hub:
    """This event loop's hub (a server process has one loop, so one hub)."""
    loop = asyncio.get_running_loop()
    layer = get_channel_layer()
    found = _hubs.get(id(loop))
    if found is None or found.loop is not loop or found.layer is not layer:
        found = _hubs[id(loop)] = Hub(loop, layer)
    return found
