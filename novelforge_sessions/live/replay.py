"""Synchronous reads behind the event stream: who may subscribe to what, and the log after an id.

The websocket consumer calls these through ``database_sync_to_async``. Replay is simply
"events with id > cursor, ordered by id", below the watermark (``events.events_after``, see
``novelforge_sessions.events``), so a reader that has seen id N never later discovers a
committed id below N, and a cursor is all a subscription needs to be gap-free.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from novelforge_sessions import events
from novelforge_sessions.access import Caller
from novelforge_sessions.models import Event

#: Rows read per query while a backlog is streamed (keyset pages on an indexed column).
PAGE_SIZE = 200


@dataclass(frozen=True)
class Subscription:
    """What one subscription streams: one project's events, or one session's.

    ``session_id`` is also set for a project subscription made by a session-bound token, which
    sees only its own session (docs/model.md#access). ``project_id`` names the channel-layer group that
    wakes the subscription up.
    """

    key: str
    project_id: int
    session_id: int | None

    @property
    def group(self) -> str:
        return events.project_group(self.project_id)


def resolve_subscription(caller: Caller, *, project_id: int | None = None, session_id: int | None = None) -> Subscription | None:
    """Authorize a subscription; ``None`` when the caller may not see it (or it does not exist).

    Unknown and foreign ids get the same answer, so ids are not an oracle.
    """
    if "read" not in caller.permissions:
        return None
    if session_id is not None:
        found = caller.sessions().filter(id=session_id).values_list("project_id", flat=True).first()
        if found is None:
            return None
        return Subscription(key=f"session:{session_id}", project_id=found, session_id=session_id)
    if project_id is None or project_id not in caller.project_ids:
        return None
    if not caller.projects().filter(id=project_id).exists():
        return None
    # A session-bound token's project stream is what BOUND_TOKEN_MATRIX["event"] gives it: its
    # own session's events (never widened by the ``project`` permission).
    rule = caller.bound_for("event")
    return Subscription(key=f"project:{project_id}", project_id=project_id,
                        session_id=None if rule is None else caller.session_id)


def events_after(sub: Subscription, after: int, limit: int = PAGE_SIZE) -> list[dict[str, Any]]:
    """Up to ``limit`` events of the subscription with ``id > after``, oldest first."""
    return [events.serialize(e) for e in events.events_after(_queryset(sub), after, limit)]


def _queryset(sub: Subscription) -> QuerySet:
    qs = Event.objects.filter(project_id=sub.project_id)
    if sub.session_id is not None:
        qs = qs.filter(session_id=sub.session_id)
    return qs


def latest_event_id() -> int:
    """The highest committed event id (0 for an empty log): "from now on" for a new subscriber."""
    return events.latest_visible_id()


def settled_and_page(sub: Subscription, after: int, limit: int = PAGE_SIZE) -> tuple[int, list[dict[str, Any]]]:
    """The highest visible id of the whole log, and the subscription's next page after
    ``after``, under ONE reading of the watermark: every event of the subscription after
    ``after`` and at or below that id is in the page, unless the page is full. A reader may
    move its cursor to that id after a short page and skip nothing (the stream's drain)."""
    marks = events.read_marks()
    return events.latest_visible_id(marks), [
        events.serialize(e) for e in events.events_after(_queryset(sub), after, limit, marks)
    ]
