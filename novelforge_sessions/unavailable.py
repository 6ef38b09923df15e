"""The pages' answer when PostgreSQL is gone: a 503 page in plain words, never a bare 500.

The API has its own typed 503 (``database_unavailable``, in :mod:`novelforge_sessions.apikit.base`);
this is the same rule for the pages (dashboard, reviews, login). Two places catch it:

- :class:`DatabaseUnavailableMiddleware` (first in ``MIDDLEWARE``): a view or its template
  raised. Django hands the exception to ``process_exception``, which logs one warning line and
  answers the 503 page.
- :func:`server_error` (``handler500``): the rest, e.g. a middleware's own query. Django calls it
  while the exception is being handled, so it can tell a database failure from a bug; a bug
  gets the plain 500 page.

Both pages are rendered from the request alone, without context processors: ``user`` and
``messages`` would query the database that just failed.
"""
from __future__ import annotations

import logging
import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

log = logging.getLogger("novelforge.pages")

DATABASE_ERRORS = (OperationalError, InterfaceError)


def database_unavailable(request: HttpRequest, exc: BaseException) -> HttpResponse:
    log.warning("database unavailable on %s %s: %s", request.method, request.path, str(exc).strip()[:200])
    response = HttpResponse(render_to_string("503.html", {"request": request}), status=503)
    response["Retry-After"] = "5"
    return response


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response) -> None:  # noqa: ANN001
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if isinstance(exc, DATABASE_ERRORS):
            return database_unavailable(request, exc)
        return None


def server_error(request: HttpRequest) -> HttpResponse:
    exc = sys.exc_info()[1]
    if isinstance(exc, DATABASE_ERRORS):
        return database_unavailable(request, exc)
    return HttpResponse(render_to_string("500.html", {"request": request}), status=500)
