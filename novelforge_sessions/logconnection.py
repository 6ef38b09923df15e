"""A lost connection is one log line, not a traceback.

When Redis restarts, channels_redis logs ``Unexpected exception in receive task`` at ERROR with
two chained tracebacks (~45 lines), and each writer whose wake-up could not leave logs one more
(``events._Wakeup``). Nothing in them is unexpected for this service: the layer reconnects, and
readers replay what a lost wake-up did not announce from the event log. :class:`ConnectionLossFilter`,
on the console handler (``settings.LOGGING``), turns a record whose exception is a lost or
refused connection into one WARNING line that keeps the logger, the message and the
exception's own text (``...: ConnectionError: Error 111 connecting to 127.0.0.1:6379.``).

Only connection errors: the built-in ``ConnectionError`` family (refused, reset, broken pipe),
``TimeoutError``, and redis-py's ``ConnectionError`` and ``TimeoutError``. Any other exception,
an ``OSError`` such as a missing file included, keeps its traceback.
"""
from __future__ import annotations

import logging

try:
    from redis import exceptions as _redis
except ImportError:  # pragma: no cover - redis comes with channels_redis
    _redis = None

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError) + (
    (_redis.ConnectionError, _redis.TimeoutError) if _redis is not None else ()
)


def is_connection_loss(exc: BaseException | None) -> bool:
    return isinstance(exc, CONNECTION_ERRORS)


class ConnectionLossFilter(logging.Filter):
    """A handler filter: a record carrying a connection error loses its traceback, not its facts."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not is_connection_loss(exc):
            return True
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the formatter's business
            return True
        detail = str(exc).strip() or "no detail"
        record.msg, record.args = f"{message}: {type(exc).__name__}: {detail} (a lost connection; no traceback)", None
        record.exc_info, record.exc_text = None, None
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True
