"""What this process's database connection sends, read from libpq's own trace: the Query
messages (``sent_queries``) and the round trips (``round_trips``)."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import psycopg
from django.db import connection


def _frontend_messages(action: Callable[[], object]) -> list[tuple[str, str]]:
    """(message type, its text) of each message the client sent while ``action`` ran, in order."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.NamedTemporaryFile("r", suffix=".trace") as out:
        fd = os.open(out.name, os.O_WRONLY)
        try:
            pgconn.trace(fd)
            pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
            try:
                action()
            finally:
                pgconn.untrace()
        finally:
            os.close(fd)
        text = out.read()
    messages: list[str] = []
    for line in text.splitlines():
        if line.startswith(("F\t", "B\t")):
            messages.append(line)
        elif messages:  # a query's text spans lines
            messages[-1] += "\n" + line
    sent = []
    for m in messages:
        parts = m.split("\t", 3)
        if parts[0] == "F":
            sent.append((parts[2], parts[3].strip() if len(parts) > 3 else ""))
    return sent


def sent_queries(action: Callable[[], object]) -> list[str]:
    """The text of each Query message the client sent while ``action`` ran (simple protocol:
    Django's client-side-binding cursor, BEGIN and COMMIT), in order."""
    return [text for kind, text in _frontend_messages(action) if kind == "Query"]


def round_trips(action: Callable[[], object]) -> list[list[tuple[str, str]]]:
    """The messages the client sent while ``action`` ran, grouped by round trip: a simple Query,
    or the extended protocol's messages up to their Sync (Parse carries a statement's text; a
    prepared statement executed again sends only Bind and Execute)."""
    trips: list[list[tuple[str, str]]] = []
    pending: list[tuple[str, str]] = []
    for kind, text in _frontend_messages(action):
        if kind == "Query":
            trips.append([(kind, text)])
        elif kind == "Sync":
            trips.append(pending + [(kind, text)])
            pending = []
        else:
            pending.append((kind, text))
    return trips
