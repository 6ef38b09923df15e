"""Cross-process wake-ups without Redis: one PostgreSQL ``LISTEN`` per server process.

With the in-memory channel layer, ``events._Wakeup`` publishes one ``pg_notify`` per committed
transaction (``events.NOTIFY_CHANNEL``, payload ``{"o": origin, "p": [[project_id, max_id],
…]}``). Here each process runs ONE background task, started by its first HTTP request or websocket
(``ensure_listener``, from ``ListenerStart`` and the consumer), holding an async psycopg connection that LISTENs on that
channel and forwards each notification into this process's in-memory layer as the usual
``events.wakeup`` group message. Consumers then read the Event table from their cursors, as
for a local wake-up, so a notification delivered twice sends nothing twice. The process's
own notifications are skipped (its after-commit hook already woke its sockets).

Losses are bounded: when the connection drops, the task reconnects with backoff (0.1 s
doubling to 5 s) and, once LISTENing again, wakes every local project group so whatever was
committed in the gap is read at once; the sockets' periodic sweep remains the last net.
The connection is named ``application_name = LISTENER_APPLICATION_NAME`` in
``pg_stat_activity``.

Presence. A NOTIFY reaches every listener, its sender's own included. In a single server
process (``make run``) that was a round trip after every commit that nobody needed, and this
process's listener waking to skip it. So the listeners announce themselves to each other,
and a process whose listener knows that no other process listens sends no NOTIFY
(``events.notify_reaches_nobody``):

- after LISTEN, a listener counts the other listeners' connections (``pg_stat_activity``, by
  ``application_name``) and says ``{"o": origin, "hello": 1}``, in one statement;
- a listener that hears a hello adds its sender to the others it knows (from then on its
  process NOTIFYs after every commit), and only then answers ``{"o": origin, "here": 1}``;
- the new listener's round ends when it has heard from as many others as it counted (a
  hello or an answer each), or after ``PRESENCE_WAIT_SECONDS``. Then it wakes every local
  feed once, so whatever another process committed before it learned of this one is read.
  Until the round ends, while the connection is down, and after a round that ended with a
  counted listener unheard from, its process NOTIFYs after every commit;
- the others it knows are forgotten only when, at a sweep (``LIVE_SWEEP_SECONDS``), no other
  listener's connection is left in ``pg_stat_activity`` and no presence message arrived while
  that was counted.

Nothing here can lose an event: the log is the truth and every read is keyset from a cursor.
What a wrong guess costs is time: a socket of a process whose listener was not known yet
gets another process's event at its next wake-up or sweep instead of at once. The rounds
keep that window to a listener's start.

A process without a listener (the reconciler, a shell, a server before its first request)
hears none of this, so it always NOTIFYs. A server starts its listener with its first HTTP
request, not only with its first socket, so a lone server that serves only the API (the agents'
writes, no dashboard open) saves the NOTIFY as well.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

import psycopg
from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.db import connection

from novelforge_sessions import events
from novelforge_sessions.events import NOTIFY_CHANNEL, NOTIFY_ORIGIN, WAKE_ALL, project_group
from novelforge_sessions.live import connparams

log = logging.getLogger("novelforge.live")

#: ``application_name`` of the listener's connection: this prefix and the process id.
APPLICATION_NAME_PREFIX = "novelforge-live-listener-"
LISTENER_APPLICATION_NAME = f"{APPLICATION_NAME_PREFIX}{os.getpid()}"
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 5.0
_GROUP_PREFIX = project_group(0)[:-1]  # "events.project."
#: How long a new listener waits to hear from the other listeners it counted.
PRESENCE_WAIT_SECONDS = 2.0
#: Every payload this process sends starts so (``events.notify_payloads``, ``_presence_payload``).
_OWN_PREFIX = json.dumps({"o": NOTIFY_ORIGIN}, separators=(",", ":"))[:-1]

#: The other processes' listener connections in this database (never this process's own).
_OTHER_LISTENERS_SQL = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND application_name LIKE %s AND application_name <> %s"
)
_OTHER_LISTENERS_PARAMS = [APPLICATION_NAME_PREFIX + "%", LISTENER_APPLICATION_NAME]
#: Count them and say hello in one statement, after LISTEN: a listener that connects later
#: says its own hello after its own LISTEN, which this one, already listening, hears.
_HELLO_SQL = f"SELECT ({_OTHER_LISTENERS_SQL}), pg_notify(%s, %s)"

_task: asyncio.Task | None = None


def _presence_payload(kind: str) -> str:
    return json.dumps({"o": NOTIFY_ORIGIN, kind: 1}, separators=(",", ":"))


class _Presence:
    """What this process's listener knows of the other processes' listeners."""

    def __init__(self) -> None:
        self.others: set[str] = set()  # origins heard from (a hello or an answer); never forgotten one by one
        self.generation = 0  # presence messages heard so far
        self.settled = False  # the listener is connected and its round has ended
        self.unsure = False  # a round ended before every listener counted was heard from
        self.loop: asyncio.AbstractEventLoop | None = None
        self.round: tuple[int, set[str]] | None = None  # (others counted, others heard) while a round runs

    def reaches_nobody(self) -> bool:
        """From any thread (``events.notify_reaches_nobody``): no other process listens, as far
        as a running, settled listener of this process knows."""
        loop, task = self.loop, _task
        return (
            self.settled and not self.others and not self.unsure and loop is not None and loop.is_running()
            and task is not None and not task.done()
        )

    def begin_round(self, counted: int) -> None:
        self.settled = False
        self.round = (counted, set())
        if counted == 0:
            self.end_round()

    def end_round(self) -> None:
        """Every listener counted was heard from, or ``PRESENCE_WAIT_SECONDS`` went by. In the
        latter case one that did not answer may still be alive (slow), so this process keeps
        sending NOTIFY until a sweep finds its connection gone (``_prune_forever``)."""
        if self.round is None:
            return
        counted, heard = self.round
        self.round = None
        self.unsure = self.unsure or len(heard) < counted
        self.settled = True
        log.info(
            "event listener heard from %d of the %d other listener(s) it counted; %s", len(heard), counted,
            "sending NOTIFY after each commit" if (self.others or self.unsure) else "no NOTIFY: nobody else listens",
        )
        # Whatever another process committed before it learned of this listener had no
        # NOTIFY here: read it now (and what was committed while this connection was down).
        asyncio.ensure_future(_wake_all_local())

    def heard(self, origin: str, *, hello: bool) -> None:
        self.others.add(origin)  # first: from here on this process NOTIFYs after every commit
        self.generation += 1
        if self.round is not None:
            counted, heard = self.round
            heard.add(origin)
            if len(heard) >= counted:
                self.end_round()
        if hello:
            asyncio.ensure_future(_answer())  # only now: the answer promises the NOTIFYs

    def disconnected(self) -> None:
        self.settled = False
        self.round = None


_presence = _Presence()
events.notify_reaches_nobody = _presence.reaches_nobody


def _notify_sync(payload: str) -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, payload])


def _count_other_listeners() -> int:
    with connection.cursor() as cur:
        cur.execute(_OTHER_LISTENERS_SQL, _OTHER_LISTENERS_PARAMS)
        return cur.fetchone()[0]


async def _answer() -> None:
    try:
        # Not on the listener's connection: its notifies() holds it while it waits.
        await database_sync_to_async(_notify_sync)(_presence_payload("here"))
    except Exception:  # the new listener stops waiting after PRESENCE_WAIT_SECONDS
        log.warning("answering another event listener's hello failed", exc_info=True)


async def _prune_forever() -> None:
    """Forget the others once none of their connections is left (checked at each sweep)."""
    while True:
        await asyncio.sleep(float(settings.LIVE_SWEEP_SECONDS))
        if not (_presence.others or _presence.unsure):
            continue
        seen = _presence.generation
        try:
            left = await database_sync_to_async(_count_other_listeners)()
        except Exception:
            log.warning("counting the other event listeners failed", exc_info=True)
            continue
        if left == 0 and _presence.generation == seen:  # a hello heard meanwhile keeps them
            _presence.others.clear()
            _presence.unsure = False
            log.info("no other process listens for event wake-ups: this one stops sending NOTIFY")


def _layer() -> InMemoryChannelLayer | None:
    layer = get_channel_layer()
    return layer if type(layer) is InMemoryChannelLayer else None


def enabled() -> bool:
    return bool(settings.LIVE_PG_NOTIFY) and _layer() is not None


def ensure_listener() -> None:
    """Start this process's listener once (call from a running event loop; cheap when running)."""
    global _task
    loop = asyncio.get_running_loop()
    if _task is not None and not _task.done() and _task.get_loop() is loop:
        return
    if not enabled():
        return
    _presence.loop = loop
    _task = loop.create_task(_listen_forever(), name="novelforge-pg-listener")


class ListenerStart:
    """ASGI wrapper for HTTP (``novelforge_sessions/asgi.py``): each request makes sure this
    process's listener runs (one check once it does), so a server learns whether anybody else
    listens before any of its sockets exist."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        ensure_listener()
        await self.app(scope, receive, send)


async def _listen_forever() -> None:
    backoff = BACKOFF_FIRST
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(autocommit=True, **connparams.plain_conninfo(LISTENER_APPLICATION_NAME))
            async with conn:
                await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                cursor = await conn.execute(_HELLO_SQL, [*_OTHER_LISTENERS_PARAMS, NOTIFY_CHANNEL, _presence_payload("hello")])
                counted = (await cursor.fetchone())[0]
                log.info("listening for event wake-ups on %s (%d other listener(s))", NOTIFY_CHANNEL, counted)
                backoff = BACKOFF_FIRST
                # Anything committed before LISTEN took effect (first start or a reconnect gap)
                # has no notification here: it is read when the round ends (_Presence.end_round).
                timer = asyncio.get_running_loop().call_later(PRESENCE_WAIT_SECONDS, _presence.end_round)
                prune = asyncio.ensure_future(_prune_forever())
                try:
                    _presence.begin_round(counted)
                    async for notify in conn.notifies():
                        await _forward(notify.payload)
                finally:
                    _presence.disconnected()
                    timer.cancel()
                    prune.cancel()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("event wake-up listener lost its connection; reconnecting in %.1f s", backoff, exc_info=True)
        await asyncio.sleep(backoff)  # backoff between attempts, not a synchronisation
        backoff = min(backoff * 2, BACKOFF_MAX)


async def _forward(payload: str) -> None:
    if payload.startswith(_OWN_PREFIX):
        return  # ours (a wake-up: the after-commit hook already woke this process's sockets)
    try:
        message = json.loads(payload)
        origin = message["o"]
        if origin == NOTIFY_ORIGIN:
            return
        if "p" not in message and (message.get("hello") or message.get("here")) and isinstance(origin, str):
            _presence.heard(origin, hello=bool(message.get("hello")))
            return
        items = [(int(pid), int(max_id)) for pid, max_id in message["p"]]
    except (ValueError, TypeError, KeyError, AttributeError):
        log.warning("ignored a malformed event wake-up notification (%d bytes)", len(payload))
        return
    layer = _layer()
    if layer is None:
        return
    for project_id, max_id in items:
        await _send(layer, project_id, max_id)


async def _wake_all_local() -> None:
    layer = _layer()
    if layer is None:
        return
    for group in list(layer.groups):
        if group.startswith(_GROUP_PREFIX) and group[len(_GROUP_PREFIX):].isdigit():
            await _send(layer, int(group[len(_GROUP_PREFIX):]), WAKE_ALL)


async def _send(layer: InMemoryChannelLayer, project_id: int, max_id: int) -> None:
    group = project_group(project_id)
    if not layer.groups.get(group):
        return  # nobody here listens to that project
    try:
        await layer.group_send(group, {"type": "events.wakeup", "project_id": project_id, "max_id": max_id})
    except Exception:  # at-most-once like any wake-up: the sweep reads it later
        log.warning("forwarding an event wake-up for project %s failed", project_id, exc_info=True)
