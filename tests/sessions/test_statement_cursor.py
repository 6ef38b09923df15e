"""The hot statements' kept cursors (``commit.statement_cursor``).

A cursor is kept per statement, connection and time zone, so its parameters' adapters are found
once per connection; it is still wrapped as ``connection.cursor()`` wraps one (Django's error
classes, execute wrappers, query logging), and another connection or time zone gets a new one.
"""
from __future__ import annotations

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.utils import DataError
from django.test.utils import CaptureQueriesContext

from novelforge_sessions import commit
from novelforge_sessions.control import checkpoints
from novelforge_sessions.models import Checkpoint

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {"boundary": "context_freeze", "cursor": {"step": 1}}


def _kept(sql: str):
    """The raw psycopg cursor kept for ``sql`` on this thread's connection, or None."""
    kept = connections[DEFAULT_DB_ALIAS].__dict__.get("_nf_statement_cursors")
    return None if kept is None else kept[2].get(sql)


def test_the_checkpoints_one_statement_reuses_its_cursor_and_its_adapters(owner, new_session):
    s = new_session(run=True)
    assert owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY).status_code == 201
    write = _kept(checkpoints._WRITE_SQL)
    assert write is not None and _kept(checkpoints._LOCK_RUN_SQL) is None  # one statement, on its own cursor
    adapters = write._tx
    for _ in range(2):
        assert owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY).status_code == 201
    # The same cursor, and psycopg kept its transformer (its dumpers) across executes.
    assert _kept(checkpoints._WRITE_SQL) is write and write._tx is adapters
    assert Checkpoint.objects.filter(run_id=s["run"]["id"]).count() == 3


def test_the_two_statements_of_a_keyed_checkpoint_reuse_their_cursors_and_their_adapters(owner, new_session):
    s = new_session(run=True)
    assert owner.post(f"/runs/{s['run']['id']}/checkpoints", {**BODY, "idempotency_key": "k0"}).status_code == 201
    lock, insert = _kept(checkpoints._LOCK_RUN_SQL), _kept(checkpoints._INSERT_SQL)
    assert lock is not None and insert is not None and lock is not insert
    adapters = (lock._tx, insert._tx)
    for key in ("k1", "k2"):
        assert owner.post(f"/runs/{s['run']['id']}/checkpoints", {**BODY, "idempotency_key": key}).status_code == 201
    # The same cursors, and psycopg kept each one's transformer (its dumpers) across executes.
    assert (_kept(checkpoints._LOCK_RUN_SQL), _kept(checkpoints._INSERT_SQL)) == (lock, insert)
    assert (lock._tx, insert._tx) == adapters
    assert Checkpoint.objects.filter(run_id=s["run"]["id"]).count() == 3


def test_a_new_connection_gets_new_cursors_and_the_write_still_works(owner, new_session):
    s = new_session(run=True)
    assert owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY).status_code == 201
    before = _kept(checkpoints._WRITE_SQL)
    connection.close()
    assert before.closed or before.connection.closed  # bound to the connection that is gone
    assert owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY).status_code == 201
    after = _kept(checkpoints._WRITE_SQL)
    assert after is not before and not after.closed
    assert after.connection is connections[DEFAULT_DB_ALIAS].connection


def test_another_time_zone_gets_a_new_cursor(settings):
    db = connections[DEFAULT_DB_ALIAS]
    first = commit.statement_cursor(db, "probe")
    assert commit.statement_cursor(db, "probe").cursor is first.cursor
    # The connection's zone (UTC under USE_TZ) changes only without USE_TZ; Django's
    # setting_changed handler then resets it on the open connection.
    settings.USE_TZ, settings.TIME_ZONE = False, "Asia/Tokyo"
    again = commit.statement_cursor(db, "probe")
    assert again.cursor is not first.cursor and db.timezone_name == "Asia/Tokyo"


def test_a_kept_cursor_raises_djangos_errors_and_is_seen_by_query_capture():
    db = connections[DEFAULT_DB_ALIAS]
    with CaptureQueriesContext(connection) as captured:
        cur = commit.statement_cursor(db, "probe")
        cur.execute("SELECT %s::int + 1", [41])
        assert cur.fetchone() == (42,)
    assert [q["sql"] for q in captured.captured_queries] == ["SELECT 41::int + 1"]
    with pytest.raises(DataError):  # django.db's class, not psycopg's
        commit.statement_cursor(db, "probe").execute("SELECT %s::int", ["not a number"])
    # The failed statement left the connection usable; the kept cursor answers again.
    cur = commit.statement_cursor(db, "probe")
    cur.execute("SELECT %s::int * 2", [21])
    assert cur.fetchone() == (42,)


def test_the_statement_memos_stay_bounded_whatever_sql_a_caller_builds(monkeypatch):
    monkeypatch.setattr(commit, "_WITH_COMMIT", {})
    for n in range(commit._MEMO_MAX + 40):
        sql = f"SELECT {n}"
        joined = commit._joined(commit._WITH_COMMIT, sql, lambda sql=sql: sql + commit._COMMIT)
        assert joined == f"SELECT {n};\nCOMMIT"
    assert len(commit._WITH_COMMIT) == commit._MEMO_MAX
    first = commit._joined(commit._WITH_COMMIT, "SELECT 0", lambda: "SELECT 0" + commit._COMMIT)
    assert first is commit._WITH_COMMIT["SELECT 0"]  # remembered: the same object each time
