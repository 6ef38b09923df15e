"""The websocket handshake's Origin check: Django's CSRF Origin rule, on scheme, host *and* port.

A page may open ``/ws/events/`` (with the manager's session cookie) only if its Origin is

- the origin the socket is served at: the served scheme (``ws`` → ``http``, ``wss`` → ``https``),
  the ``Host`` header's host — which must be one of ``ALLOWED_HOSTS`` — and its port (the
  scheme's default port when the header names none); or
- one of ``CSRF_TRUSTED_ORIGINS`` (``https://app.example.com``, ``https://*.example.com`` for
  its subdomains), compared on scheme, host and port (default ports filled in).

So another port or scheme of an allowed host is refused, as is any other host, a missing
Origin, ``null`` and anything that is not ``scheme://host[:port]``. A refusal is a 403 at the
handshake (channels' ``WebsocketDenier``), logged at INFO (channels' own validator is silent).
``AllowedHostsOriginValidator``, which this replaces, compared the host only.
"""
from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import is_same_domain, split_domain_port, validate_host

log = logging.getLogger("novelforge.live")

DEFAULT_PORTS = {"http": 80, "https": 443}
Origin = tuple[str, str, int]  # (scheme, host, port)


def parse_origin(text: str, *, configured: bool = False) -> Origin | None:
    """``scheme://host[:port]`` as a tuple with the default port filled in; None if it is not one.
    A configured origin may end in ``/``; a header may not (browsers never send one)."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.username is not None or parts.password is not None:
        return None
    if parts.path not in (("", "/") if configured else ("",)) or parts.query or parts.fragment:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else DEFAULT_PORTS[scheme]


def served_origin(scope: dict[str, Any]) -> Origin | None:
    """The origin this socket is served at, from the scope's scheme and ``Host`` header, when
    that host is allowed (``ALLOWED_HOSTS``, as Django's ``request.get_host()`` checks it)."""
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    host = next((value.decode("latin-1") for name, value in scope.get("headers", []) if name.lower() == b"host"), "")
    domain, port = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    if not domain or not validate_host(domain, allowed):
        return None
    if port:
        if not port.isdigit():
            return None
        number = int(port)
    else:
        number = DEFAULT_PORTS[scheme]
    return scheme, domain.strip("[]"), number


def origin_allowed(origin_header: str | None, scope: dict[str, Any]) -> bool:
    if not origin_header:
        return False
    origin = parse_origin(origin_header)
    if origin is None:
        return False
    if origin == served_origin(scope):
        return True
    for trusted in settings.CSRF_TRUSTED_ORIGINS:
        wildcard = "://*." in trusted
        parsed = parse_origin(trusted.replace("://*.", "://", 1) if wildcard else trusted, configured=True)
        if parsed is None:
            continue
        if not wildcard and origin == parsed:
            return True
        if wildcard and origin[0] == parsed[0] and origin[2] == parsed[2] and is_same_domain(origin[1], "." + parsed[1]):
            return True
    return False


class SameOriginValidator:
    """ASGI middleware for websockets: the handshake passes only from an allowed Origin."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator guards websockets only")
        origin = next(
            (value.decode("latin-1") for name, value in scope.get("headers", []) if name.lower() == b"origin"), None
        )
        if origin_allowed(origin, scope):
            return await self.application(scope, receive, send)
        log.info("websocket handshake refused: origin %.200r is not allowed here", origin)
        return await WebsocketDenier()(scope, receive, send)
