"""Settings for a test daphne that records every statement reading the event table.

``from novelforge_sessions.settings import *`` plus one execute wrapper on every Django
database connection of the process (installed when it connects), and the same record around
psycopg's ``AsyncCursor.execute`` (the live feed's own connection, ``live/fanout.Reader``),
appending one line per SELECT that names the event table to the file ``NF_SQL_LOG``. Tests
count the lines written between two points: real SQL statements, counted in the server
process, however many threads or connections run them.
"""
from __future__ import annotations

import os
import threading

import psycopg
from django.db.backends.signals import connection_created

from novelforge_sessions.settings import *  # noqa: F401,F403

_PATH = os.environ["NF_SQL_LOG"]
_LOCK = threading.Lock()
EVENT_TABLE = "novelforge_sessions_event"


def _write(sql: str, where: str) -> None:
    if sql.lstrip().upper().startswith("SELECT") and EVENT_TABLE in sql:
        with _LOCK, open(_PATH, "a") as f:
            f.write(where + "\t" + " ".join(sql.split())[:300] + "\n")


def _record(execute, sql, params, many, context):
    if not many:
        _write(sql, threading.current_thread().name)
    return execute(sql, params, many, context)


_async_execute = psycopg.AsyncCursor.execute


async def _async_record(self, query, params=None, **kwargs):
    _write(query if isinstance(query, str) else str(query), "async")
    return await _async_execute(self, query, params, **kwargs)


psycopg.AsyncCursor.execute = _async_record


def _install(sender, connection, **kwargs):
    if _record not in connection.execute_wrappers:
        connection.execute_wrappers.append(_record)


connection_created.connect(_install)
