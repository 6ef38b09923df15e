"""Settings for a test daphne that records every statement reading the event table.

``from novelforge_sessions.settings import *`` plus one execute wrapper on every database
connection of the process (installed when it connects), appending one line per SELECT that
names the event table to the file ``NF_SQL_LOG``. Tests count the lines written between two
points: real SQL statements, counted in the server process, however many threads run them.
"""
from __future__ import annotations

import os
import threading

from django.db.backends.signals import connection_created

from novelforge_sessions.settings import *  # noqa: F401,F403

_PATH = os.environ["NF_SQL_LOG"]
_LOCK = threading.Lock()
EVENT_TABLE = "novelforge_sessions_event"


def _record(execute, sql, params, many, context):
    if not many and sql.lstrip().upper().startswith("SELECT") and EVENT_TABLE in sql:
        with _LOCK, open(_PATH, "a") as f:
            f.write(threading.current_thread().name + "\t" + " ".join(sql.split())[:300] + "\n")
    return execute(sql, params, many, context)


def _install(sender, connection, **kwargs):
    if _record not in connection.execute_wrappers:
        connection.execute_wrappers.append(_record)


connection_created.connect(_install)
