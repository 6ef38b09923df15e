"""A write transaction's last statement and its COMMIT in one round trip.

Django's ``transaction.atomic()`` commits with a statement of its own when the block exits: on
the hottest write path (a checkpoint: token, BEGIN, run lock, insert, COMMIT) that is one of
five round trips, each ~0.1 ms of the server's CPU on this stack (the cursor, the send, the
wait and the kernel's wake-ups), about as much as the COMMIT's own work on the server.

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

#: What rides along with the last statement.
_COMMIT = ";\nCOMMIT"


def ends_transaction(db: Any) -> bool:
    """Would a COMMIT on ``db`` (a connection wrapper, not the ``connection`` proxy: each of the
    proxy's attributes costs a thread-local lookup) end exactly the transaction of its current,
    outermost atomic block?"""
    return (
        db.in_atomic_block
        and len(db.atomic_blocks) == 1
        and not db.savepoint_ids
        and not db.needs_rollback
        and db.commit_on_exit
        and not db.settings_dict["OPTIONS"].get("server_side_binding")
    )


def execute_last(cursor: Any, sql: str, params: Any = None) -> bool:
    """Execute the transaction's last statement, with its COMMIT when it ends the transaction.

    Returns whether the COMMIT went with it. The statement's own result stays the cursor's
    current one (``fetchone`` reads it)."""
    if ends_transaction(cursor.db):
        cursor.execute(sql + _COMMIT, params)
        return True
    cursor.execute(sql, params)
    return False
