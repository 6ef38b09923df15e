"""Shared pieces of the API routers: declared error responses, pagination, lookups."""
from __future__ import annotations

from django.db.models import Model, QuerySet
from django.http import HttpRequest

from novelforge_sessions.access import Caller
from novelforge_sessions.apikit.schemas import MAX_PAGE, ErrorOut
from novelforge_sessions.errors import NotFound, UnsupportedMediaType

__all__ = ["MAX_PAGE", "caller", "errors", "get_or_404", "keyset"]

#: Said by every route that carries a runtime's own work on its run (docs/model.md#runtimes-and-leases).
RUNTIME_GONE = (
    "409 `no_live_runtime` when the session's runtime is gone (its lease ran out, even before the reconciler "
    "recorded it lost, or it was closed or lost): nothing is written; resume the session."
)


def errors(*statuses: int) -> dict[int, type[ErrorOut]]:
    """Declare the error statuses an endpoint can return (401 always: every route is authed)."""
    return {status: ErrorOut for status in sorted({401, 422, *statuses})}


def require_json_media_type(request: HttpRequest) -> None:
    """A body is read only as JSON: a ``Content-Type`` other than ``application/json`` (whose
    only parameter may be ``charset=utf-8``, all case-insensitive) is 415
    ``unsupported_media_type``. A request without a ``Content-Type`` is read as JSON: the
    bodies are JSON on every route, and raw clients (``urllib`` without headers, scripts) send
    none. Parsed by hand: Django's ``content_params`` go through the email package (slow) and
    drop what they cannot parse."""
    raw = request.META.get("CONTENT_TYPE", "")
    if not raw or raw == "application/json":  # the common cases, no parse
        return
    media, *params = raw.split(";")
    ok = media.strip().lower() == "application/json"
    for param in params:
        name, _, value = param.partition("=")
        if not (name.strip().lower() == "charset" and value.strip().strip('"').lower() == "utf-8") and param.strip():
            ok = False
    if not ok:
        raise UnsupportedMediaType(
            "request bodies are JSON: send Content-Type: application/json (its only parameter may be charset=utf-8)",
            content_type=raw[:200], accepted="application/json",
        )


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
