"""The CSP header (oversized bodies are refused before Django: novelforge_sessions.bodylimit)."""
from __future__ import annotations

from csp.constants import HEADER, HEADER_REPORT_ONLY
from csp.middleware import CSPMiddleware as _CSPMiddleware
from csp.middleware import CheckableLazyObject, PolicyParts
from django.conf import settings
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


_PER_RESPONSE = ("_csp_config", "_csp_update", "_csp_replace", "_csp_config_ro", "_csp_update_ro", "_csp_replace_ro")


class ApiCSPMiddleware(CSPMiddleware):
    """``API_MIDDLEWARE``'s CSP: the same headers as :class:`CSPMiddleware`, built once per host.

    An API response is JSON: nothing in it takes a nonce, and no API view changes the policy
    per response, so its headers depend only on the host and the scheme (the websocket origin
    in ``connect-src``). django-csp would build them from the settings for every response; here
    the first response per (host, scheme) builds them through django-csp and the rest reuse them. Whatever does not fit (a nonce was
    used, a per-response policy, a header already set, ``DEBUG``'s exempt codes, excluded
    prefixes) goes through django-csp as before. ``tests/api/test_lean_path.py`` compares the
    headers with the full stack's.
    """

    def __init__(self, get_response) -> None:  # noqa: ANN001
        super().__init__(get_response)
        self._built: dict[tuple[str, bool], dict[str, str]] = {}

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if (
            getattr(request, "_csp_nonce", None) is not None
            or any(getattr(response, name, None) is not None for name in _PER_RESPONSE)
            or getattr(response, "_csp_exempt", False) or getattr(response, "_csp_exempt_ro", False)
            or HEADER in response or HEADER_REPORT_ONLY in response
            or settings.DEBUG
            or (getattr(settings, "CONTENT_SECURITY_POLICY", None) or {}).get("EXCLUDE_URL_PREFIXES")
            or (getattr(settings, "CONTENT_SECURITY_POLICY_REPORT_ONLY", None) or {}).get("EXCLUDE_URL_PREFIXES")
        ):
            return super().process_response(request, response)
        try:
            key = (request.get_host(), request.is_secure())
        except DisallowedHost:
            return super().process_response(request, response)
        headers = self._built.get(key)
        if headers is None:
            super().process_response(request, response)
            headers = {h: response[h] for h in (HEADER, HEADER_REPORT_ONLY) if h in response}
            if len(self._built) < 64:  # a handful of hosts (ALLOWED_HOSTS); never unbounded
                self._built[key] = headers
            return response
        for name, value in headers.items():
            response[name] = value
        request.csp_nonce = CheckableLazyObject(self._csp_nonce_post_response)
        return response
