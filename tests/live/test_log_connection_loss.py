"""A lost connection is one log line, not a traceback (novelforge_sessions.logconnection).

Before, a Redis restart put ~45 lines of chained tracebacks into each server's log
(channels_redis's receive task, and every writer whose wake-up could not leave)."""
from __future__ import annotations

import logging
import sys

import pytest
from redis import exceptions as redis_exceptions

from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.logconnection import ConnectionLossFilter
from tests.support.factories import SESSION, make_project
from tests.support.servers import DaphneServer, free_port
from tests.live.conftest import api_post


def record(level: int, exc: BaseException, msg: str = "event wake-up for project %s failed") -> logging.LogRecord:
    try:
        raise exc
    except BaseException:
        exc_info = sys.exc_info()
    return logging.LogRecord("novelforge.events", level, __file__, 1, msg, (7,), exc_info)


@pytest.mark.parametrize("exc", [
    redis_exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
    redis_exceptions.TimeoutError("Timeout reading from socket"),
    ConnectionResetError(104, "Connection reset by peer"),
])
def test_a_connection_error_becomes_one_warning_line(exc):
    rec = record(logging.ERROR, exc)
    assert ConnectionLossFilter().filter(rec) is True  # kept, never dropped
    line = logging.Formatter("%(levelname)s %(name)s %(message)s").format(rec)
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith("WARNING novelforge.events event wake-up for project 7 failed: ")
    assert type(exc).__name__ in line and str(exc) in line


@pytest.mark.parametrize("exc", [ValueError("a bug"), FileNotFoundError(2, "No such file"), KeyError("x")])
def test_any_other_exception_keeps_its_traceback_and_level(exc):
    rec = record(logging.ERROR, exc, msg="unexpected error %s")
    ConnectionLossFilter().filter(rec)
    text = logging.Formatter("%(levelname)s %(message)s").format(rec)
    assert text.startswith("ERROR unexpected error 7") and "Traceback (most recent call last)" in text


def test_the_console_handler_applies_it_before_redacting():
    from django.conf import settings

    console = settings.LOGGING["handlers"]["console"]
    assert console["filters"][:2] == ["connection_loss", "redact"]
    assert settings.LOGGING["filters"]["connection_loss"]["()"].endswith("logconnection.ConnectionLossFilter")


@pytest.mark.django_db(transaction=True)
def test_a_server_whose_redis_is_gone_logs_each_lost_wake_up_in_one_line():
    # Nothing listens on this port: every wake-up's send through the Redis layer is refused.
    server = DaphneServer(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    try:
        project = make_project("redis-gone")
        _, token = create_token(project, name="agent", permissions=ALL_PERMISSIONS)
        for _ in range(2):
            assert api_post(server, token, "/sessions", SESSION)["id"]  # the write stands: replay covers it
    finally:
        server.stop()
    log = server.log_path.read_text()
    lost = [line for line in log.splitlines() if "event wake-up for project" in line]
    assert len(lost) == 2, log
    assert all("WARNING" in line and "ConnectionError" in line and "no traceback" in line for line in lost)
    assert "Traceback" not in log
