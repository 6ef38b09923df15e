"""Writes made of one statement run as a transaction of their own.

PostgreSQL runs a statement sent outside a transaction block (autocommit) as its own
transaction: it commits when the statement succeeds and leaves nothing behind when it fails. A
write that fits in one statement (its locks, its checks, its rows and its event, as CTEs) therefore
needs neither ``BEGIN`` nor ``COMMIT``: one round trip, through public interfaces only (Django's
connection is in autocommit mode outside ``transaction.atomic()``; psycopg sends the statement as
it is).

Inside an atomic block (a caller composing this write into a larger transaction, or a test's
enclosing transaction) the statement is simply one more statement of that transaction, and
commits with it.

The statement is sent with server-side binding on a prepared statement (psycopg's public
``Cursor`` and the connection's ``prepare_threshold``, settings ``DB_PREPARE_THRESHOLD``): a
write statement that locks, decides and writes in CTEs costs PostgreSQL more to plan than to run,
and a prepared one is planned once per connection (every connection starts with
``plan_cache_mode=force_generic_plan``, settings ``SERVER_SETTINGS``: left to choose, PostgreSQL
planned the statements whose parameters are arrays again on every execution). Django's cursor wrapper still wraps it (its
error translation, execute wrappers and query logging apply). The ORM's own queries keep Django's
client-side binding.

The fault hook (``faults.fire``) sees this commit as it sees an atomic block's: just before the
statement is sent and just after it returns, only when the statement is its own transaction.
"""
from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Dumper, PyFormat
from psycopg.types.array import ListDumper
from psycopg.types.numeric import Int8Dumper
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from novelforge_sessions import faults


#: The cursor of the one-statement writes: psycopg's own (server-side binding). With tracing on,
#: ``novelforge_sessions.tracing`` puts its traced subclass here, so these statements have spans
#: too (they bypass the connection's cursor factory, which the psycopg instrumentation wraps).
CURSOR: type[psycopg.Cursor] = psycopg.Cursor


#: The longest statement text whose parsing psycopg keeps (its ``%(name)s`` placeholders found
#: once per text): it parses a longer one again on every execution, assuming such texts are
#: generated and rarely repeated. Hand-written statements over it are sent ``compact``.
PARSE_CACHED_BYTES = 4096


def compact(sql: str) -> str:
    """``sql`` with every run of whitespace outside its string literals made one space.

    For a long hand-written statement (layout for the reader, not for the wire): compacted, it
    may fit ``PARSE_CACHED_BYTES``. Refuses text whose meaning could depend on line breaks or
    on quoting this does not follow (comments, dollar quotes)."""
    parts = sql.split("'")  # '' inside a literal splits into an empty outside part: parity holds
    for outside in parts[::2]:
        if "--" in outside or "/*" in outside or "$" in outside:
            raise ValueError("compact() takes statements without comments or dollar quotes")
    parts[::2] = [re.sub(r"\s+", " ", outside) for outside in parts[::2]]
    return "'".join(parts).strip()


def own_transaction(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Does a statement sent now commit by itself (autocommit, no atomic block around it)?"""
    return transaction.get_autocommit(using)


def execute_write(sql: str, params: Any, using: str = DEFAULT_DB_ALIAS) -> tuple[Any, ...] | None:
    """Run the one-statement write ``sql`` and return its first row (``None``: no row).

    Outside an atomic block the statement is its own transaction: committed when this returns,
    rolled back entirely when it raises."""
    own = own_transaction(using)
    if own:
        faults.fire("before_commit")
    with _prepared_cursor(using) as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if own:
        faults.fire("after_commit")
    return row


def fetch_prepared(sql: str, params: Any, using: str = DEFAULT_DB_ALIAS) -> list[tuple[Any, ...]]:
    """Every row of ``sql``, sent as :func:`execute_write` sends its statement (server-side
    binding, prepared after ``DB_PREPARE_THRESHOLD`` executions on the connection), as one more
    statement of the caller's transaction. For the large statements of a multi-statement write
    (the graph routes' lock, resolve and write statements), which PostgreSQL otherwise plans on
    every request."""
    with _prepared_cursor(using) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description is not None else []


def _prepared_cursor(using: str) -> Any:
    db = connections[using]
    db.ensure_connection()
    with db.wrap_database_errors:
        raw = CURSOR(db.connection)  # server-side binding: the statement can be prepared
    # Every int as a bigint: psycopg would otherwise choose each int's type by its size, and a
    # statement is prepared once per set of parameter types (a run id or a size growing past
    # 32767 would prepare it again).
    raw.adapters.register_dumper(int, Int8Dumper)
    raw.adapters.register_dumper(list, FlatListDumper)
    return db.make_debug_cursor(raw) if db.queries_logged else db.make_cursor(raw)


_INT8_ARRAY_OID = psycopg.adapters.types["int8"].array_oid


class FlatListDumper(Dumper):
    """A flat list of ``str`` or of ``int`` as psycopg's own ``ListDumper`` sends it (the same
    text, the same parameter type: ``int`` elements a ``bigint[]``, ``str`` ones of unknown type,
    which the statement's cast names), built in one pass.

    psycopg's dumper finds each list's element type and dumps each element through its own
    dumper on every execution: for the graph statements' dozen short arrays that was most of the
    cost of sending their parameters. Anything else (an empty list, ``None`` or nested elements,
    mixed or other types, a NUL character, a connection not in UTF-8) is left to ``ListDumper``
    unchanged. Public adaptation API only (``Dumper.get_key``/``upgrade``); the output is pinned
    against ``ListDumper``'s by ``tests/control/test_commit.py``.

    It keeps no reference to the cursor's adaptation context (the fallback ``ListDumper``, built
    with it, takes what it needs into a transformer of its own, as it does in psycopg's cursors):
    kept here, the context tied every cursor that sent a list into a reference cycle, some fifty
    objects a statement left for the garbage collector instead of freed at once (the collections
    it brought stopped a busy server for tens of ms)."""

    def __init__(self, cls: type, context: AdaptContext | None = None):
        super().__init__(cls, context)
        # One per cursor, as psycopg keeps one ListDumper per cursor: not one per list dumped.
        self._fallback = ListDumper(list, context)

    def get_key(self, obj: list[Any], format: PyFormat) -> Any:
        kind = _flat_kind(obj)
        if kind is None:
            return self._fallback.get_key(obj, format)
        return (list, kind)

    def upgrade(self, obj: list[Any], format: PyFormat) -> Dumper:
        kind = _flat_kind(obj)
        if kind is None or (self.connection is not None and self.connection.info.encoding != "utf-8"):
            return self._fallback.upgrade(obj, format)
        return _IntArrayDumper(list) if kind is int else _StrArrayDumper(list)  # they need no context

    def dump(self, obj: list[Any]) -> Buffer | None:
        # Reached with the key ListDumper gives a list it cannot type (empty, or only None): as it dumps it.
        return self._fallback.dump(obj)


def _flat_kind(obj: list[Any]) -> type | None:
    """``str`` or ``int`` when every element of ``obj`` (one at least) is exactly that type."""
    if not obj:
        return None
    kind = type(obj[0])
    if kind is not str and kind is not int:
        return None
    for item in obj:
        if type(item) is not kind:
            return None
    if kind is str and any("\x00" in item for item in obj):
        return None
    return kind


class _IntArrayDumper(Dumper):
    oid = _INT8_ARRAY_OID

    def dump(self, obj: list[int]) -> bytes:
        return ("{" + ",".join(map(str, obj)) + "}").encode()


class _StrArrayDumper(Dumper):
    # Unknown, as ListDumper sends a list of str: the statement's cast (``::text[]``) types it.

    def dump(self, obj: list[str]) -> bytes:
        # Every element quoted; a backslash and a double quote escaped (PostgreSQL's array syntax).
        return ("{" + ",".join('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in obj)
                + "}").encode()
