"""The CSP header (oversized bodies are refused before Django: novelforge_sessions.bodylimit)."""
from __future__ import annotations

from csp.middleware import CSPMiddleware as _CSPMiddleware
from csp.middleware import PolicyParts
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse


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
