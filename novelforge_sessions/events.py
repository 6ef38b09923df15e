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
"""
from __future__ import annotations

import json
import logging
from typing import Any

from asgiref.sync import async_to_sync
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction

from novelforge_sessions.event_types import EventType, family_of
from novelforge_sessions.models import Event

log = logging.getLogger("novelforge.events")

#: Arbitrary constant: "NFSE". One lock for the whole log (ids are global).
EVENT_LOG_LOCK = 0x4E465345


def project_group(project_id: int) -> str:
    return f"events.project.{project_id}"


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
