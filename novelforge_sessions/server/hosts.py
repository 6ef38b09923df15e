"""A request whose Host is not in ``ALLOWED_HOSTS``: refused before anything runs, in one log line.

Django validates the Host when something calls ``request.get_host()``; on pages that is
``CommonMiddleware``, which raises ``DisallowedHost``; Django answers 400 and logs the refusal on
the ``django.security.DisallowedHost`` logger at ERROR *with the exception's traceback*. The
lean API path (``novelforge_sessions/api/asgi.py``) calls ``get_host()`` itself, first, and answers
with :func:`api_refusal`. Everywhere:

- the answer is a 400: on ``/api/`` the typed ``disallowed_host`` error in the API's JSON shape
  (the lean path, and :func:`bad_request`, ``handler400``, for the API served through Django's
  handler), Django's plain 400 page elsewhere;
- the log is ONE line on ``django.security.DisallowedHost`` (the logger Django's documentation
  tells operators to silence or route): :class:`OneLine` (``settings.LOGGING``) drops the
  traceback Django attaches, and the lean path logs the same message without one. The Host is
  attacker-chosen: the line carries its ``repr`` (no raw control characters), cut to
  :data:`MAX_LOGGED_HOST` characters.

The probes (``/healthz``, ``/readyz``) are answered whatever the Host (``health.ProbeMiddleware``).
"""
from __future__ import annotations

import logging

from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.template.loader import render_to_string
from django.views import defaults

from novelforge_sessions.bodylimit import is_api
from novelforge_sessions.errors import HostNotAllowed

log = logging.getLogger("django.security.DisallowedHost")

#: The most of an (attacker-chosen) Host header a log line carries.
MAX_LOGGED_HOST = 200


def refused_host(request: HttpRequest) -> DisallowedHost | None:
    """The ``DisallowedHost`` Django raises for this request's Host, or None when it is allowed."""
    try:
        request.get_host()
    except DisallowedHost as exc:
        return exc
    return None


def _api_response() -> HttpResponse:
    err = HostNotAllowed("this service does not answer for the request's Host (ALLOWED_HOSTS)")
    response = JsonResponse(err.as_dict(), status=err.http_status)
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "no-store"
    return response


def api_refusal(request: HttpRequest, exc: DisallowedHost) -> HttpResponse:
    """The lean path's answer to a refused Host: one log line, the typed 400."""
    host = request.META.get("HTTP_HOST", "")
    log.error("Invalid HTTP_HOST header: %s (%s %s)", repr(host[:MAX_LOGGED_HOST]), request.method, request.path[:200],
              extra={"status_code": 400})
    return _api_response()


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler400``: below ``/api/`` a refused Host is the typed ``disallowed_host`` (Django has
    logged it); anything else is Django's own 400 page."""
    if isinstance(exception, DisallowedHost) and is_api(request.path):
        return _api_response()
    if isinstance(exception, DisallowedHost):
        # The page in plain words (templates/400.html), rendered with the request so its
        # stylesheet carries the response's CSP nonce; nothing in it depends on the Host.
        return HttpResponseBadRequest(render_to_string("400.html", request=request))
    return defaults.bad_request(request, exception)


class OneLine(logging.Filter):
    """On ``django.security.DisallowedHost``: the record without its traceback (the refusal is the
    client's mistake, the message says it all), and the Host in it cut to a bounded length."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info = None
        record.exc_text = None
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the formatter's business
            return True
        if len(message) > 2 * MAX_LOGGED_HOST + 100:
            record.msg, record.args = message[: 2 * MAX_LOGGED_HOST] + "…", None
        return True
