"""Runtime routing (docs/model.md#runtime-routing): which live runtimes declare a capability.

A gate routes work to a connected runtime that declares what the work needs before it
declares a human wait; resume uses the same question for pending handoffs. "Live" means the
attachment is ``live`` *and* its lease has not run out: a record saying live is an
observation, the lease is the proof.
"""
from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db.models import QuerySet

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.actions.lifecycle import check
from novelforge_sessions.models import RuntimeAttachment


def live_runtimes_for(
    project_ids: Iterable[int], capabilities: Iterable[str], *, now: datetime | None = None,
    exclude_session_id: int | None = None,
) -> QuerySet[RuntimeAttachment]:
    """Live, unexpired runtimes in these projects whose declared capabilities include all of
    ``capabilities`` (jsonb containment). Oldest attachment first."""
    qs = RuntimeAttachment.objects.live(now).filter(session__project_id__in=list(project_ids))
    caps = sorted(set(capabilities))
    if caps:
        qs = qs.filter(capabilities__contains=caps)
    if exclude_session_id is not None:
        qs = qs.exclude(session_id=exclude_session_id)
    return qs.select_related("session").order_by("id")


def eligible_runtimes(caller: Caller, capabilities: list[str], *, limit: int = 50) -> list[RuntimeAttachment]:
    """The caller's project's live runtimes that can serve ``capabilities``."""
    caller.require("read")
    caps = check(rt.validate_capabilities, capabilities, "capability")
    qs = live_runtimes_for(caller.project_ids, caps)
    if caller.session_id is not None:
        # A token bound to one session sees only that session (access.Caller), here too.
        qs = caller.scope("routing", qs)
    return list(qs[: max(1, min(limit, 200))])
