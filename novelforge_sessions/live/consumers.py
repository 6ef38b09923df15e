"""The live event stream: ``/ws/events/`` (DESIGN §8, §10).

Protocol (JSON text frames, at most ``MAX_FRAME_BYTES`` each from the client):

- authenticate with the browser session cookie (managers), an ``Authorization: Bearer`` header,
  or ``{"type": "auth", "token": "nfs_…"}`` as the first message (agents);
- ``{"type": "subscribe", "project_id": N, "after": ID}`` or ``{"type": "subscribe",
  "session_id": N, "after": ID}``; ``after`` is the last event id the client saw (omitted:
  "from now on"). The server answers ``{"type": "subscribed", "sub", "after"}``, then sends
  every event after ``after`` as ``{"type": "event", "sub", "event": {...}}`` in id order,
  then ``{"type": "caught_up", "sub", "cursor"}``, then live events as they commit;
- ``{"type": "unsubscribe", "sub": "project:N"}``, ``{"type": "ping"}`` → ``{"type": "pong"}``.

Close codes: 4400 malformed frame (bad JSON, binary, unknown type, bad fields), 4401 not
authenticated, 4403 subscription refused (after an ``error`` frame), 4413 frame too large.
A foreign ``Origin`` (host, scheme or port) never gets this far: ``live.origins.SameOriginValidator``
refuses the handshake.

Correctness. The Event table is the truth; the channel layer only says "project P has new
events". Each subscription keeps a cursor (the last id sent). On subscribe the consumer joins
the project's group *first*, then streams the backlog from the table, so an event committed
while the backlog is read is either in a page or announced by a wake-up that arrives later.
Every send path reads "after my cursor" under one per-socket lock, so nothing is sent twice
and nothing is skipped however wake-ups and backlog pages interleave. Because the layer is
at-most-once (and in-memory group membership expires), a periodic sweep re-joins the groups
and reads after each cursor, so a lost wake-up only delays an event, never loses it. The
sweep also re-authorizes: a revoked token, a logout or a lost membership ends the stream.
Without Redis, other processes' commits arrive through PostgreSQL NOTIFY (``live.pgnotify``)
as the same wake-ups.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from novelforge_sessions.access import Caller, caller_for_user
from novelforge_sessions.api.auth import caller_for_token
from novelforge_sessions.live import pgnotify, replay
from novelforge_sessions.live.replay import Subscription

log = logging.getLogger("novelforge.live")

MAX_FRAME_BYTES = 4 * 1024
MAX_SUBSCRIPTIONS = 32

CLOSE_MALFORMED = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_TOO_LARGE = 4413


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


class EventStreamConsumer(AsyncWebsocketConsumer):
    """Thin edge: parse, authorize (``replay.resolve_subscription``), read the log, send."""

    async def connect(self) -> None:
        # Without Redis: this process's one LISTEN for other processes' commits (started once).
        pgnotify.ensure_listener()
        self.caller: Caller | None = None
        self.subs: dict[str, Subscription] = {}
        self.cursors: dict[str, int] = {}
        self.joined: set[str] = set()
        self.closed = False
        # One lock per socket: backlog pages, wake-ups and sweeps never interleave their sends.
        self.send_lock = asyncio.Lock()
        self.tasks: list[asyncio.Task] = []
        # Kept in memory only, to re-check revocation in the sweep; never logged.
        self.token: str | None = None
        await self.accept()
        token = _bearer(self.scope)
        if token is not None:
            self.token = token
            self.caller = await database_sync_to_async(caller_for_token)(token)
            if self.caller is None:
                await self._refuse(CLOSE_UNAUTHENTICATED, "unauthorized", "the bearer token is not valid")
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
        for group in self.joined:
            await self.channel_layer.group_discard(group, self.channel_name)
        self.joined.clear()

    # ---------------------------------------------------------------- client frames
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.closed:
            return
        if text_data is None:
            await self._refuse(CLOSE_MALFORMED, "malformed_frame", "frames are JSON text")
            return
        if len(text_data.encode()) > MAX_FRAME_BYTES:
            await self._refuse(CLOSE_TOO_LARGE, "payload_too_large", f"frames are at most {MAX_FRAME_BYTES} bytes")
            return
        try:
            message = json.loads(text_data)
        except (ValueError, RecursionError):  # RecursionError: a frame nested ~1,000 levels deep (4 KiB is enough)
            await self._refuse(CLOSE_MALFORMED, "malformed_frame", "the frame is not valid JSON")
            return
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            await self._refuse(CLOSE_MALFORMED, "malformed_frame", 'a frame is a JSON object with a "type"')
            return
        kind = message["type"]
        if kind == "auth":
            await self._authenticate(message)
            return
        if self.caller is None:
            await self._refuse(CLOSE_UNAUTHENTICATED, "unauthorized", "authenticate first (session cookie or token)")
            return
        if kind == "subscribe":
            await self._subscribe(message)
        elif kind == "unsubscribe":
            await self._unsubscribe(message)
        elif kind == "ping":
            await self._send({"type": "pong"})
        else:
            await self._refuse(CLOSE_MALFORMED, "unknown_type", "unknown message type", type=kind[:40])

    async def _authenticate(self, message: dict[str, Any]) -> None:
        if self.caller is not None:
            await self._refuse(CLOSE_MALFORMED, "already_authenticated", "this socket is already authenticated")
            return
        token = message.get("token")
        caller = await database_sync_to_async(caller_for_token)(token) if isinstance(token, str) else None
        if caller is None:
            await self._refuse(CLOSE_UNAUTHENTICATED, "unauthorized", "the token is not valid")
            return
        self.caller = caller
        self.token = token
        await self._send({"type": "authenticated", "as": caller.label})

    async def _subscribe(self, message: dict[str, Any]) -> None:
        unknown = set(message) - {"type", "project_id", "session_id", "after"}
        project_id = message.get("project_id")
        session_id = message.get("session_id")
        after = message.get("after")
        valid = (
            not unknown
            and (project_id is None) != (session_id is None)
            and _non_negative_int(project_id if project_id is not None else session_id) is not None
            and (after is None or _non_negative_int(after) is not None)
        )
        if not valid:
            await self._refuse(
                CLOSE_MALFORMED, "malformed_frame",
                "subscribe needs exactly one of project_id or session_id (integers) and an optional integer after",
            )
            return
        assert self.caller is not None
        sub = await database_sync_to_async(replay.resolve_subscription)(
            self.caller, project_id=project_id, session_id=session_id
        )
        if sub is None:
            # Same answer for unknown and foreign ids: ids are not an oracle.
            await self._refuse(CLOSE_FORBIDDEN, "forbidden", "no such project or session is visible to you")
            return
        if sub.key not in self.subs and len(self.subs) >= MAX_SUBSCRIPTIONS:
            await self._refuse(CLOSE_MALFORMED, "too_many_subscriptions", f"at most {MAX_SUBSCRIPTIONS} per socket")
            return
        async with self.send_lock:
            # Join the group FIRST: anything committed from here on either is in the backlog we
            # are about to read or produces a wake-up we will handle after it.
            if sub.group not in self.joined:
                await self.channel_layer.group_add(sub.group, self.channel_name)
                self.joined.add(sub.group)
            if after is None:
                after = await database_sync_to_async(replay.latest_event_id)()
            self.subs[sub.key] = sub
            self.cursors[sub.key] = after
            await self._send({"type": "subscribed", "sub": sub.key, "after": after})
            await self._drain(sub)
            await self._send({"type": "caught_up", "sub": sub.key, "cursor": self.cursors[sub.key]})

    async def _unsubscribe(self, message: dict[str, Any]) -> None:
        key = message.get("sub")
        async with self.send_lock:
            sub = self.subs.pop(key, None) if isinstance(key, str) else None
            self.cursors.pop(key, None)
            if sub is not None and not any(s.group == sub.group for s in self.subs.values()):
                await self.channel_layer.group_discard(sub.group, self.channel_name)
                self.joined.discard(sub.group)
        await self._send({"type": "unsubscribed", "sub": key if isinstance(key, str) else None})

    # ---------------------------------------------------------------- channel layer
    async def events_wakeup(self, message: dict[str, Any]) -> None:
        """``{"type": "events.wakeup", "project_id", "max_id"}`` from ``events.append``'s on_commit."""
        project_id = message.get("project_id")
        max_id = message.get("max_id") or 0
        async with self.send_lock:
            for key, sub in list(self.subs.items()):
                # Skip the read when this subscription has already sent past the announced id.
                if sub.project_id == project_id and self.cursors.get(key, 0) < max_id:
                    await self._drain(sub)

    # ---------------------------------------------------------------- internals
    async def _drain(self, sub: Subscription) -> None:
        """Send everything after the subscription's cursor, page by page. Caller holds send_lock."""
        while not self.closed and sub.key in self.subs:
            page = await database_sync_to_async(replay.events_after)(sub, self.cursors[sub.key], replay.PAGE_SIZE)
            for event in page:
                await self._send({"type": "event", "sub": sub.key, "event": event})
                self.cursors[sub.key] = event["id"]
            if len(page) < replay.PAGE_SIZE:
                return

    async def _sweep_loop(self) -> None:
        """Safety net for lost wake-ups, and a periodic re-check of who is listening.

        Every interval: the caller is rebuilt (a revoked token or an ended login session closes
        the socket with 4401; a subscription the caller may no longer see closes it with 4403),
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
                    await self._refuse(CLOSE_UNAUTHENTICATED, "unauthorized", "the credentials are no longer valid")
                    return
                if verdict == "forbidden":
                    await self._refuse(CLOSE_FORBIDDEN, "forbidden", "a subscription is no longer visible to you")
                    return
                async with self.send_lock:
                    for group in list(self.joined):
                        await self.channel_layer.group_add(group, self.channel_name)
                    for sub in list(self.subs.values()):
                        await self._drain(sub)
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed sweep (database or layer hiccup) is retried next interval
                log.warning("event stream sweep failed", exc_info=True)

    def _still_allowed(self) -> str:
        """Sync: rebuild the caller from its credentials and re-authorize every subscription."""
        if self.token is not None:
            caller = caller_for_token(self.token)
        else:
            session = self.scope.get("session")
            user = self.scope.get("user")
            if session is None or user is None or not session.exists(session.session_key or ""):
                return "unauthenticated"  # logged out (or the login session expired)
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
            await self._refuse(CLOSE_UNAUTHENTICATED, "unauthorized", "no credentials were presented in time")

    async def _send(self, payload: dict[str, Any]) -> None:
        if not self.closed:
            await self.send(text_data=json.dumps(payload, separators=(",", ":")))

    async def _refuse(self, code: int, error: str, message: str, **details: Any) -> None:
        """An error frame in the one error shape, then close with ``code``."""
        if self.closed:
            return
        await self._send({"type": "error", "error": {"code": error, "message": message, "details": details}})
        self.closed = True
        label = self.caller.label if self.caller else "anonymous"
        log.info("socket closed by server: %s %s (%s)", code, error, label)
        await self.close(code=code)
