"""A token a client puts in a URL never appears in the server's log in clear.

On the original code daphne's access log wrote the request line as received
(``"GET /api/v1/sessions?token=nfs_…" 401``) and Django's request logging wrote ``Not Found:
/…/nfs_…``. The log of a real daphne process is captured and searched for the secret.
"""
from __future__ import annotations

import logging
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.logredact import RedactingFilter, redact
from tests.support.factories import make_project
from tests.support.servers import DaphneServer
from tests.support.waits import wait_until


def _get(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _log_since(server, start: int, expect: list[str], timeout: float = 10.0) -> str:
    """The server's log written since ``start``, once every ``expect`` line is in it (deadline-bounded:
    daphne writes an access line just after the response)."""
    def tail() -> str:
        return server.log_path.read_bytes()[start:].decode("utf-8", "replace")

    def complete() -> str:
        text = tail()
        return text if all(e in text for e in expect) else ""

    try:
        return wait_until(complete, "the log lines", timeout=timeout)
    except AssertionError:
        return tail()  # the caller's assertions name what is missing


@pytest.fixture(params=["daphne", "uvicorn"])
def logged_server(request, ws_server):
    """daphne (``make run``; its own access log, wrapped by ``server.patches``) and the production
    server (uvicorn through ``novelforge_sessions.serve``: its access log goes through ``LOGGING``)."""
    if request.param == "daphne":
        yield ws_server
        return
    srv = DaphneServer(extra_env={"LIVE_SWEEP_SECONDS": "3600"}, server="uvicorn")
    yield srv
    srv.stop()


def _access(server, request_line: str, status: int) -> str:
    """The access-log text of one request as the server writes it."""
    if server.server == "uvicorn":  # '… - "GET /a?b HTTP/1.1" 401'
        return f'"{request_line} HTTP/1.1" {status}'
    return f'"{request_line}" {status}'  # daphne


@pytest.mark.django_db(transaction=True)
def test_tokens_in_urls_are_redacted_in_the_access_log_and_the_request_log(logged_server):
    ws_server = logged_server
    project = make_project("logs")
    _, raw = create_token(project, name="leaky", permissions=ALL_PERMISSIONS)
    secret = raw[len("nfs_"):]
    start = ws_server.log_path.stat().st_size
    base = ws_server.url
    assert _get(f"{base}/api/v1/sessions?token={raw}") == 401  # refused, but logged
    assert _get(f"{base}/api/v1/sessions?limit=5&access_token={raw}") == 401
    assert _get(f"{base}/api/v1/sessions?q={quote(raw, safe='')}", {"Authorization": f"Bearer {raw}"}) == 200
    assert _get(f"{base}/no-such-page/{raw}/") == 404  # Django's request log: "Not Found: …"
    assert _get(f"{base}/login/?next=/&password=hunter2-{secret[:6]}") == 200
    with connect(ws_server.ws_url + f"/ws/events/?token={raw}", origin=base, open_timeout=10) as ws:
        ws.send('{"type": "ping"}')
        ws.recv(timeout=10)
    # A token in a websocket path no route has: the handshake is refused (it was a 500 whose
    # traceback, "No route found for path 'ws/events/nfs_…'", was not redacted).
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_server.ws_url + f"/ws/events/{raw}", origin=base, open_timeout=10)
    assert refused.value.response.status_code == 403

    expect = [
        _access(ws_server, "GET /api/v1/sessions?token=[redacted]", 401),
        _access(ws_server, "GET /api/v1/sessions?limit=5&access_token=[redacted]", 401),
        _access(ws_server, "GET /api/v1/sessions?q=[redacted]", 200),
        "Not Found: /no-such-page/nfs_[redacted]/",
        _access(ws_server, "GET /no-such-page/nfs_[redacted]/", 404),
        _access(ws_server, "GET /login/?next=/&password=[redacted]", 200),
    ]
    tail = _log_since(ws_server, start, expect)
    assert raw not in tail and secret not in tail and secret[:12] not in tail, tail
    assert "hunter2" not in tail and "Traceback" not in tail, tail
    for line in expect:
        assert line in tail, tail


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("GET /a?token=nfs_abc-DEF_1&x=1", "GET /a?token=[redacted]&x=1"),
        ("GET /a?x=1&api_key=k1", "GET /a?x=1&api_key=[redacted]"),
        ("GET /a?q=nfs%5Fabc", "GET /a?q=[redacted]"),
        ("GET /a?session_id=3&after=9", "GET /a?session_id=3&after=9"),  # ids are not secrets
        ("Not Found: /p/nfs_abc/", "Not Found: /p/nfs_[redacted]/"),
        ("WSCONNECT /ws/events/", "WSCONNECT /ws/events/"),
    ],
)
def test_redact(text, expected):
    assert redact(text) == expected
    assert redact(expected) == expected


def test_the_logging_filter_redacts_formatted_records():
    record = logging.LogRecord("django.request", logging.WARNING, __file__, 1, "Not Found: %s", ("/p/nfs_abc/",), None)
    assert RedactingFilter().filter(record) is True
    assert record.getMessage() == "Not Found: /p/nfs_[redacted]/"


def test_the_logging_filter_redacts_a_records_traceback_and_stack():
    """An exception's text names what the request named (an outside check found a token in the
    last line of a traceback whose message line was redacted)."""
    try:
        raise ValueError("No route found for path 'ws/events/nfs_abcDEF123'.")
    except ValueError:
        import sys

        exc_info = sys.exc_info()
    record = logging.LogRecord("daphne", logging.ERROR, __file__, 1, "Exception inside application: %s",
                               ("No route found for path 'ws/events/nfs_abcDEF123'.",), exc_info)
    record.stack_info = "Stack (most recent call last):\n  handler('nfs_abcDEF123')"
    assert RedactingFilter().filter(record) is True
    formatted = logging.Formatter().format(record)
    assert "nfs_abcDEF123" not in formatted and "abcDEF123" not in formatted, formatted
    assert formatted.count("nfs_[redacted]") >= 3 and "ValueError" in formatted  # message, error line, stack
