"""The one-statement writes' cursor (``novelforge_sessions/commit.py``) sends a list parameter as
psycopg's own ``ListDumper`` would: the same text, the same parameter type, the same refusals."""
from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction
from psycopg.adapt import PyFormat
from psycopg.types.numeric import Int8Dumper

from novelforge_sessions import commit

pytestmark = pytest.mark.django_db

LISTS = [
    ["a", "b"],
    ['a "quote"', "back\\slash", "com,ma", "{braces}", " spaced ", "", "NULL", "é☃", "line\nbreak", "\t", "'single'"],
    [1, 2, 3],
    [2**40, -5, 0],
    [],
    [None],
    [None, "a"],
    [None, 1],
    ["a", 1],
    [[1, 2], [3, 4]],
    [True, False],
    [1.5, 2.5],
    ["nul\x00"],
    [2**70],
]
#: Typed by a cast (as every graph statement types its arrays), by ANY against a bigint, and untyped.
STATEMENTS = [
    "SELECT pg_typeof(%(x)s::text[])::text, (%(x)s::text[])::text, (SELECT array_agg(u) FROM unnest(%(x)s::text[]) u)",
    "SELECT 2::bigint = ANY(%(x)s), pg_typeof(%(x)s)::text",
    "SELECT pg_typeof(%(x)s)::text, (%(x)s)::text",
]


def _outcome(run: Any) -> Any:
    try:
        return run()
    except (psycopg.Error, DatabaseError) as exc:
        return type(exc.__cause__ if isinstance(exc, DatabaseError) and exc.__cause__ else exc).__name__


def _as_list_dumper_sends_it(sql: str, value: list[Any]) -> Any:
    def run() -> Any:
        raw = psycopg.Cursor(connection.connection)
        raw.adapters.register_dumper(int, Int8Dumper)
        with transaction.atomic():  # a refused statement leaves the test's transaction usable
            raw.execute(sql, {"x": value}, prepare=True)
            return raw.fetchall()
    return _outcome(run)


@pytest.mark.parametrize("sql", STATEMENTS)
@pytest.mark.parametrize("value", LISTS, ids=repr)
def test_a_list_is_sent_as_psycopgs_list_dumper_sends_it(sql: str, value: list[Any]) -> None:
    connection.ensure_connection()
    expected = _as_list_dumper_sends_it(sql, value)

    def ours() -> Any:
        with transaction.atomic():  # a refused statement leaves the test's transaction usable
            return commit.fetch_prepared(sql, {"x": value})
    assert _outcome(ours) == expected
    if sql == STATEMENTS[0] and value and all(type(v) is str for v in value) and "\x00" not in "".join(value):
        assert expected[0][2] == value  # the elements arrive as sent


def test_the_prepared_cursor_sends_lists_with_the_flat_dumper() -> None:
    with commit._prepared_cursor("default") as cursor:
        assert cursor.cursor.adapters.get_dumper(list, PyFormat.AUTO) is commit.FlatListDumper


@pytest.mark.parametrize("value", [[1, 2], ["a", "b"], [], [None, "a"]], ids=repr)
def test_a_cursor_that_sent_a_list_is_freed_at_once_not_left_to_the_garbage_collector(value: list[Any]) -> None:
    """The flat dumper kept the cursor's adaptation context: every cursor that sent a list became
    a reference cycle (some fifty objects per statement) that only a garbage collection freed, and
    in a busy server those collections stopped it for tens of milliseconds. Its lists sent, with
    the collector off, the cursor's adapters are gone as soon as the cursor is."""
    import gc
    import weakref

    connection.ensure_connection()
    gc.collect()
    gc.disable()
    try:
        raw = psycopg.Cursor(connection.connection)
        raw.adapters.register_dumper(int, Int8Dumper)
        raw.adapters.register_dumper(list, commit.FlatListDumper)
        with transaction.atomic():
            raw.execute("SELECT %(x)s::text[], %(y)s::bigint[]", {"x": value, "y": [3, 4]}, prepare=True)
            assert raw.fetchone() is not None
        assert raw.adapters.get_dumper(list, PyFormat.AUTO) is commit.FlatListDumper
        adapters = weakref.ref(raw.adapters)
        raw.close()
        del raw
        assert adapters() is None
    finally:
        gc.enable()
