"""The hot write path's statements: the transaction's first one carries its BEGIN
(``execute_first``) and its last one its COMMIT (``execute_last``), a round trip fewer each,
a transaction of one statement both (``execute_only``), and each runs on a cursor kept for it
(``statement_cursor``: its parameters' adapters are found once per connection). A checkpoint
POST without refs or idempotency key is one round trip (``BEGIN; <lock, checks and writes>;
COMMIT``); one with them is two: BEGIN with the run lock, the insert with the COMMIT.

Before these, a checkpoint was five round trips (token, BEGIN, run lock, insert, COMMIT), each
~0.1 ms of the server's CPU on this stack (the cursor, the send, the wait and the kernel's
wake-ups); the token's lookup went with recalled tokens (``api/auth.py``). Django's
``transaction.atomic()`` commits with a statement of its own when the block exits, and psycopg
begins with one of its own before the first statement.

``execute_last`` sends the transaction's last statement with ``COMMIT`` appended, in one
simple-protocol query (psycopg's client-side-binding cursor, Django's default, sends a query
with its parameters merged in, so two statements may travel together). The server runs both or
neither: a failing statement skips the COMMIT and leaves the transaction aborted, which the
atomic block rolls back as before; a failing COMMIT (a deferred constraint) raises here, from
the statement, instead of from the block's exit, and the block's rollback finds nothing left
to undo. When the block exits, psycopg sees the connection idle and sends no second COMMIT
(``Connection.commit`` is a no-op outside a transaction); Django then runs its ``on_commit``
callbacks as usual, after the commit they wait for.

Only when the statement ends the whole transaction: the outermost atomic block, no savepoint
below it, not marked for rollback, client-side binding. Anywhere else (inside another atomic
block, such as a test's, or a batch that calls this action) the statement runs alone and the
block commits as before. The caller's contract: nothing is executed in the block after it (a
later statement would run in a transaction of its own).
"""
from __future__ import annotations

from typing import Any

from psycopg.pq import TransactionStatus

#: What rides along with the last statement.
_COMMIT = ";\nCOMMIT"
_IDLE = TransactionStatus.IDLE
#: Each statement joined with its COMMIT, and each (BEGIN command, statement) with the BEGIN in
#: front, built once: the same string object each time lets a kept cursor (``statement_cursor``)
#: reuse its adapters (psycopg compares the query by identity).
_WITH_COMMIT: dict[str, str] = {}
_WITH_BEGIN: dict[tuple[bytes, str], str] = {}
#: The hot statements are module constants; past this many, a statement is joined per call
#: instead of remembered (a caller passing built SQL cannot grow the memos without bound).
_MEMO_MAX = 64


def _joined(memo: dict[Any, str], key: Any, build: Any) -> str:
    text = memo.get(key)
    if text is None:
        text = build()
        if len(memo) < _MEMO_MAX:
            memo[key] = text
    return text


def _in_outermost_block(db: Any) -> bool:
    """Is ``db`` (a connection wrapper, not the ``connection`` proxy: each of the proxy's
    attributes costs a thread-local lookup) in exactly one atomic block, with no savepoint, not
    marked for rollback, binding client-side (the simple protocol that lets two statements
    travel together)?"""
    return (
        db.in_atomic_block
        and len(db.atomic_blocks) == 1
        and not db.savepoint_ids
        and not db.needs_rollback
        and not db.settings_dict["OPTIONS"].get("server_side_binding")
    )


def ends_transaction(db: Any) -> bool:
    """Would a COMMIT on ``db`` end exactly the transaction of its current, outermost atomic block?"""
    return _in_outermost_block(db) and db.commit_on_exit


def execute_last(cursor: Any, sql: str, params: Any = None) -> bool:
    """Execute the transaction's last statement, with its COMMIT when it ends the transaction.

    Returns whether the COMMIT went with it. The statement's own result stays the cursor's
    current one (``fetchone`` reads it)."""
    if ends_transaction(cursor.db):
        cursor.execute(_joined(_WITH_COMMIT, sql, lambda: sql + _COMMIT), params)
        return True
    cursor.execute(sql, params)
    return False


def starts_transaction(db: Any) -> bool:
    """Would a statement on ``db`` now be the first of its outermost atomic block's transaction
    (psycopg would send BEGIN before it)?"""
    raw = db.connection
    return (
        raw is not None
        and _in_outermost_block(db)
        and not raw.autocommit
        and raw.info.transaction_status == _IDLE
    )


def execute_first(cursor: Any, sql: str, params: Any = None) -> bool:
    """Execute the transaction's first statement, with its BEGIN when it starts the transaction.

    psycopg sends ``BEGIN`` as a round trip of its own before the first statement of a
    transaction. When this statement is that first one (``starts_transaction``), it goes as
    ``BEGIN; <statement>`` in one simple-protocol query instead, psycopg told for that one
    execute that the connection needs no BEGIN of its own (its ``_autocommit`` flag, restored
    at once); the BEGIN is the one psycopg would have sent (isolation level and all). The server
    then holds the transaction as if psycopg had begun it: later statements, the COMMIT
    (``execute_last``, or the block's) and a rollback go on as before. A failing statement
    leaves the begun transaction aborted, which the block rolls back; a failure before the
    server ran anything leaves it idle, with nothing to roll back. The statement's own result is
    made the cursor's current one (``fetchone`` reads it). Returns whether BEGIN went with it.
    """
    if not starts_transaction(cursor.db):
        cursor.execute(sql, params)
        return False
    _execute_with_begin(cursor, sql, params, commit=False)
    return True


def execute_only(cursor: Any, sql: str, params: Any = None) -> tuple[bool, bool]:
    """Execute a transaction's one statement: with its BEGIN when it starts the transaction
    (``execute_first``) and its COMMIT when it ends it (``execute_last``), so that a write
    made of one statement is one round trip: ``BEGIN; <statement>; COMMIT``. The server runs
    them in order and stops at the first error: a failing statement leaves the begun
    transaction aborted and skips the COMMIT (the block rolls back), a failing COMMIT raises
    here. Returns (BEGIN went with it, COMMIT went with it); the statement's result is the
    cursor's current one. The caller's contract is both functions': nothing before it in the
    block, nothing executed after it."""
    db = cursor.db
    begins, ends = starts_transaction(db), ends_transaction(db)
    if begins and ends:
        _execute_with_begin(cursor, sql, params, commit=True)
    elif begins:
        _execute_with_begin(cursor, sql, params, commit=False)
    else:
        ends = execute_last(cursor, sql, params)
    return begins, ends


def _execute_with_begin(cursor: Any, sql: str, params: Any, *, commit: bool) -> None:
    raw = cursor.db.connection
    begin = raw._get_tx_start_command()
    if commit:
        sql = _joined(_WITH_COMMIT, sql, lambda: sql + _COMMIT)
    with_begin = _joined(_WITH_BEGIN, (begin, sql), lambda: begin.decode("ascii") + ";\n" + sql)
    raw._autocommit = True  # for this execute only: the statement carries the BEGIN
    try:
        cursor.execute(with_begin, params)
    finally:
        raw._autocommit = False
    cursor.nextset()  # BEGIN's result first, then the statement's


def statement_cursor(db: Any, key: str) -> Any:
    """A cursor on ``db``'s connection kept for one hot statement (``key``), wrapped as
    ``db.cursor()`` wraps one (errors as Django's, execute wrappers and query logging apply).

    psycopg gives every new cursor a new ``Transformer``, whose adapters then look up a dumper
    for each parameter's type again (a list's dumper is the dearest: it inspects the list's
    elements to choose one). A cursor that executes the same query object again keeps its
    transformer (``psycopg.BaseCursor._start_query``), so the statement's dumpers are found
    once per connection: on the checkpoint's two statements, the parameters' conversion took
    ~0.2 ms of thread CPU per checkpoint in process before and 0.14 ms after, and the server's
    instructions per checkpoint POST fell by 5.8 % (callgrind, ``bench/instructions.py``).

    The cursors are kept per connection object and time zone (Django gives a cursor its time
    zone's loader when it creates it): another connection (after a reconnect, or another pooled
    one) or another ``TIME_ZONE`` starts afresh. Not closed by the caller (no ``with``).
    """
    db.ensure_connection()
    raw, zone = db.connection, db.timezone_name
    kept = db.__dict__.get("_nf_statement_cursors")
    if kept is None or kept[0] is not raw or kept[1] != zone:
        kept = db._nf_statement_cursors = (raw, zone, {})
    cursor = kept[2].get(key)
    if cursor is None or cursor.closed:
        with db.wrap_database_errors:
            cursor = kept[2][key] = db.create_cursor()
    return db._prepare_cursor(cursor)
