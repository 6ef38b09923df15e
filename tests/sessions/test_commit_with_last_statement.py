"""A write transaction's last statement carries its COMMIT (novelforge_sessions/commit.py).

Counted on the wire (libpq's trace of the connection): a checkpoint POST is two round trips
(token; BEGIN + its one statement + COMMIT), three with an idempotency key (token; BEGIN + run
lock; the key's lookup; insert + COMMIT), and what the block commits is committed once, after
which its on_commit callbacks run. The failure cases keep the atomic block's promise: a failing
statement or a failing COMMIT writes nothing and runs no callback, and inside another block the
statement goes alone so the outer block still decides.
"""
from __future__ import annotations

import psycopg
import pytest
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.utils import DataError, ProgrammingError

from novelforge_sessions import commit
from tests.pgwire import sent_queries

pytestmark = pytest.mark.django_db(transaction=True)


class Undo(Exception):
    """Raised to leave an outer block, which then rolls back."""


def _server_url() -> str:
    db = settings.DATABASES["default"]
    return f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} user={db['USER']} dbname={db['NAME']}" + (
        f" password={db['PASSWORD']}" if db.get("PASSWORD") else "")


@pytest.fixture
def probe_tables():
    """A parent and a child table whose foreign key is checked at COMMIT (as Django's are)."""
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE commit_probe_parent (id int PRIMARY KEY)")
        cur.execute("CREATE TABLE commit_probe (id int PRIMARY KEY, parent int REFERENCES commit_probe_parent (id) "
                    "DEFERRABLE INITIALLY DEFERRED)")
    yield
    with connection.cursor() as cur:
        cur.execute("DROP TABLE commit_probe, commit_probe_parent")


def _rows(sql: str) -> list[tuple]:
    """Read from another connection: what is committed."""
    with psycopg.connect(_server_url()) as other:
        return other.execute(sql).fetchall()


def _wire(owner, new_session, monkeypatch, settings, body):
    """The queries one checkpoint POST sends (after a warm-up POST), its answer, and its run."""
    monkeypatch.setenv("NOVELFORGE_EVENT_ORDER_CHECKS", "0")  # the suite's ordering checks query too
    settings.LIVE_PG_NOTIFY = False  # no NOTIFY after the commit (a lone server sends none either)
    settings.TOKEN_RECALL_SECONDS = 0  # the token's own lookup too (tests/api/test_recalled_tokens.py: without it)
    s = new_session(run=True)
    owner.post(f"/runs/{s['run']['id']}/checkpoints", {**body, "idempotency_key": "warm"} if "idempotency_key" in body
               else body)  # warm: the token's last_used_at write
    answers = []
    sent = sent_queries(lambda: answers.append(owner.post(f"/runs/{s['run']['id']}/checkpoints", body)))
    assert answers[0].status_code == 201, answers[0].content
    return sent, answers[0].json(), s["run"]["id"]


def test_a_checkpoint_post_is_two_round_trips_its_lock_checks_and_writes_one_statement_between_begin_and_commit(
    owner, new_session, monkeypatch, settings,
):
    sent, answer, run_id = _wire(owner, new_session, monkeypatch, settings,
                                 {"boundary": "context_freeze", "cursor": {"step": 1}})
    # token, then BEGIN + run lock + the three writes + COMMIT (two statements made 3, and 5 before that)
    assert len(sent) == 2, sent
    one = sent[1].strip('"')
    assert one.startswith("BEGIN;") and "FOR UPDATE OF r" in one and "INSERT INTO" in one and one.endswith("COMMIT")
    assert not any(q.strip('"') in ("BEGIN", "COMMIT") for q in sent)
    assert _rows(f"SELECT count(*) FROM novelforge_sessions_checkpoint WHERE run_id = {run_id} AND seq = {answer['seq']}") == [(1,)]
    assert _rows(f"SELECT checkpoint_count, cursor FROM novelforge_sessions_run WHERE id = {run_id}") == [(answer["seq"], {"step": 1})]
    assert _rows(f"SELECT payload FROM novelforge_sessions_event WHERE run_id = {run_id} AND type = 'checkpoint.recorded' "
                 f"ORDER BY id DESC LIMIT 1") == [({"checkpoint_id": answer["id"], "seq": answer["seq"],
                                                    "boundary": "context_freeze", "cursor": {"step": 1}},)]


def test_a_checkpoint_with_an_idempotency_key_is_three_round_trips_begins_with_its_lock_and_commits_with_its_insert(
    owner, new_session, monkeypatch, settings,
):
    sent, answer, run_id = _wire(owner, new_session, monkeypatch, settings,
                                 {"boundary": "context_freeze", "cursor": {"step": 1}, "idempotency_key": "k-1"})
    # token, BEGIN + run lock, the key's lookup, insert + COMMIT: the replay is read under the run's lock
    assert len(sent) == 4, sent
    assert sent[1].strip('"').startswith("BEGIN;") and "FOR UPDATE OF r" in sent[1] and "INSERT" not in sent[1]
    assert "idempotency_key" in sent[2]
    assert "INSERT INTO" in sent[3] and sent[3].strip('"').endswith("COMMIT")
    assert _rows(f"SELECT count(*) FROM novelforge_sessions_checkpoint WHERE run_id = {run_id} AND seq = {answer['seq']}") == [(1,)]


def test_the_block_commits_once_and_then_runs_its_callbacks(probe_tables):
    seen = []
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO commit_probe_parent VALUES (1)")
            transaction.on_commit(lambda: seen.append(_rows("SELECT id FROM commit_probe")))
            assert commit.execute_last(cur, "INSERT INTO commit_probe VALUES (10, 1) RETURNING id") is True
            assert cur.fetchone() == (10,)  # the statement's own result
        assert seen == []  # not before the block ends
    assert seen == [[(10,)]]  # after it, once, seeing the committed row
    assert _rows("SELECT id FROM commit_probe_parent") == [(1,)]
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_failing_last_statement_writes_nothing_and_runs_no_callback(probe_tables):
    seen = []
    with pytest.raises(DataError):
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("INSERT INTO commit_probe_parent VALUES (1)")
                transaction.on_commit(lambda: seen.append("ran"))
                commit.execute_last(cur, "INSERT INTO commit_probe VALUES (1 / 0, 1)")
    assert seen == []
    assert _rows("SELECT count(*) FROM commit_probe_parent") == [(0,)]
    with connection.cursor() as cur:  # the connection is usable, outside any transaction
        cur.execute("SELECT 1")
        assert cur.fetchone() == (1,)
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_failing_commit_raises_from_the_statement_and_writes_nothing(probe_tables):
    """A deferred foreign key is checked by the COMMIT: it fails inside the block, where the
    statement ran (a COMMIT of its own failed at the block's exit), and nothing is written."""
    seen, reached = [], []
    with pytest.raises(IntegrityError):
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("INSERT INTO commit_probe_parent VALUES (1)")
                transaction.on_commit(lambda: seen.append("ran"))
                commit.execute_last(cur, "INSERT INTO commit_probe VALUES (10, 999)")
                reached.append(True)
    assert reached == [] and seen == []
    assert _rows("SELECT (SELECT count(*) FROM commit_probe_parent), (SELECT count(*) FROM commit_probe)") == [(0, 0)]
    with transaction.atomic():  # the next block on this connection works
        with connection.cursor() as cur:
            cur.execute("INSERT INTO commit_probe_parent VALUES (2)")
    assert _rows("SELECT id FROM commit_probe_parent") == [(2,)]


def test_inside_another_block_the_statement_goes_alone_and_the_outer_block_decides(probe_tables):
    with pytest.raises(Undo):
        with transaction.atomic():
            with transaction.atomic():
                with connection.cursor() as cur:
                    assert commit.execute_last(cur, "INSERT INTO commit_probe_parent VALUES (1)") is False
            assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            raise Undo
    assert _rows("SELECT count(*) FROM commit_probe_parent") == [(0,)]


def test_outside_a_block_or_marked_for_rollback_it_goes_alone(probe_tables):
    with connection.cursor() as cur:  # autocommit: nothing to end
        assert commit.execute_last(cur, "INSERT INTO commit_probe_parent VALUES (1)") is False
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO commit_probe_parent VALUES (2)")
            assert commit.ends_transaction(transaction.get_connection()) is True
            transaction.set_rollback(True)  # (Django then refuses any statement, this one too)
            assert commit.ends_transaction(transaction.get_connection()) is False
    assert _rows("SELECT id FROM commit_probe_parent") == [(1,)]


def test_a_batch_commits_with_its_events(owner, new_session, monkeypatch, settings):
    monkeypatch.setenv("NOVELFORGE_EVENT_ORDER_CHECKS", "0")
    settings.LIVE_PG_NOTIFY = False
    settings.TOKEN_RECALL_SECONDS = 0
    s = new_session(run=True)
    items = [{"kind": "checkpoint", "checkpoint": {"boundary": "context_freeze", "cursor": {"step": i}}} for i in range(3)]
    owner.post(f"/runs/{s['run']['id']}/batch", {"items": items})  # warm
    answers = []
    sent = sent_queries(lambda: answers.append(owner.post(f"/runs/{s['run']['id']}/batch", {"items": items})))
    assert answers[0].status_code == 201, answers[0].content
    # token, BEGIN + run lock, the checkpoints, the run's counter, the events + COMMIT
    assert len(sent) == 5, sent
    assert sent[1].strip('"').startswith("BEGIN;") and not any(q.strip('"') == "BEGIN" for q in sent)
    assert "INSERT INTO novelforge_sessions_event" in sent[-1] and sent[-1].strip('"').endswith("COMMIT")
    assert not any(q.strip('"') == "COMMIT" for q in sent)
    assert _rows(f"SELECT count(*) FROM novelforge_sessions_checkpoint WHERE run_id = {s['run']['id']}") == [(6,)]


def test_the_first_statement_carries_the_begin_and_the_block_goes_on_as_before(probe_tables):
    seen = []
    sent = []

    def block() -> None:
        with transaction.atomic():
            with connection.cursor() as cur:
                assert commit.execute_first(cur, "SELECT count(*) FROM commit_probe_parent") is True
                assert cur.fetchone() == (0,)  # the statement's result, not BEGIN's
                assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
                assert connection.connection.autocommit is False  # psycopg's flag is back
                cur.execute("INSERT INTO commit_probe_parent VALUES (1)")
                transaction.on_commit(lambda: seen.append("ran"))

    sent = sent_queries(block)
    assert len(sent) == 3 and sent[0].strip('"').startswith("BEGIN;"), sent  # BEGIN + select, insert, COMMIT
    assert sent[2].strip('"') == "COMMIT" and seen == ["ran"]
    assert _rows("SELECT id FROM commit_probe_parent") == [(1,)]


def test_a_failing_first_statement_leaves_nothing_begun_and_the_connection_usable(probe_tables):
    with pytest.raises(ProgrammingError):  # refused by psycopg before anything was sent: nothing begun
        with transaction.atomic():
            with connection.cursor() as cur:
                commit.execute_first(cur, "SELECT %(missing)s FROM commit_probe_parent", {})
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with pytest.raises(DataError):  # the server ran BEGIN, then the statement failed: rolled back
        with transaction.atomic():
            with connection.cursor() as cur:
                commit.execute_first(cur, "SELECT %s::int FROM commit_probe_parent", ["not a number"])
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with pytest.raises(IntegrityError):  # the same for a write that fails
        with transaction.atomic():
            with connection.cursor() as cur:
                commit.execute_first(cur, "INSERT INTO commit_probe VALUES (1, NULL), (1, NULL)")
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with transaction.atomic():  # the next block on this connection begins and commits as usual
        with connection.cursor() as cur:
            assert commit.execute_first(cur, "INSERT INTO commit_probe_parent VALUES (2)") is True
    assert _rows("SELECT id FROM commit_probe_parent") == [(2,)]
    assert _rows("SELECT count(*) FROM commit_probe") == [(0,)]


def test_inside_a_begun_transaction_or_another_block_the_first_statement_goes_alone(probe_tables):
    with pytest.raises(Undo):
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("INSERT INTO commit_probe_parent VALUES (1)")  # psycopg's own BEGIN went before it
                assert commit.execute_first(cur, "INSERT INTO commit_probe_parent VALUES (2)") is False
            with transaction.atomic():
                with connection.cursor() as cur:
                    assert commit.starts_transaction(transaction.get_connection()) is False
            raise Undo
    assert _rows("SELECT count(*) FROM commit_probe_parent") == [(0,)]
    with connection.cursor() as cur:  # autocommit: no transaction to begin
        assert commit.execute_first(cur, "INSERT INTO commit_probe_parent VALUES (3)") is False
    assert _rows("SELECT id FROM commit_probe_parent") == [(3,)]


def test_the_begin_is_the_one_psycopg_would_send(probe_tables):
    """The connection's isolation level (DATABASES OPTIONS) is in the BEGIN that rides along."""
    connection.close()
    level = psycopg.IsolationLevel.REPEATABLE_READ
    connection.settings_dict["OPTIONS"]["isolation_level"] = level
    try:
        def block() -> None:
            with transaction.atomic():
                with connection.cursor() as cur:
                    commit.execute_first(cur, "SELECT current_setting('transaction_isolation')")
                    assert cur.fetchone() == ("repeatable read",)

        sent = sent_queries(block)
        assert sent[0].strip('"').startswith("BEGIN ISOLATION LEVEL REPEATABLE READ;"), sent
    finally:
        del connection.settings_dict["OPTIONS"]["isolation_level"]
        connection.close()


# ------------------------------------------------------------------ one statement: BEGIN and COMMIT both
def test_a_transaction_of_one_statement_is_one_round_trip_and_its_callbacks_run_after_it(probe_tables):
    seen = []

    def block() -> None:
        with transaction.atomic():
            with connection.cursor() as cur:
                transaction.on_commit(lambda: seen.append(_rows("SELECT id FROM commit_probe_parent")))
                assert commit.execute_only(cur, "INSERT INTO commit_probe_parent VALUES (1), (2) RETURNING id") == (True, True)
                assert cur.fetchall() == [(1,), (2,)]  # the statement's result, not BEGIN's or COMMIT's
                assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                assert connection.connection.autocommit is False  # psycopg's flag is back
                assert seen == []  # not before the block ends

    sent = sent_queries(block)
    assert len(sent) == 1, sent
    assert sent[0].strip('"').startswith("BEGIN;") and sent[0].strip('"').endswith("COMMIT")
    assert seen == [[(1,), (2,)]]  # ran once, after the commit, which it saw


def test_a_failing_only_statement_or_its_failing_commit_writes_nothing_and_runs_no_callback(probe_tables):
    seen = []
    with pytest.raises(IntegrityError):  # the statement fails: the COMMIT is skipped, the block rolls back
        with transaction.atomic():
            with connection.cursor() as cur:
                transaction.on_commit(lambda: seen.append("ran"))
                commit.execute_only(cur, "INSERT INTO commit_probe_parent VALUES (1), (1)")
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with pytest.raises(IntegrityError):  # the deferred foreign key fails the COMMIT: raised from the statement
        with transaction.atomic():
            with connection.cursor() as cur:
                transaction.on_commit(lambda: seen.append("ran"))
                commit.execute_only(cur, "INSERT INTO commit_probe VALUES (10, 999)")
    assert seen == []
    assert _rows("SELECT (SELECT count(*) FROM commit_probe_parent), (SELECT count(*) FROM commit_probe)") == [(0, 0)]
    with transaction.atomic():  # the next block on this connection works
        with connection.cursor() as cur:
            assert commit.execute_only(cur, "INSERT INTO commit_probe_parent VALUES (3)") == (True, True)
    assert _rows("SELECT id FROM commit_probe_parent") == [(3,)]


def test_inside_another_block_the_only_statement_carries_neither_and_the_outer_block_decides(probe_tables):
    with pytest.raises(Undo):
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SELECT 1")  # begun already
            with transaction.atomic():
                with connection.cursor() as cur:
                    assert commit.execute_only(cur, "INSERT INTO commit_probe_parent VALUES (1)") == (False, False)
            raise Undo
    assert _rows("SELECT count(*) FROM commit_probe_parent") == [(0,)]
    with transaction.atomic():  # a nested block, first statement of all: still alone, the outer block commits
        with transaction.atomic():
            with connection.cursor() as cur:
                assert commit.execute_only(cur, "INSERT INTO commit_probe_parent VALUES (2)") == (False, False)
        assert _rows("SELECT count(*) FROM commit_probe_parent") == [(0,)]  # not yet
    assert _rows("SELECT id FROM commit_probe_parent") == [(2,)]
