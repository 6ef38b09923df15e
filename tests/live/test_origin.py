"""The websocket Origin check compares scheme, host and port.

On the original code ``AllowedHostsOriginValidator`` compared the Origin's host with
``ALLOWED_HOSTS`` only: a page on another port (``http://127.0.0.1:9999``) or scheme of an
allowed host opened a socket with the manager's cookie. Now the Origin must be the origin the
socket is served at (``ALLOWED_HOSTS`` host, served scheme and port) or one of
``CSRF_TRUSTED_ORIGINS`` (docs/websocket.md; docs/deployment.md, Configuration).
"""
from __future__ import annotations

import json

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from novelforge_sessions.live.origins import origin_allowed
from tests.support.servers import free_port
from tests.live.test_access import two_projects  # noqa: F401  (fixture)


def _refused(server, origin: str, token: str) -> int:
    with pytest.raises(InvalidStatus) as refused:
        connect(server.ws_url + "/ws/events/", origin=origin, additional_headers={"Authorization": f"Bearer {token}"},
                open_timeout=10)
    return refused.value.response.status_code


@pytest.mark.django_db(transaction=True)
def test_a_real_server_refuses_another_port_scheme_or_host_and_accepts_its_own_origin(ws_server, two_projects):  # noqa: F811
    _, _, token_a, _ = two_projects
    other_port = free_port()
    while other_port == ws_server.port:
        other_port = free_port()
    port = ws_server.port
    for origin in [
        f"http://127.0.0.1:{other_port}",  # another port of an allowed host
        "http://127.0.0.1",  # the default port is another port too
        f"https://127.0.0.1:{port}",  # another scheme
        f"http://localhost:{other_port}",  # another port of the other allowed host
        f"http://evil.example:{port}",  # another host
        f"http://127.0.0.1:{port}/path",  # not an origin at all
        "null",
    ]:
        assert _refused(ws_server, origin, token_a) == 403, origin
    with connect(ws_server.ws_url + "/ws/events/", origin=f"http://127.0.0.1:{port}",
                 additional_headers={"Authorization": f"Bearer {token_a}"}, open_timeout=10) as ws:
        ws.send('{"type": "ping"}')
        assert json.loads(ws.recv(timeout=10)) == {"type": "pong"}


def _scope(host: str, scheme: str = "ws") -> dict:
    return {"type": "websocket", "scheme": scheme, "headers": [(b"host", host.encode())]}


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "allowed"),
    [
        ("http://localhost:8000", "localhost:8000", "ws", True),
        ("http://localhost", "localhost", "ws", True),
        ("http://localhost:80", "localhost", "ws", True),  # the default port, spelled out
        ("https://app.example.com", "app.example.com", "wss", True),
        ("http://app.example.com", "app.example.com", "wss", False),  # served over TLS: http is another origin
        ("https://app.example.com", "app.example.com", "ws", False),
        ("http://localhost:8001", "localhost:8000", "ws", False),
        ("http://localhost", "localhost:8000", "ws", False),
        ("http://evil.example:8000", "evil.example:8000", "ws", False),  # Host not in ALLOWED_HOSTS
        ("http://LOCALHOST:8000", "localhost:8000", "ws", True),
        ("http://user@localhost:8000", "localhost:8000", "ws", False),
        ("ftp://localhost:8000", "localhost:8000", "ws", False),
        ("", "localhost:8000", "ws", False),
        # CSRF_TRUSTED_ORIGINS: exact, and subdomains of a wildcard, scheme and port included
        ("https://proxy.example.org", "localhost:8000", "ws", True),
        ("https://proxy.example.org:8443", "localhost:8000", "ws", False),
        ("http://proxy.example.org", "localhost:8000", "ws", False),
        ("https://a.tenants.example.net", "localhost:8000", "ws", True),
        ("https://tenants.example.net", "localhost:8000", "ws", True),
        ("https://a.tenants.example.net:444", "localhost:8000", "ws", False),
        ("https://eviltenants.example.net", "localhost:8000", "ws", False),
    ],
)
def test_the_origin_rule(settings, origin, host, scheme, allowed):
    settings.ALLOWED_HOSTS = ["localhost", "app.example.com"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://proxy.example.org", "https://*.tenants.example.net"]
    assert origin_allowed(origin or None, _scope(host, scheme)) is allowed


def test_a_handshake_without_a_host_header_is_refused(settings):
    settings.ALLOWED_HOSTS = ["localhost"]
    settings.CSRF_TRUSTED_ORIGINS = []
    assert origin_allowed("http://localhost", {"type": "websocket", "scheme": "ws", "headers": []}) is False
