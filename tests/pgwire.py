"""What this process's database connection sends: the Query messages of libpq's own trace."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import psycopg
from django.db import connection


def sent_queries(action: Callable[[], object]) -> list[str]:
    """The text of each Query message the client sent while ``action`` ran (simple protocol:
    Django's client-side-binding cursor, BEGIN and COMMIT), in order."""
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
    return [m.split("\t", 3)[3].strip() for m in messages if m.startswith("F\t") and m.split("\t")[2] == "Query"]
