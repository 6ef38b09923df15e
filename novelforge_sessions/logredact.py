"""Secrets never reach the logs in clear: the access log and every log record are redacted.

Tokens belong in the ``Authorization`` header (a token in a query string is refused), but a
client that puts one in the URL still gets its request line logged — by daphne's access log
(``"GET /api/v1/sessions?token=nfs_…" 401``) and by Django's request logging (``Not Found:
/…/nfs_…``). Both go through :func:`redact`:

- every ``nfs_…`` API token, wherever it appears (percent-encoded too), becomes ``nfs_[redacted]``;
- the value of a query parameter whose name says it is a credential (``token``, ``access_token``,
  ``api_key``, ``password``, ``secret``, ``auth…``, ``credential``, ``sessionid``, ``key``,
  ``bearer``, ``signature``, ``jwt``) becomes ``[redacted]``; so does any value holding a token.

Daphne writes its access log itself (not through ``logging``), so ``server.patches`` wraps its
``AccessLogGenerator.write_entry`` (installed by ``asgi.py`` under daphne);
``settings.LOGGING`` puts :class:`RedactingFilter` on the console handler for everything else.
"""
from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import unquote_plus

from pythonjsonlogger.json import JsonEncoder
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

REDACTED = "[redacted]"
_TOKEN = re.compile(r"nfs_[A-Za-z0-9_\-]+|nfs(?:%5F|%5f)[A-Za-z0-9_\-%]+")
_CREDENTIAL_NAME = re.compile(
    r"^(?:.*token.*|.*passw.*|.*secret.*|.*api[_-]?key.*|auth.*|.*credential.*|sessionid|key|bearer|signature|sig|jwt)$",
    re.IGNORECASE,
)
# a query string: from "?" up to whitespace, a quote or the end
_QUERY = re.compile(r"\?([^\s\"'#]*)")


def _redact_query(match: re.Match[str]) -> str:
    parts = []
    for pair in match.group(1).split("&"):
        name, eq, value = pair.partition("=")
        if eq and value and (_CREDENTIAL_NAME.match(unquote_plus(name)) or "nfs_" in unquote_plus(value)):
            value = REDACTED
        parts.append(f"{name}{eq}{value}")
    return "?" + "&".join(parts)


def redact(text: str) -> str:
    """``text`` with API tokens and credential-named query values replaced (idempotent)."""
    if "?" in text:
        text = _QUERY.sub(_redact_query, text)
    if "nfs" in text:
        text = _TOKEN.sub("nfs_" + REDACTED, text)
    return text


_FORMATTER = logging.Formatter()


class RedactingFilter(logging.Filter):
    """A handler filter: the record's message, its traceback and its stack are redacted before
    it is formatted (an exception's text can carry what the request carried: Channels' "No
    route found for path 'ws/…/nfs_…'" did)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the formatter's business
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            # Formatters use exc_text when it is set: the traceback is formatted once, here.
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def _redact_values(value: Any) -> Any:
    """``value`` with :func:`redact` applied to every string in it (dicts and lists walked)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_values(v) for v in value]
    return value


class _RedactingEncoder(JsonEncoder):
    """python-json-logger's encoder; what it makes of an object that is not JSON (its text, for
    an object it does not know) is redacted too."""

    def default(self, o: Any) -> Any:
        return _redact_values(super().default(o))


class JsonFormatter(_JsonFormatter):
    """``LOG_FORMAT=json``: python-json-logger's formatter, one JSON object a line, with the
    fields of the plain format (``asctime``, ``levelname``, ``name``, ``message``) and the
    record's ``extra`` values.

    :class:`RedactingFilter` has already cleaned the message and the record's ``exc_text``, but
    this formatter formats an exception from ``exc_info`` itself and serialises a record's extra
    attributes (Django's request log passes the request, whose text is its path), so every string
    it is about to write is redacted once more, before it is encoded (the encoder's escaping is
    then applied to clean text)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("fmt", "%(asctime)s %(levelname)s %(name)s %(message)s")
        kwargs.setdefault("json_encoder", _RedactingEncoder)
        super().__init__(*args, **kwargs)

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        return _redact_values(super().process_log_record(log_data))


def configure_json(config: dict) -> None:
    """``LOGGING_CONFIG`` under ``LOG_FORMAT=json``: Django's ``dictConfig``, and Python's
    warnings routed through ``logging`` (``py.warnings``), so that a warning is a JSON line too
    rather than the bare text Python writes to stderr."""
    import logging.config

    logging.config.dictConfig(config)
    logging.captureWarnings(True)
