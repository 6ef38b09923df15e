"""Refuse oversized API bodies before anything reads them (typed 413, never a 500); the CSP header."""
from __future__ import annotations

from collections.abc import Callable

from csp.middleware import CSPMiddleware as _CSPMiddleware
from csp.middleware import PolicyParts
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, JsonResponse

from novelforge_sessions.errors import PayloadTooLarge


class ApiBodyLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith("/api/"):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > settings.API_MAX_BODY_BYTES:
                err = PayloadTooLarge(
                    f"the body is {length} bytes; at most {settings.API_MAX_BODY_BYTES}",
                    size=length, limit=settings.API_MAX_BODY_BYTES,
                )
                return JsonResponse(err.as_dict(), status=err.http_status)
        return self.get_response(request)


class CSPMiddleware(_CSPMiddleware):
    """django-csp's middleware, with this host's websocket origin added to ``connect-src``.

    The live sockets (/ws/events/) are opened at ``ws(s)://<this host>``; CSP level 3 lets
    ``'self'`` match them, older engines do not, so the origin is named explicitly: ``wss:`` on
    a secure request, ``ws:`` otherwise, for the host the request was validated against
    (ALLOWED_HOSTS)."""

    def get_policy_parts(self, request: HttpRequest, response: HttpResponse, report_only: bool = False) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only=report_only)
        try:
            host = request.get_host()
        except DisallowedHost:
            return parts
        origin = ("wss://" if request.is_secure() else "ws://") + host
        parts.update = {**(parts.update or {}), "connect-src": [origin]}
        return parts
