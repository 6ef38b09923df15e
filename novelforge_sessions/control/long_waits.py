"""A handoff that has waited too long becomes an event (docs/webhooks.md#event-types).

Nothing in the log marks the moment a handoff has waited longer than N: its wait is the
absence of a result. ``notice_long_waits`` (run by the webhook sender before each pass, so a
subscriber gets it like any event) writes one ``handoff.waiting_long`` event per handoff still
waiting (pending or claimed) ``threshold`` seconds after it was created. Once per handoff,
however many senders run: each handoff's check and write happen under its session's ordering
lock, so a second sender sees the first one's event and writes none.
"""
from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from novelforge_sessions import event_types as ev
from novelforge_sessions import events
from novelforge_sessions import lifecycles as lc
from novelforge_sessions.control.models import Handoff
from novelforge_sessions.models import Event

ACTOR = "system:long-wait"
#: Handoffs noticed per call (the oldest first; the next pass takes the rest).
BATCH = 200


def _noticed(session_ids) -> set[int]:
    """The handoffs of these sessions that have their ``handoff.waiting_long`` event."""
    found = Event.objects.filter(session_id__in=session_ids, type=ev.HANDOFF_WAITING_LONG.name)
    return {int(h) for h in found.values_list("payload__handoff_id", flat=True)}


def notice_long_waits(threshold_seconds: int) -> int:
    """Write ``handoff.waiting_long`` for each handoff waiting longer than the threshold that has
    none yet; returns how many were written (0 when ``threshold_seconds`` is 0: off)."""
    if threshold_seconds <= 0:
        return 0
    cutoff = timezone.now() - timedelta(seconds=threshold_seconds)
    waiting = list(Handoff.objects.filter(state__in=lc.HANDOFF_WAITING, created_at__lte=cutoff)
                   .order_by("created_at", "id").values_list("id", "session_id"))
    noticed = _noticed({s for _, s in waiting})
    written = 0
    for handoff_id, session_id in [w for w in waiting if w[0] not in noticed][:BATCH]:
        with transaction.atomic():
            events.order_lock(session_id)  # before any read that decides: one writer per session at a time
            handoff = Handoff.objects.filter(id=handoff_id, state__in=lc.HANDOFF_WAITING).first()
            if handoff is None or handoff_id in _noticed([session_id]):
                continue  # bound or cancelled meanwhile, or another sender noticed it first
            waited = int((timezone.now() - handoff.created_at).total_seconds())
            events.append(
                project_id=handoff.project_id, session_id=handoff.session_id, run_id=handoff.run_id,
                type=ev.HANDOFF_WAITING_LONG, actor=ACTOR,
                payload={"handoff_id": handoff.id, "logical_id": handoff.logical_id, "state": handoff.state,
                         "waited_seconds": waited, "threshold_seconds": threshold_seconds},
            )
            written += 1
    return written
