"""The live event stream: ``/ws/events/`` (docs/model.md#events, docs/model.md#access).

Protocol (JSON text frames, at most ``MAX_FRAME_BYTES`` each from the client):

- authenticate with the browser session cookie (managers), an ``Authorization: Bearer`` header,
  or ``{"type": "auth", "token": "nfs_…"}`` as the first message (agents);
- ``{"type": "subscribe", "project_id": N, "after": ID}`` or ``{"type": "subscribe",
  "session_id": N, "after": ID}``; ``after`` is the last event id the client saw (omitted:
  "from now on"). The server answers ``{"type": "subscribed", "sub", "after"}``, then sends
  every event after ``after`` as ``{"type": "event", "sub", "event": {...}}`` in id order,
  then ``{"type": "caught_up", "sub", "cursor"}``, then live events as they commit;
- ``"batch": true`` in the subscribe message: the subscription's events come as
  ``{"type": "events", "sub", "events": [{...}, ...]}`` instead, in id order within and across
  frames: each frame carries what one delivery had for the socket (the events one read of the
  log found, or one backlog page), at most ``BATCH_MAX_EVENTS`` events and, past the first
  event, ``BATCH_MAX_BYTES`` of JSON. The same events in the same order as one frame each,
  for a fraction of the frames: when writers commit faster than a socket's deliveries run,
  one wake-up finds several events, and sending a frame costs the server about the same
  whether it holds one event or several (the dashboard and ``novelforge_client`` subscribe
  this way);
- ``{"type": "unsubscribe", "sub": "project:N"}``, ``{"type": "ping"}`` → ``{"type": "pong"}``.

Close codes: 4400 malformed frame (bad JSON, binary, unknown type, bad fields), 4401 not
authenticated, 4403 subscription refused (after an ``error`` frame), 4413 frame too large: each
refusal's catalogued class gives its error frame and its close code (``errors.ServiceError.close_code``).
A foreign ``Origin`` (host, scheme or port) never gets this far: ``live.origins.SameOriginValidator``
refuses the handshake.

Correctness. The Event table is the truth; the channel layer only says "project P has new
events". Each subscription keeps a cursor, a position in the project's log: every event at or
below it that belongs to the subscription has been sent. The process reads the log ONCE per
project per wake-up (``live.fanout``: one hub per process, one feed per project, a buffer of
the last ``LIVE_BUFFER_EVENTS`` events serialised once; under sustained writing at most
``LIVE_FEED_READS_PER_SECOND`` reads a second, each covering the wake-ups that waited) and every
socket sends from that buffer what lies after its cursor. A subscription behind the buffer (its backlog on subscribe, a
reconnect with an old ``after``, a socket that fell behind) reads the log after its own cursor
first, then continues from the buffer. On subscribe the feed joins the project's group *first*,
then the backlog is read, so an event committed meanwhile is either in the backlog or in a
later read. Every send path runs under one per-socket lock and sends only ids after the
cursor, so nothing is sent twice and nothing is skipped however wake-ups and backlog pages
interleave. Because the layer is at-most-once (and in-memory group membership expires), the
hub's periodic sweep re-joins the groups and reads each feed once, so a lost wake-up only
delays an event, never loses it. Each socket's sweep re-authorizes: a revoked token, a logout,
a deactivated account, a changed password or a lost membership ends the stream. Without Redis,
other processes' commits arrive through PostgreSQL NOTIFY (``live.pgnotify``) as the same wake-ups.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from importlib import import_module
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib import auth

from novelforge_sessions.access import Caller, caller_for_user
from novelforge_sessions.apikit.auth import caller_for_token
from novelforge_sessions.errors import (
    AlreadyAuthenticated, Forbidden, MalformedFrame, PayloadTooLarge, ServiceError, TooManySubscriptions, Unauthorized,
    UnknownFrameType,
)
from novelforge_sessions.live import fanout, pgnotify, replay
from novelforge_sessions.live.replay import Subscription

log = logging.getLogger("novelforge.live")

MAX_FRAME_BYTES = 4 * 1024
MAX_SUBSCRIPTIONS = 32
#: A batched subscription's frames: at most this many events (one backlog page) ...
BATCH_MAX_EVENTS = replay.PAGE_SIZE
#: ... and no more JSON than this once a frame holds one event (an event larger than this goes alone).
BATCH_MAX_BYTES = 256 * 1024



#: Scope key of the server's own ``send`` (``RawSendMiddleware``): the stream's frames use it.
RAW_SEND = "novelforge.raw_send"


class RawSendMiddleware:
    """Websockets, outside channels' session middleware: keeps the server's own ``send`` in the
    scope, so the stream's text frames go straight to it.

    Channels' session wrapper of ``send`` acts only on ``http.response.start`` (save the
    session, set its cookie); for every ``websocket.send`` it still reads the session's
    ``modified`` and ``is_empty()`` through a lazy object, work that decides nothing for a
    frame. Accept and close still go through the stack.
    """

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        return await self.application({**scope, RAW_SEND: send}, receive, send)


def _setting(name: str) -> float:
    """A timing knob from settings (strictly validated there; tests override with fractions)."""
    return float(getattr(settings, name))


def _bearer(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _non_negative_int(value: Any) -> int | None:
    """An id or cursor: a JSON integer that fits PostgreSQL's bigint (a JSON true is not one)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    return None


class _SessionRequest:
    """What ``django.contrib.auth.get_user`` reads of a request: its login session."""

    def __init__(self, session: Any) -> None:
        self.session = session


def _login_user(scope: dict[str, Any]) -> Any | None:
    """The user the socket's login session stands for *now*, or None: the session is read again
    from its store (a logout or an expiry deleted it) and resolved as Django's auth resolves it
    for every page request (``auth.get_user``: the backend's ``get_user`` refuses an inactive
    user, ``user_can_authenticate``, and a session whose auth hash no longer matches, as after a
    password change, is flushed). The user cached in the scope at connect is never trusted."""
    session = scope.get("session")
    key = session.session_key if session is not None else None
    if not key:
        return None
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=key)
    user = auth.get_user(_SessionRequest(store))
    return user if user.is_authenticated else None


class EventStreamConsumer(AsyncWebsocketConsumer):
    """Thin edge: parse, authorize (``replay.resolve_subscription``), read the log, send."""

    # No layer channel of its own: wake-ups reach the process's hub (live/fanout.py), which
    # tells the sockets, and nothing sends to a socket's channel. With the Redis layer each
    # socket's channel was a SUBSCRIBE at connect and an UNSUBSCRIBE at close, the latter
    # under channels_redis's per-loop lock: once, in a drain of the production server, that
    # unsubscribe waited out the whole shutdown grace.
    channel_layer_alias = None

    async def connect(self) -> None:
        # Without Redis: this process's one LISTEN for other processes' commits (started once).
        pgnotify.ensure_listener()
        self.caller: Caller | None = None
        self.subs: dict[str, Subscription] = {}
        self.cursors: dict[str, int] = {}
        self.batched: set[str] = set()  # subscriptions whose events come several to a frame
        self.joined: set[int] = set()  # projects whose feed this socket is a member of
        self.closed = False
        # One lock per socket: backlog pages, feed deliveries and sweeps never interleave their sends.
        self.send_lock = asyncio.Lock()
        self.advanced: set[int] = set()  # projects whose feed read new events since the last delivery
        self.kick = asyncio.Event()
        self.hub = fanout.hub()
        self.raw_send = self.scope.get(RAW_SEND)  # None when mounted without RawSendMiddleware
        self.tasks: list[asyncio.Task] = [asyncio.ensure_future(self._deliver_loop())]
        # Kept in memory only, to re-check revocation in the sweep; never logged.
        self.token: str | None = None
        await self.accept()
        token = _bearer(self.scope)
        if token is not None:
            self.token = token
            self.caller = await database_sync_to_async(caller_for_token)(token)
            if self.caller is None:
                await self._refuse(Unauthorized("the bearer token is not valid"))
                return
        else:
            user = self.scope.get("user")
            if user is not None and user.is_authenticated:
                self.caller = await database_sync_to_async(caller_for_user)(user)
        if self.caller is None:
            # No cookie and no header: the first message must be {"type": "auth"} — soon.
            self.tasks.append(asyncio.ensure_future(self._auth_deadline()))
        self.tasks.append(asyncio.ensure_future(self._sweep_loop()))
        log.info("socket open: %s", self.caller.label if self.caller else "awaiting auth")

    async def disconnect(self, code: int) -> None:
        self.closed = True
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for project_id in self.joined:
            await self.hub.leave(self, project_id)
        self.joined.clear()

    # ---------------------------------------------------------------- client frames
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.closed:
            return
        if text_data is None:
            await self._refuse(MalformedFrame("frames are JSON text"))
            return
        if len(text_data.encode()) > MAX_FRAME_BYTES:
            await self._refuse(PayloadTooLarge(f"frames are at most {MAX_FRAME_BYTES} bytes"))
            return
        try:
            message = json.loads(text_data)
        except (ValueError, RecursionError):  # RecursionError: a frame nested ~1,000 levels deep (4 KiB is enough)
            await self._refuse(MalformedFrame("the frame is not valid JSON"))
            return
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            await self._refuse(MalformedFrame('a frame is a JSON object with a "type"'))
            return
        kind = message["type"]
        if kind == "auth":
            await self._authenticate(message)
            return
        if self.caller is None:
            await self._refuse(Unauthorized("authenticate first (session cookie or token)"))
            return
        if kind == "subscribe":
            await self._subscribe(message)
        elif kind == "unsubscribe":
            await self._unsubscribe(message)
        elif kind == "ping":
            await self._send({"type": "pong"})
        else:
            await self._refuse(UnknownFrameType("unknown message type", type=kind[:40]))

    async def _authenticate(self, message: dict[str, Any]) -> None:
        if self.caller is not None:
            await self._refuse(AlreadyAuthenticated("this socket is already authenticated"))
            return
        token = message.get("token")
        caller = await database_sync_to_async(caller_for_token)(token) if isinstance(token, str) else None
        if caller is None:
            await self._refuse(Unauthorized("the token is not valid"))
            return
        self.caller = caller
        self.token = token
        await self._send({"type": "authenticated", "as": caller.label})

    async def _subscribe(self, message: dict[str, Any]) -> None:
        unknown = set(message) - {"type", "project_id", "session_id", "after", "batch"}
        project_id = message.get("project_id")
        session_id = message.get("session_id")
        after = message.get("after")
        batch = message.get("batch", False)
        valid = (
            not unknown
            and (project_id is None) != (session_id is None)
            and _non_negative_int(project_id if project_id is not None else session_id) is not None
            and (after is None or _non_negative_int(after) is not None)
            and isinstance(batch, bool)
        )
        if not valid:
            await self._refuse(MalformedFrame(
                "subscribe needs exactly one of project_id or session_id (integers), an optional integer after"
                " and an optional boolean batch",
            ))
            return
        assert self.caller is not None
        sub = await database_sync_to_async(replay.resolve_subscription)(
            self.caller, project_id=project_id, session_id=session_id
        )
        if sub is None:
            # Same answer for unknown and foreign ids: ids are not an oracle.
            await self._refuse(Forbidden("no such project or session is visible to you"))
            return
        if sub.key not in self.subs and len(self.subs) >= MAX_SUBSCRIPTIONS:
            await self._refuse(TooManySubscriptions(f"at most {MAX_SUBSCRIPTIONS} per socket"))
            return
        async with self.send_lock:
            # Join the project's feed FIRST: anything committed from here on either is in the
            # backlog we are about to read or in a later read of the feed.
            if sub.project_id not in self.joined:
                await self.hub.join(self, sub.project_id)
                self.joined.add(sub.project_id)
            if after is None:
                after = await database_sync_to_async(replay.latest_event_id)()
            self.subs[sub.key] = sub
            self.cursors[sub.key] = after
            if batch:
                self.batched.add(sub.key)
            else:
                self.batched.discard(sub.key)
            await self._send({"type": "subscribed", "sub": sub.key, "after": after})
            await self._catch_up(sub)
            await self._send({"type": "caught_up", "sub": sub.key, "cursor": self.cursors[sub.key]})

    async def _unsubscribe(self, message: dict[str, Any]) -> None:
        key = message.get("sub")
        async with self.send_lock:
            sub = self.subs.pop(key, None) if isinstance(key, str) else None
            self.cursors.pop(key, None)
            self.batched.discard(key)
            if sub is not None and not any(s.project_id == sub.project_id for s in self.subs.values()):
                await self.hub.leave(self, sub.project_id)
                self.joined.discard(sub.project_id)
        await self._send({"type": "unsubscribed", "sub": key if isinstance(key, str) else None})

    # ---------------------------------------------------------------- the project feeds
    def feed_advanced(self, project_id: int) -> None:
        """The feed of ``project_id`` read new events (``live.fanout``): deliver them soon."""
        self.advanced.add(project_id)
        self.kick.set()

    async def _deliver_loop(self) -> None:
        while not self.closed:
            await self.kick.wait()
            self.kick.clear()
            projects, self.advanced = self.advanced, set()
            async with self.send_lock:
                for sub in list(self.subs.values()):
                    if sub.project_id in projects:
                        await self._catch_up(sub)

    # ---------------------------------------------------------------- internals
    async def _catch_up(self, sub: Subscription) -> None:
        """Send everything after the subscription's cursor: from the feed's buffer when the
        cursor is inside it, else from the log first. Caller holds send_lock."""
        while not self.closed and sub.key in self.subs:
            feed = self.hub.feeds.get(sub.project_id)
            position = self.cursors[sub.key]
            if feed is not None and position >= feed.start:
                head = feed.head
                await self._send_events(sub.key, [text for _event_id, text in feed.events_after(position, sub.session_id)])
                self.cursors[sub.key] = max(position, head)
                return
            await self._drain(sub)
            if feed is None:  # not a member of the feed (cannot happen while subscribed): the log alone
                return

    async def _drain(self, sub: Subscription) -> None:
        """Read the log after the subscription's cursor until a short page, sending each event.

        Afterwards the cursor is at least the highest visible id under the last page's
        watermark (``replay.settled_and_page``: every id at or below it was visible to that
        read), so a session subscription whose own events are old still lands inside the
        feed's buffer.
        """
        while not self.closed and sub.key in self.subs:
            settled, page = await database_sync_to_async(replay.settled_and_page)(sub, self.cursors[sub.key])
            await self._send_events(sub.key, [json.dumps(event, separators=(",", ":")) for event in page])
            if page:
                self.cursors[sub.key] = page[-1]["id"]
            if len(page) < replay.PAGE_SIZE:
                self.cursors[sub.key] = max(self.cursors[sub.key], settled)
                return

    async def _sweep_loop(self) -> None:
        """Safety net for lost wake-ups, and a periodic re-check of who is listening.

        Every interval: the caller is rebuilt (a revoked token, or a login session that no longer
        stands for the same active user with its current password, closes the socket with 4401; a subscription the caller may no longer see closes it with 4403),
        the groups are re-joined, and every subscription reads after its cursor.
        """
        interval = _setting("LIVE_SWEEP_SECONDS")
        while not self.closed:
            await asyncio.sleep(interval)
            if self.caller is None:
                continue
            try:
                verdict = await database_sync_to_async(self._still_allowed)()
                if verdict == "unauthenticated":
                    await self._refuse(Unauthorized("the credentials are no longer valid"))
                    return
                if verdict == "forbidden":
                    await self._refuse(Forbidden("a subscription is no longer visible to you"))
                    return
                async with self.send_lock:  # the hub's own sweep re-reads the feeds
                    for sub in list(self.subs.values()):
                        await self._catch_up(sub)
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed sweep (database or layer hiccup) is retried next interval
                log.warning("event stream sweep failed", exc_info=True)

    def _still_allowed(self) -> str:
        """Sync: rebuild the caller from its credentials and re-authorize every subscription."""
        if self.token is not None:
            caller = caller_for_token(self.token)
        else:
            user = _login_user(self.scope)
            connected_as = self.scope.get("user")
            if user is None or connected_as is None or user.pk != connected_as.pk:
                return "unauthenticated"  # logged out, expired, deactivated or its password changed
            caller = caller_for_user(user)
        if caller is None:
            return "unauthenticated"
        for sub in list(self.subs.values()):
            kind, _, ident = sub.key.partition(":")
            again = replay.resolve_subscription(caller, **{f"{kind}_id": int(ident)})
            if again != sub:
                return "forbidden"
        self.caller = caller
        return "ok"

    async def _auth_deadline(self) -> None:
        await asyncio.sleep(_setting("LIVE_AUTH_TIMEOUT_SECONDS"))
        if self.caller is None and not self.closed:
            await self._refuse(Unauthorized("no credentials were presented in time"))

    async def _send_events(self, key: str, texts: list[str]) -> None:
        """Events (JSON texts, in id order) of subscription ``key``: one ``event`` frame each,
        or, for a batched subscription, ``events`` frames within ``BATCH_MAX_EVENTS`` and
        ``BATCH_MAX_BYTES``."""
        if key not in self.batched:
            prefix = '{"type":"event","sub":' + json.dumps(key) + ',"event":'
            for text in texts:
                await self._send_text(prefix + text + "}")
            return
        prefix = '{"type":"events","sub":' + json.dumps(key) + ',"events":['
        frame: list[str] = []
        size = 0
        for text in texts:
            if frame and (len(frame) >= BATCH_MAX_EVENTS or size + len(text) > BATCH_MAX_BYTES):
                await self._send_text(prefix + ",".join(frame) + "]}")
                frame, size = [], 0
            frame.append(text)
            size += len(text) + 1
        if frame:
            await self._send_text(prefix + ",".join(frame) + "]}")

    async def _send(self, payload: dict[str, Any]) -> None:
        await self._send_text(json.dumps(payload, separators=(",", ":")))

    async def _send_text(self, text: str) -> None:
        if not self.closed:
            if self.raw_send is not None:
                await self.raw_send({"type": "websocket.send", "text": text})
            else:
                await self.send(text_data=text)

    async def _refuse(self, err: ServiceError) -> None:
        """An error frame in the one error shape (the catalog's), then close with its close code."""
        if self.closed:
            return
        await self._send({"type": "error", **err.as_dict()})
        self.closed = True
        label = self.caller.label if self.caller else "anonymous"
        log.info("socket closed by server: %s %s (%s)", err.close_code, err.code, label)
        await self.close(code=err.close_code)
