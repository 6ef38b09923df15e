"""The event log: appended inside the writing transaction, broadcast after commit.

Ordering guarantee. A plain ``bigserial`` hands out ids at insert time, so a transaction
that got id 7 may commit after one that got id 8; a reader who saw 8 and remembers "after
8" would never see 7. To make ids visible in commit order, every insert here first takes
one transaction-scoped advisory lock (``pg_advisory_xact_lock``), held until commit. So a
writer can only draw ids once every earlier id-holder has committed or rolled back, and
``after=<id>`` replay has no gaps. The price is that writers serialise from their first
event insert to their commit: actions therefore append their events *last*, right before
the transaction commits (the lock is held for one insert and the commit).

Broadcast. After commit, one wake-up per transaction and project goes to the channel layer
group ``events.project.<id>``; subscribers then read the table. The channel layer is
at-most-once and only a wake-up; the table is the truth (PITFALLS.md).

Other processes. The in-memory layer (no ``REDIS_URL``) only reaches this process's sockets,
so with ``LIVE_PG_NOTIFY`` on the same after-commit wake-up also publishes ONE
``pg_notify(NOTIFY_CHANNEL, …)`` per transaction: after the commit, as its own short
autocommit statement (never inside the writing transaction, never one per row), carrying
only the projects touched and their highest ids. Each server process's listener
(``live/pgnotify.py``) forwards it into its own in-memory groups. With Redis the layer
itself crosses processes and nothing is NOTIFYed.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction

from novelforge_sessions.event_types import EventType, family_of
from novelforge_sessions.models import Event

log = logging.getLogger("novelforge.events")

#: Arbitrary constant: "NFSE". One lock for the whole log (ids are global).
EVENT_LOG_LOCK = 0x4E465345


#: The one PostgreSQL channel the wake-ups of every process go through (``live/pgnotify.py``).
NOTIFY_CHANNEL = "novelforge_events"
#: This process's mark in its NOTIFY payloads: its listener skips its own (already sent locally).
NOTIFY_ORIGIN = f"{os.getpid()}.{secrets.token_hex(4)}"
#: PostgreSQL caps a payload below 8000 bytes; a transaction touching very many projects
#: is split into several payloads (still one statement, after the commit).
_NOTIFY_PAYLOAD_BYTES = 7000


def project_group(project_id: int) -> str:
    return f"events.project.{project_id}"


def notify_payloads(max_ids: dict[int, int]) -> list[str]:
    """``{"o": origin, "p": [[project_id, max_id], ...]}`` texts, each under PostgreSQL's limit."""
    payloads: list[str] = []
    chunk: list[list[int]] = []
    size = 0
    for project_id, max_id in sorted(max_ids.items()):
        item = [project_id, max_id]
        item_size = len(str(project_id)) + len(str(max_id)) + 4
        if chunk and size + item_size > _NOTIFY_PAYLOAD_BYTES:
            payloads.append(json.dumps({"o": NOTIFY_ORIGIN, "p": chunk}, separators=(",", ":")))
            chunk, size = [], 0
        chunk.append(item)
        size += item_size
    if chunk:
        payloads.append(json.dumps({"o": NOTIFY_ORIGIN, "p": chunk}, separators=(",", ":")))
    return payloads


def _publish_notify(max_ids: dict[int, int]) -> None:
    """One ``pg_notify`` statement for the whole transaction, run after its commit.

    Sent on the raw psycopg connection of this thread's Django connection (already open: the
    transaction just committed on it), in autocommit: it is not part of the writing
    transaction, and it stays outside Django's query log, so the write paths' query-count
    pins measure the transaction alone (the NOTIFY is one extra round trip after COMMIT).
    """
    raw = connection.connection
    if raw is None:
        return
    payloads = notify_payloads(max_ids)
    try:
        if len(payloads) == 1:
            raw.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, payloads[0]])
        else:
            raw.execute("SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", [NOTIFY_CHANNEL, payloads])
    except Exception:  # lost: the other processes' sockets get the events at their next sweep
        log.warning("event NOTIFY for projects %s failed", sorted(max_ids), exc_info=True)


class _Wakeup:
    """One per transaction: collects the projects touched and the highest id, sends once."""

    def __init__(self) -> None:
        self.max_ids: dict[int, int] = {}

    def add(self, project_id: int, event_id: int) -> None:
        self.max_ids[project_id] = max(event_id, self.max_ids.get(project_id, 0))

    def __call__(self) -> None:
        from channels.layers import InMemoryChannelLayer, get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return
        # The in-memory layer only reaches consumers of this process. With no member in the
        # group nobody here can hear the wake-up, so skip it: ``async_to_sync`` starts a thread
        # and an event loop per call, the largest cost of a write's after-commit. Safe because
        # a consumer joins the group *before* reading the table (live/consumers.py): one that
        # joins after this check still reads this committed event. Exact type: a subclass (or
        # channels_redis, whose listeners live in other processes) always gets the send.
        local = layer.groups if type(layer) is InMemoryChannelLayer else None
        for project_id, max_id in self.max_ids.items():
            group = project_group(project_id)
            if local is not None and not local.get(group):
                continue
            try:
                async_to_sync(layer.group_send)(
                    group, {"type": "events.wakeup", "project_id": project_id, "max_id": max_id}
                )
            except Exception:  # a lost wake-up is recoverable: readers replay from the table
                log.warning("event wake-up for project %s failed", project_id, exc_info=True)
        # The in-memory layer cannot reach other processes: wake their listeners through
        # PostgreSQL (settings.LIVE_PG_NOTIFY; always off with Redis, which crosses processes).
        if local is not None and self.max_ids and settings.LIVE_PG_NOTIFY:
            _publish_notify(self.max_ids)


def _current_wakeup() -> _Wakeup:
    for _sids, func, _robust in connection.run_on_commit:
        if isinstance(func, _Wakeup):
            return func
    wakeup = _Wakeup()
    transaction.on_commit(wakeup, robust=True)
    return wakeup


_INSERT = (
    f"WITH l AS (SELECT pg_advisory_xact_lock({EVENT_LOG_LOCK})) "
    f"INSERT INTO {Event._meta.db_table} (project_id, session_id, run_id, type, payload, actor, created_at) "
    "SELECT %s, %s, %s, %s, %s::jsonb, %s, now() FROM l RETURNING id"
)


def append(
    *,
    project_id: int,
    type: EventType,
    session_id: int | None = None,
    run_id: int | None = None,
    payload: dict[str, Any] | None = None,
    actor: str = "",
) -> int:
    """Append one event in the current transaction and return its id.

    ``type`` is a constant of the catalog (``novelforge_sessions.event_types``), never a
    string: the payload is checked against its declared fields (``TypeError`` otherwise,
    nothing written). Must be called inside ``transaction.atomic()``; call it after the
    change it records.
    """
    if not isinstance(type, EventType):
        raise TypeError(f"events.append takes an event_types constant, not {type!r}")
    body = json.dumps(type(**(payload or {})), cls=DjangoJSONEncoder)
    if not connection.in_atomic_block:
        raise RuntimeError("events.append must run inside the writing transaction")
    with connection.cursor() as cur:
        cur.execute(_INSERT, [project_id, session_id, run_id, type.name, body, actor])
        event_id = cur.fetchone()[0]
    _current_wakeup().add(project_id, event_id)
    log.info("event %s %s project=%s session=%s run=%s actor=%s", event_id, type.name, project_id, session_id, run_id, actor)
    return event_id


def serialize(event: Event) -> dict[str, Any]:
    return {
        "id": event.id,
        "project_id": event.project_id,
        "session_id": event.session_id,
        "run_id": event.run_id,
        "type": event.type,
        "family": family_of(event.type),
        "payload": event.payload,
        "actor": event.actor,
        "created_at": event.created_at.isoformat(),
    }
