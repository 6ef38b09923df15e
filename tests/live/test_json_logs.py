"""``LOG_FORMAT=json``: every line a server writes is one JSON object, and still redacted.

A real server of each kind (daphne as ``make run`` serves, uvicorn as ``make serve-cluster``
does) runs with ``LOG_FORMAT=json``; requests carry a token in the URL (in a query string, in a
path Django answers 404 for); every line of the server's log must parse as a JSON object and no
line may hold the token. The default (plain) format is unchanged: ``test_log_redaction.py``
checks its lines.
"""
from __future__ import annotations

import json
import logging
import sys
import time
import urllib.error
import urllib.request

import pytest

from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.logredact import JsonFormatter, RedactingFilter
from tests.support.factories import make_project
from tests.support.servers import DaphneServer


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _records(server: DaphneServer, expect: list[str], timeout: float = 15.0) -> list[dict]:
    """Every line of the server's log as JSON, once each of ``expect`` is in some message
    (deadline-bounded: the access line is written just after the response)."""
    deadline = time.monotonic() + timeout
    while True:
        text = server.log_path.read_text("utf-8", "replace")
        lines = [line for line in text.splitlines() if line.strip()]
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:
                raise AssertionError(f"not a JSON line: {line!r}") from None
        messages = " ".join(r.get("message", "") for r in records)
        if all(e in messages for e in expect) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)  # polling the log file against the deadline


@pytest.fixture(params=["daphne", "uvicorn"])
def json_server(request):
    srv = DaphneServer(server=request.param, extra_env={"LOG_FORMAT": "json", "LIVE_SWEEP_SECONDS": "3600"})
    yield srv
    srv.stop()


@pytest.mark.django_db(transaction=True)
def test_every_line_is_json_and_tokens_stay_redacted(json_server):
    project = make_project("jsonlogs")
    _, raw = create_token(project, name="leaky", permissions=ALL_PERMISSIONS)
    secret = raw[len("nfs_"):]
    assert _get(f"{json_server.url}/api/v1/sessions?token={raw}") == 401
    assert _get(f"{json_server.url}/no-such-page/{raw}/") == 404
    expect = ["/api/v1/sessions?token=[redacted]", "Not Found: /no-such-page/nfs_[redacted]/"]
    records = _records(json_server, expect)
    text = json_server.log_path.read_text("utf-8", "replace")
    assert raw not in text and secret not in text and secret[:12] not in text, text
    messages = [r["message"] for r in records]
    assert any("/api/v1/sessions?token=[redacted]" in m for m in messages), messages  # the access line
    assert "Not Found: /no-such-page/nfs_[redacted]/" in messages  # Django's request log
    for record in records:
        assert isinstance(record, dict) and {"asctime", "levelname", "name", "message"} <= set(record), record
    assert {r["levelname"] for r in records} <= {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


def test_the_json_formatter_redacts_what_it_formats_itself():
    """The formatter formats an exception from ``exc_info`` and serialises a record's extra values
    (Django's request log passes the request): both carry what the request carried."""
    class Request:
        def __str__(self) -> str:
            return "<ASGIRequest: GET '/p/nfs_abcDEF123?token=nfs_abcDEF123'>"

    try:
        raise ValueError("No route found for path 'ws/events/nfs_abcDEF123'.")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("django.request", logging.WARNING, __file__, 1, "Not Found: %s",
                               ("/p/nfs_abcDEF123/",), exc_info)
    record.request = Request()
    record.status_code = 404
    assert RedactingFilter().filter(record) is True
    line = JsonFormatter().format(record)
    assert "\n" not in line and "abcDEF123" not in line, line
    parsed = json.loads(line)
    assert parsed["message"] == "Not Found: /p/nfs_[redacted]/"
    assert parsed["status_code"] == 404 and parsed["levelname"] == "WARNING" and parsed["name"] == "django.request"
    assert "nfs_[redacted]" in parsed["exc_info"] and "ValueError" in parsed["exc_info"]
    assert "nfs_[redacted]" in parsed["request"]
