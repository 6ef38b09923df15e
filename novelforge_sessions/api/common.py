"""Shared pieces of the API routers: declared error responses, pagination, lookups."""
from __future__ import annotations

from django.db.models import Model, QuerySet
from django.http import HttpRequest

from novelforge_sessions.access import Caller
from novelforge_sessions.api.schemas import MAX_PAGE, ErrorOut
from novelforge_sessions.errors import NotFound

__all__ = ["MAX_PAGE", "caller", "errors", "get_or_404", "keyset"]

#: Said by every route that carries a runtime's own work on its run (DESIGN §13).
RUNTIME_GONE = (
    "409 `no_live_runtime` when the session's runtime is gone (its lease ran out, even before the reconciler "
    "recorded it lost, or it was closed or lost): nothing is written; resume the session."
)


def errors(*statuses: int) -> dict[int, type[ErrorOut]]:
    """Declare the error statuses an endpoint can return (401 always: every route is authed)."""
    return {status: ErrorOut for status in sorted({401, 422, *statuses})}


def caller(request: HttpRequest) -> Caller:
    return request.auth  # set by TokenAuth


def keyset(qs: QuerySet, *, after: int | None, limit: int, within: str | None = None) -> dict:
    """Keyset pagination on the primary key: cost stays flat however long the table grows.

    ``within``: a column ``qs`` pins to ONE value (with ``__any``, see ``models.AnyId``); the
    order becomes ``(within, id)``, the same rows in the same order, read from that column's
    ``(within, …, id)`` index instead of a walk of the primary key.

    ``limit`` comes from the route's ``schemas.page_limit()`` parameter, so it is 1..MAX_PAGE
    (out of range was refused with 422 before the view ran); nothing is clamped here.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit {limit} is outside 1..{MAX_PAGE}: declare it with schemas.page_limit()")
    if after is not None:
        qs = qs.filter(id__gt=after)
    items = list(qs.order_by(*([within] if within else []), "id")[: limit + 1])
    more = len(items) > limit
    items = items[:limit]
    return {"items": items, "next_after": items[-1].id if more and items else None}


def get_or_404(qs: QuerySet, what: str, **lookup) -> Model:
    try:
        return qs.get(**lookup)
    except qs.model.DoesNotExist:
        raise NotFound(f"{what} not found", **lookup) from None
