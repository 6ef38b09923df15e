"""The event log over HTTP: ``GET /api/v1/events?after=<id>`` (keyset; ids are commit-ordered)."""
from __future__ import annotations

from django.http import HttpRequest
from ninja import Router

from novelforge_sessions import events
from novelforge_sessions.apikit.common import caller, errors, keyset
from novelforge_sessions.api.schemas import EVENTS_AFTER_DOC, EventOut, EventTypeName
from novelforge_sessions.apikit.schemas import Page, page_after, page_limit
from novelforge_sessions.models import Event

router = Router(tags=["events"])


@router.get(
    "/events", response={200: Page[EventOut], **errors(403)},
    summary="Events after an id, oldest first (filter by session or type)",
)
def list_events(
    request: HttpRequest, after: int | None = page_after(EVENTS_AFTER_DOC), session_id: int | None = None, type: EventTypeName | None = None,
    limit: int = page_limit(100),
):
    who = caller(request)
    who.require("read")
    qs = who.scope("event", Event.objects.filter(project_id__any=sorted(who.project_ids)))
    if session_id is not None:
        qs = qs.filter(session_id__any=[session_id])
    if type:
        qs = qs.filter(type=type)
    # Read from the narrowest index: one session's (session_id[, type], id), else the one
    # project's (project_id[, type], id). Several projects (a manager): plain id order.
    if session_id is not None or who.session_id is not None:
        within = "session_id"
    elif len(who.project_ids) == 1:
        within = "project_id"
    else:
        within = None
    return keyset(events.visible(qs), after=after, limit=limit, within=within)  # the commit-ordered prefix only
