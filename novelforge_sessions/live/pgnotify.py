"""Cross-process wake-ups without Redis: one PostgreSQL ``LISTEN`` per server process.

With the in-memory channel layer, ``events._Wakeup`` publishes one ``pg_notify`` per committed
transaction (``events.NOTIFY_CHANNEL``, payload ``{"o": origin, "p": [[project_id, max_id],
…]}``). Here each process runs ONE background task, started lazily by its first websocket
consumer (``ensure_listener``), holding an async psycopg connection that LISTENs on that
channel and forwards each notification into this process's in-memory layer as the usual
``events.wakeup`` group message. Consumers then read the Event table from their cursors, as
for a local wake-up, so a notification delivered twice sends nothing twice. The process's
own notifications are skipped (its after-commit hook already woke its sockets).

Losses are bounded: when the connection drops, the task reconnects with backoff (0.1 s
doubling to 5 s) and, once LISTENing again, wakes every local project group so whatever was
committed in the gap is read at once; the sockets' periodic sweep remains the last net.
The connection is named ``application_name = LISTENER_APPLICATION_NAME`` in
``pg_stat_activity``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os

import psycopg
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings

from novelforge_sessions.events import NOTIFY_CHANNEL, NOTIFY_ORIGIN, WAKE_ALL, project_group
from novelforge_sessions.live import connparams

log = logging.getLogger("novelforge.live")

#: ``application_name`` of the listener's connection: this prefix and the process id.
APPLICATION_NAME_PREFIX = "novelforge-live-listener-"
LISTENER_APPLICATION_NAME = f"{APPLICATION_NAME_PREFIX}{os.getpid()}"
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 5.0
_GROUP_PREFIX = project_group(0)[:-1]  # "events.project."

_task: asyncio.Task | None = None


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
    _task = loop.create_task(_listen_forever(), name="novelforge-pg-listener")


async def _listen_forever() -> None:
    backoff = BACKOFF_FIRST
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(autocommit=True, **connparams.plain_conninfo(LISTENER_APPLICATION_NAME))
            async with conn:
                await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                log.info("listening for event wake-ups on %s", NOTIFY_CHANNEL)
                backoff = BACKOFF_FIRST
                # Anything committed before LISTEN took effect (first start or a reconnect gap)
                # has no notification here: read it now.
                await _wake_all_local()
                async for notify in conn.notifies():
                    await _forward(notify.payload)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("event wake-up listener lost its connection; reconnecting in %.1f s", backoff, exc_info=True)
        await asyncio.sleep(backoff)  # backoff between attempts, not a synchronisation
        backoff = min(backoff * 2, BACKOFF_MAX)


async def _forward(payload: str) -> None:
    layer = _layer()
    if layer is None:
        return
    try:
        message = json.loads(payload)
        if message.get("o") == NOTIFY_ORIGIN:
            return  # ours: the after-commit hook already woke this process's sockets
        items = [(int(pid), int(max_id)) for pid, max_id in message["p"]]
    except (ValueError, TypeError, KeyError, AttributeError):
        log.warning("ignored a malformed event wake-up notification (%d bytes)", len(payload))
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
