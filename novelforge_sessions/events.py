"""The event log: appended inside the writing transaction, broadcast after commit.

Ordering guarantee, without a global lock. A plain ``bigserial`` hands out ids at insert time,
so a transaction that got id 7 may commit after one that got id 8; a reader who saw 8 and
remembers "after 8" would never see 7. One global advisory lock held to commit would fix that by serialising all
writers; instead an event's id is the writing transaction's
top-level ``xid8`` shifted left by 16 bits plus its n-th event in that transaction
(``nf_event_ids``, migration 0004): ids of a later transaction are larger, ids of one
transaction consecutive. Readers see only ids below the *watermark* (``watermark()``, the
SQL function ``nf_event_watermark``): the lowest xid still running in this database (other than
the reader's own backend), shifted the same way, else the next xid to be assigned. Every
transaction below the watermark has finished, so what a reader sees is a prefix of the log
that never later gains a committed id below its top: ``after=<id>`` replay has no gaps. Every
reader of the stream goes through ``visible()`` / ``events_after()`` here.

Order within a session. An xid is handed out at a transaction's first write or row lock, and a
transaction queueing for a contended row lock may already have one (several waiters on a row the
holder updated: one wins the lock with a later xid than a waiter behind it). So every
transaction that writes a session's events first takes that session's *ordering lock*
(``order_lock``: an advisory lock, which queues without an xid) before its first write or row
lock; a session's events are then in the order their transactions held the session.
``NOVELFORGE_EVENT_ORDER_CHECKS=1`` (the test suite) verifies the rule on every write.

The price moves from writers to readers: a transaction that is slow to finish (any writer in
this database, with or without events) holds back the visibility of events committed after it
began, until it ends. Writers no longer wait for each other. A reader that was woken for an id
it cannot see yet re-reads shortly (the live feed does: ``live/fanout.py``).

Broadcast. After commit, one wake-up per transaction and project goes to the channel layer
group ``events.project.<id>``; subscribers then read the table. The channel layer is
at-most-once and only a wake-up; the table is the truth (a message to a
full or vanished channel is dropped without an error). With the in-memory
layer, a group whose members are all hubs of this process (``live/fanout.py``) is woken
directly on the hub's loop (``LOCAL_WAKERS``); any other layer's send runs on this process's
one sender loop (``_Sender``). Neither starts a thread or an event loop per commit.
The INFO log line of each event is written after the commit too (never inside the transaction).

Other processes. The in-memory layer (no ``REDIS_URL``) only reaches this process's sockets,
so with ``LIVE_PG_NOTIFY`` on the same after-commit wake-up also publishes ONE
``pg_notify(NOTIFY_CHANNEL, …)`` per transaction: after the commit, as its own short
autocommit statement (never inside the writing transaction, never one per row), carrying
only the projects touched and their highest ids. Each server process's listener
(``live/pgnotify.py``) forwards it into its own in-memory groups. A server process whose
listener knows that no other process listens sends none (``notify_reaches_nobody``: the
listeners announce themselves to each other). With Redis the layer itself crosses processes
and nothing is NOTIFYed.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, NamedTuple, TypeVar

from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import BooleanField, Q, QuerySet
from django.db.models.expressions import RawSQL

from novelforge_sessions.event_types import EventType, family_of
from novelforge_sessions.models import Event

log = logging.getLogger("novelforge.events")
T = TypeVar("T")

#: Low bits of an event id: its position inside the writing transaction (migration 0004).
EVENT_ID_BITS = 16


#: The one PostgreSQL channel the wake-ups of every process go through (``live/pgnotify.py``).
NOTIFY_CHANNEL = "novelforge_events"
#: This process's mark in its NOTIFY payloads: its listener skips its own (already sent locally).
NOTIFY_ORIGIN = f"{os.getpid()}.{secrets.token_hex(4)}"
#: PostgreSQL caps a payload below 8000 bytes; a transaction touching very many projects
#: is split into several payloads (still one statement, after the commit).
_NOTIFY_PAYLOAD_BYTES = 7000


#: In-process listeners woken without the channel layer: a layer channel name (a member of
#: project groups of the in-memory layer) -> a thread-safe ``wake(project_id, max_id)``.
#: ``live/fanout.py`` registers each hub's channel here while the hub runs.
LOCAL_WAKERS: dict[str, Callable[[int, int], None]] = {}

#: Whether this process's NOTIFYs would reach nobody: replaced by this process's NOTIFY listener
#: (``live/pgnotify.py``) with its own answer, true only while that listener runs and knows that
#: no other process listens. A process without a listener (the reconciler, a shell) never knows
#: that, so it always NOTIFYs.
notify_reaches_nobody: Callable[[], bool] = lambda: False

#: How long a writer waits for its wake-up to leave through a cross-process layer (Redis).
SEND_TIMEOUT_SECONDS = 5.0


#: A wake-up's ``max_id`` that announces no particular event: "read once" (the hub's sweep, a
#: reconnected NOTIFY listener), not an id to wait for (``live/fanout.py``).
WAKE_ALL = 2**63 - 1


def project_group(project_id: int) -> str:
    return f"events.project.{project_id}"


def notify_payloads(max_ids: dict[int, int]) -> list[str]:
    """``{"o": origin, "p": [[project_id, max_id], ...]}`` texts, each under PostgreSQL's limit."""
    payloads: list[str] = []
    chunk: list[list[int]] = []
    size = 0
    for project_id, max_id in sorted(max_ids.items()):
        item = [project_id, max_id]
        item_size = len(str(project_id)) + len(str(max_id)) + 4
        if chunk and size + item_size > _NOTIFY_PAYLOAD_BYTES:
            payloads.append(json.dumps({"o": NOTIFY_ORIGIN, "p": chunk}, separators=(",", ":")))
            chunk, size = [], 0
        chunk.append(item)
        size += item_size
    if chunk:
        payloads.append(json.dumps({"o": NOTIFY_ORIGIN, "p": chunk}, separators=(",", ":")))
    return payloads


def _publish_notify(max_ids: dict[int, int]) -> None:
    """One ``pg_notify`` statement for the whole transaction, run after its commit.

    Sent on the raw psycopg connection of this thread's Django connection (already open: the
    transaction just committed on it), in autocommit: it is not part of the writing
    transaction, and it stays outside Django's query log, so the write paths' query-count
    pins measure the transaction alone (the NOTIFY is one extra round trip after COMMIT).
    """
    raw = connection.connection
    if raw is None:
        return
    payloads = notify_payloads(max_ids)
    try:
        if len(payloads) == 1:
            raw.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, payloads[0]])
        else:
            raw.execute("SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", [NOTIFY_CHANNEL, payloads])
    except Exception:  # lost: the other processes' sockets get the events at their next sweep
        log.warning("event NOTIFY for projects %s failed", sorted(max_ids), exc_info=True)


class _Sender:
    """This process's one event loop (a daemon thread) for the wake-ups a writer sends through
    a layer other than the in-memory one (channels_redis).

    ``async_to_sync(layer.group_send)`` from a writer's thread started a thread and an event
    loop per call, and channels_redis opens a connection per event loop: a Redis connect per
    commit. Here the sends of every writer thread run on one long-lived loop, on the layer's
    connection of that loop; the writer still waits until its send has gone out (or failed).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid() or not (self._thread and self._thread.is_alive()):
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="novelforge-wakeup-sender", daemon=True)
                thread.start()
                self._loop, self._thread, self._pid = loop, thread, os.getpid()
            return self._loop

    def group_send(self, layer: Any, group: str, message: dict[str, Any]) -> None:
        future = asyncio.run_coroutine_threadsafe(layer.group_send(group, message), self.loop())
        try:
            future.result(timeout=SEND_TIMEOUT_SECONDS)
        except BaseException:
            future.cancel()
            raise


_sender = _Sender()


class _Wakeup:
    """One per transaction: collects the projects touched and the highest id, sends once."""

    def __init__(self) -> None:
        self.max_ids: dict[int, int] = {}
        self.logged: list[tuple[Any, ...]] = []

    def add(self, project_id: int, event_id: int, line: tuple[Any, ...] | None = None) -> None:
        self.max_ids[project_id] = max(event_id, self.max_ids.get(project_id, 0))
        if line is not None:
            self.logged.append(line)

    def __call__(self) -> None:
        from channels.layers import InMemoryChannelLayer, get_channel_layer

        for line in self.logged:  # after the commit: never under a lock or inside the transaction
            log.info("event %s %s project=%s session=%s run=%s actor=%s", *line)

        layer = get_channel_layer()
        if layer is None:
            return
        # The in-memory layer only reaches consumers of this process. With no member in the
        # group nobody here can hear the wake-up, so skip it. When every member is a hub of
        # this process (live/fanout.py, the only listener the server has), wake the hubs
        # directly: each ``wake`` hands the call to its hub's event loop thread-safely
        # (``call_soon_threadsafe``), where ``async_to_sync(group_send)`` started a thread and
        # an event loop per call (the largest cost of a write's after-commit) and put the
        # message on the hub's asyncio queue from that foreign loop, which does not wake the
        # hub's loop. Any other member (a test's spy channel) still gets the group message.
        # Safe because a hub joins the group *before* reading the table: one that joins after
        # this check still reads this committed event. Exact type: a subclass (or
        # channels_redis, whose listeners live in other processes) always gets the send.
        local = layer.groups if type(layer) is InMemoryChannelLayer else None
        for project_id, max_id in self.max_ids.items():
            group = project_group(project_id)
            message = {"type": "events.wakeup", "project_id": project_id, "max_id": max_id}
            try:
                if local is not None:
                    members = list(local.get(group) or ())
                    if not members:
                        continue
                    wakers = [LOCAL_WAKERS.get(channel) for channel in members]
                    if all(wakers):
                        for wake in wakers:
                            wake(project_id, max_id)
                        continue
                    async_to_sync(layer.group_send)(group, message)
                else:
                    _sender.group_send(layer, group, message)
            except Exception:  # a lost wake-up is recoverable: readers replay from the table
                log.warning("event wake-up for project %s failed", project_id, exc_info=True)
        # The in-memory layer cannot reach other processes: wake their listeners through
        # PostgreSQL (settings.LIVE_PG_NOTIFY; always off with Redis, which crosses processes),
        # unless this process's listener knows that no other process listens (a single server:
        # its sockets were woken above, and the NOTIFY would only come back to itself).
        if local is not None and self.max_ids and settings.LIVE_PG_NOTIFY and not notify_reaches_nobody():
            _publish_notify(self.max_ids)


def _current_wakeup() -> _Wakeup:
    for _sids, func, _robust in connection.run_on_commit:
        if isinstance(func, _Wakeup):
            return func
    wakeup = _Wakeup()
    transaction.on_commit(wakeup, robust=True)
    return wakeup


# The id comes from the column's default, nf_event_ids(1) (migration 0004).
# ---------------------------------------------------------------- ordering locks
#: Namespace of the per-session ordering locks: ``pg_advisory_xact_lock(ORDER_LOCK_NS, key)``, "NFOL".
ORDER_LOCK_NS = 0x4E464F4C
_KEY_MASK = 0x7FFFFFFF  # a session id folded into int4 (two sessions sharing a key only wait for each other)


def order_lock_sql(session_id_sql: str) -> str:
    """An SQL boolean that takes the ordering lock of the session ``session_id_sql`` names.

    Written into a locking statement's ``WHERE``: it depends on parameters only, so PostgreSQL
    plans it as a one-time filter (an InitPlan) evaluated before the statement's scan, hence
    before its row locks. A NULL session id (no such row) takes no lock and matches nothing.
    """
    return (
        f"(SELECT true FROM (SELECT pg_advisory_xact_lock({ORDER_LOCK_NS}, "
        f"(({session_id_sql}) & {_KEY_MASK})::int4)) AS nf_order_lock)"
    )


def order_lock_filter(session_id_sql: str, params: list[Any]) -> RawSQL:
    """``order_lock_sql`` as an ORM filter (``qs.filter(order_lock_filter(...))``) for a locking
    queryset: the ordering lock in the same statement as its row lock. Call
    ``before_order_lock`` first (the suite's check)."""
    return RawSQL(order_lock_sql(session_id_sql), params, output_field=BooleanField())


def order_lock(*session_ids: int, created: bool = False) -> None:
    """Take the ordering locks of these sessions (ascending, so two callers never deadlock).

    ``created=True``: sessions this transaction just inserted. Nobody else can write them
    before it commits, so the lock may come after the insert (it is taken so that the events
    check below holds; it never waits).

    Why. An event id is its transaction's xid in the high bits, so two transactions that touch
    the same session must get their xids in the order they really happened. PostgreSQL gives a
    transaction its xid at its first write or row lock, and a transaction that queues for a
    contended row lock may already get one while it waits (several waiters on an updated row:
    one of them wins the lock with a later xid). An advisory lock queues without an xid. So
    every transaction that writes a session's events takes that session's ordering lock
    first, before its first write or row lock (``lifecycle.lock_session`` and the run and
    handoff locks do); once it holds it, the rows it then locks are free of that session's other
    writers, and its xid is drawn after the previous holder committed.
    """
    keys = sorted({int(i) & _KEY_MASK for i in session_ids})
    if not keys:
        return
    if not created:
        before_order_lock(*keys)
    with connection.cursor() as cur:
        if len(keys) == 1:
            cur.execute(f"SELECT pg_advisory_xact_lock({ORDER_LOCK_NS}, %s)", keys)
        else:
            cur.execute(
                f"SELECT pg_advisory_xact_lock({ORDER_LOCK_NS}, k) FROM (SELECT k FROM unnest(%s::int4[]) AS k ORDER BY k) AS o",
                [keys],
            )


def order_lock_candidate(sql: str, params: dict[str, Any] | list[Any]) -> int | None:
    """A claim's first step: ``sql`` (no row locks) selects the ``session_id`` of the oldest
    candidate row; take that session's ordering lock and return it (``None``: no candidate).

    A claim does not know its session before it picks a row, and SKIP LOCKED would lock the
    row (so draw an xid) first. This way it queues on the session's ordering lock with no xid,
    then claims within that session only. One blocking ordering lock per claim, taken first:
    claims cannot deadlock on them.
    """
    before = _xid_and_held()  # the rule, as before_order_lock states it, once the session is known
    with connection.cursor() as cur:
        # One statement: the lock is in the outer select list, so only the chosen row's session is locked.
        cur.execute(
            f"SELECT c.session_id, pg_advisory_xact_lock({ORDER_LOCK_NS}, (c.session_id & {_KEY_MASK})::int4)::text "
            f"FROM ({sql}) AS c", params,
        )
        row = cur.fetchone()
    if row is None:
        return None
    if before is not None and (row[0] & _KEY_MASK) not in before[1]:
        raise AssertionError(
            f"ordering lock of session {row[0]} taken after this transaction's first write or row lock (xid {before[0]})"
        )
    return row[0]


class _LostRace(Exception):
    """Internal: the candidate's session had nothing left once its ordering lock was held."""


def claim_in_oldest_session(candidate_sql: str, params: dict[str, Any], claim: Callable[[int], T | None]) -> T | None:
    """A claim that picks its session first (:func:`order_lock_candidate`), retried when it lost.

    ``candidate_sql`` selects the oldest candidate's ``session_id`` and must exclude the sessions
    in ``%(tried)s`` (a bigint array); ``claim(session_id)`` claims within that session, under its
    ordering lock, and returns ``None`` when the session has nothing left. That happens when
    other claimers queued on the same lock took the session's last rows first (or a row is held
    by another transaction): before, such a claim answered "nothing to claim" while other
    sessions still had eligible rows. Now it tries the next oldest candidate's session.

    Each try is a transaction of its own, and a lost one is rolled back, which releases that
    session's ordering lock before the next one is taken: a claimer never holds one session's
    lock while it waits for another's, so two retrying claimers cannot wait for each other.
    It answers "nothing" only when no session it has not tried has a candidate: with k claimers
    queued on one lock the last loses k-1 sessions, so any fixed number of tries (it was 8)
    turned away a busy pool's later claimers while work was left. Each try excludes the
    sessions tried before, so the tries are at most the sessions with a candidate, and each lost
    one is a session whose rows racing claimers took or hold.
    Called inside a transaction, it tries once (that transaction would keep the lost session's
    lock). A claim that wins on its first try runs exactly the statements it ran before.
    """
    if connection.in_atomic_block:
        session_id = order_lock_candidate(candidate_sql, {**params, "tried": []})
        return None if session_id is None else claim(session_id)
    tried: list[int] = []
    while True:
        session_id = None
        try:
            with transaction.atomic():
                session_id = order_lock_candidate(candidate_sql, {**params, "tried": tried})
                if session_id is None:
                    return None
                result = claim(session_id)
                if result is None:
                    raise _LostRace
                return result
        except _LostRace:
            tried.append(session_id)


def _raw_rows(sql: str, params: list[Any] | None = None) -> Any:
    """The rows of a check's query on the raw connection, or ``_UNKNOWN`` when it cannot run (the
    database went away: the statement the check guards then fails with its own typed error)."""
    try:
        return connection.connection.execute(sql, params).fetchall()
    except Exception:
        return _UNKNOWN


_UNKNOWN = object()


def _checks_on() -> bool:
    """``NOVELFORGE_EVENT_ORDER_CHECKS`` (the test suite turns it on): verify the ordering rule."""
    return os.environ.get("NOVELFORGE_EVENT_ORDER_CHECKS", "") == "1"


def order_lock_key(session_id: int) -> int:
    return int(session_id) & _KEY_MASK


def before_order_lock(*keys: int) -> None:
    """With the checks on: refuse an ordering lock taken after the transaction's first write
    (unless this transaction already holds every one of ``keys``: a re-entry).

    Only for the outermost transaction (a test's enclosing transaction, or an action nested in
    another, took its locks earlier). Runs on the raw connection: outside the query counts.
    """
    before = _xid_and_held()
    if before is not None:
        xid, held = before
        if keys and {k & _KEY_MASK for k in keys} <= held:
            return
        raise AssertionError(
            f"ordering lock taken after this transaction's first write or row lock (xid {xid}, holding {sorted(held)}): "
            "take it first (events.order_lock)"
        )


def _xid_and_held() -> tuple[int, set[int]] | None:
    """With the checks on, in an outermost transaction that already has an xid: (that xid, the
    ordering locks it holds). ``None`` otherwise: no xid yet (any ordering lock is in time),
    checks off, a nested transaction (its locks were taken earlier), or the database gone."""
    if not _checks_on() or len(connection.atomic_blocks) != 1 or connection.connection is None:
        return None
    rows = _raw_rows("SELECT pg_current_xact_id_if_assigned()")
    if rows is _UNKNOWN or rows[0][0] is None:
        return None
    held = _held_order_locks()
    return None if held is None else (rows[0][0], held)


def _held_order_locks() -> set[int] | None:
    """This backend's ordering locks (None: unknown, the database went away)."""
    rows = _raw_rows(
        "SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objsubid = 2 "
        "AND pid = pg_backend_pid() AND granted",
        [ORDER_LOCK_NS],
    )
    return None if rows is _UNKNOWN else {r[0] for r in rows}


def _check_ordered(session_ids: list[int | None]) -> None:
    """With the checks on: every event of a session is written under that session's ordering lock."""
    if not _checks_on():
        return
    held = _held_order_locks()
    if held is None:
        return
    missing = sorted({sid for sid in session_ids if sid is not None and (sid & _KEY_MASK) not in held})
    if missing:
        raise AssertionError(f"events of sessions {missing} written without their ordering lock (events.order_lock)")


# Set-based: n events in one statement, ids reserved as one consecutive range, in list order.
_INSERT_MANY = (
    f"INSERT INTO {Event._meta.db_table} (id, project_id, session_id, run_id, type, payload, actor, created_at) "
    "SELECT b.first + t.ord - 1, t.project_id, t.session_id, t.run_id, t.type, t.payload, t.actor, now() "
    "FROM (SELECT nf_event_ids(%(n)s) AS first) AS b, "
    "unnest(%(project)s::bigint[], %(session)s::bigint[], %(run)s::bigint[], %(type)s::text[], %(payload)s::jsonb[], "
    "%(actor)s::text[]) WITH ORDINALITY AS t(project_id, session_id, run_id, type, payload, actor, ord) "
    "ORDER BY t.ord RETURNING id"
)


class Staged(NamedTuple):
    """One event checked and ready, for a caller whose own statement inserts it (``stage``).

    That statement runs ``STAGED_INSERT_SQL`` (the event's ``INSERT … RETURNING id``) as one of
    its CTEs, with ``params`` (named, ``ev_``-prefixed) merged into its parameters, then calls
    ``recorded`` with the returned id: one statement for a write and its event.
    """

    params: dict[str, Any]
    project_id: int
    session_id: int | None
    run_id: int | None
    type_name: str
    actor: str


STAGED_INSERT_SQL = (
    f"INSERT INTO {Event._meta.db_table} (project_id, session_id, run_id, type, payload, actor, created_at) "
    "VALUES (%(ev_project)s, %(ev_session)s, %(ev_run)s, %(ev_type)s, %(ev_payload)s::jsonb, %(ev_actor)s, now()) "
    "RETURNING id"
)


def stage(
    *,
    project_id: int,
    type: EventType,
    session_id: int | None = None,
    run_id: int | None = None,
    payload: dict[str, Any] | None = None,
    actor: str = "",
) -> Staged:
    """Check one event as ``append`` does (catalog constant, declared payload fields, inside the
    writing transaction, under its session's ordering lock) without writing it: the caller's
    statement inserts it (``STAGED_INSERT_SQL``), then calls ``recorded``. Nothing is written
    on a refusal."""
    if not isinstance(type, EventType):
        raise TypeError(f"events.append takes an event_types constant, not {type!r}")
    body = json.dumps(type(**(payload or {})), cls=DjangoJSONEncoder)
    if not connection.in_atomic_block:
        raise RuntimeError("events.append must run inside the writing transaction")
    _check_ordered([session_id])
    params = {"ev_project": project_id, "ev_session": session_id, "ev_run": run_id, "ev_type": type.name,
              "ev_payload": body, "ev_actor": actor}
    return Staged(params, project_id, session_id, run_id, type.name, actor)


def stage_in_locking_statement(*, type: EventType, filled: frozenset[str], payload: dict[str, Any], actor: str) -> dict[str, Any]:
    """For a statement that takes its session's ordering lock itself (``order_lock_sql`` in its
    ``WHERE``, evaluated before its row lock and its writes) and inserts the event too: the
    event's parameters (``ev_type``, ``ev_payload``, ``ev_actor``), its payload checked against
    the catalog as ``stage`` checks it, less the ``filled`` fields, which the statement adds
    (``ev_payload || jsonb_build_object(...)``: the ids it draws, the numbers it counts).

    The ordering lock is not held yet when this runs (the statement takes it), so there is
    nothing for the suite's ordering check to look at here; the statement's shape is the
    guarantee. The statement may be a transaction of its own (``commit.execute_write``) or one
    statement of the caller's. After it, ``recorded`` takes a ``Staged`` built from the
    statement's row."""
    if not isinstance(type, EventType):
        raise TypeError(f"events.append takes an event_types constant, not {type!r}")
    body = json.dumps(type.filled_by_statement(filled, **payload), cls=DjangoJSONEncoder)
    return {"ev_type": type.name, "ev_payload": body, "ev_actor": actor}


def recorded_many(written: list[tuple[Staged, int]]) -> None:
    """``recorded`` for several events of one statement: one wake-up for all of them."""
    info = log.isEnabledFor(logging.INFO)
    own = transaction.get_autocommit()
    wakeup = _Wakeup() if own else _current_wakeup()
    for staged, event_id in written:
        line = (event_id, staged.type_name, staged.project_id, staged.session_id, staged.run_id, staged.actor)
        wakeup.add(staged.project_id, event_id, line if info else None)
    if own and written:
        try:
            wakeup()
        except Exception:  # as on_commit(robust=True): a lost wake-up is recoverable, readers replay
            log.warning("event wake-up after events %s failed", [event_id for _, event_id in written], exc_info=True)


def recorded(staged: Staged, event_id: int) -> int:
    """The caller's statement inserted ``staged`` as ``event_id``: wake the sockets after commit
    (now, when that statement was a transaction of its own and has committed)."""
    recorded_many([(staged, event_id)])
    return event_id


def append(**event: Any) -> int:
    """Append one event in the current transaction and return its id.

    ``type`` is a constant of the catalog (``novelforge_sessions.event_types``), never a
    string: the payload is checked against its declared fields (``TypeError`` otherwise,
    nothing written). Must be called inside ``transaction.atomic()``; call it after the
    change it records. The keywords are ``stage``'s (``project_id``, ``type``, ``session_id``,
    ``run_id``, ``payload``, ``actor``); a write that wants its event in its own statement calls
    ``stage`` and ``recorded`` itself.
    """
    staged = stage(**event)
    with connection.cursor() as cur:
        cur.execute(STAGED_INSERT_SQL, staged.params)
        return recorded(staged, cur.fetchone()[0])


def append_many(items: list[dict[str, Any]]) -> list[int]:
    """Append several events in ONE statement (the batch write path); ids in list order.

    Each item has the keyword arguments of ``append``. Same checks as ``append`` (catalog
    constant, declared payload fields, inside the writing transaction), all before the insert.
    """
    if not items:
        return []
    if not connection.in_atomic_block:
        raise RuntimeError("events.append_many must run inside the writing transaction")
    cols: dict[str, list[Any]] = {k: [] for k in ("project", "session", "run", "type", "payload", "actor")}
    for item in items:
        kind = item["type"]
        if not isinstance(kind, EventType):
            raise TypeError(f"events.append_many takes event_types constants, not {kind!r}")
        cols["project"].append(item["project_id"])
        cols["session"].append(item.get("session_id"))
        cols["run"].append(item.get("run_id"))
        cols["type"].append(kind.name)
        cols["payload"].append(json.dumps(kind(**(item.get("payload") or {})), cls=DjangoJSONEncoder))
        cols["actor"].append(item.get("actor", ""))
    _check_ordered(cols["session"])
    with connection.cursor() as cur:
        cur.execute(_INSERT_MANY, {"n": len(items), **cols})
        ids = [row[0] for row in cur.fetchall()]
    wakeup = _current_wakeup()
    info = log.isEnabledFor(logging.INFO)
    for event_id, item, name in zip(ids, items, cols["type"]):
        line = (event_id, name, item["project_id"], item.get("session_id"), item.get("run_id"), item.get("actor", ""))
        wakeup.add(item["project_id"], event_id, line if info else None)
    return ids


# ---------------------------------------------------------------- readers
#: One reading of the watermark: (watermark, this transaction's xid or None).
Marks = tuple[int, int | None]


def read_marks() -> Marks:
    """The watermark and this transaction's xid (or None), in one statement.

    Pass one reading to several reads that must agree (``visible(qs, marks)``): "the highest
    visible id" and a page read under the same marks see the same prefix, so a reader may move
    its cursor to that id after a short page (``live.replay.settled_and_page``)."""
    with connection.cursor() as cur:
        cur.execute("SELECT nf_event_watermark(), pg_current_xact_id_if_assigned()::text::bigint")
        return cur.fetchone()


def watermark() -> int:
    """The smallest event id not yet safe to show: every visible id is below it.

    One statement (``nf_event_watermark()``, migration 0004). It must run BEFORE the read it
    guards (a later statement, so a later snapshot): whatever finished before the watermark
    was taken is in that read.
    """
    return read_marks()[0]


def visible(qs: QuerySet, marks: Marks | None = None) -> QuerySet:
    """``qs`` (of ``Event``) restricted to the commit-ordered prefix: ids below the watermark,
    plus the reader's own transaction's events when it has written some (as before: a
    transaction sees its own writes).

    Every reader that hands out a cursor (the websocket stream, ``GET /events``, "latest id")
    filters through here, so none can see id N and later find a committed id below N. (The
    live feed compiles its page statement once per process: ``project_page_statement`` takes
    the watermark as a parameter it reads first, the same rule.) ``marks``: a reading taken
    before (``read_marks``) instead of a new one.
    """
    mark, own = read_marks() if marks is None else marks
    if own is None:
        return qs.filter(id__lt=mark)
    return qs.filter(Q(id__lt=mark) | Q(id__gte=own << EVENT_ID_BITS, id__lt=(own + 1) << EVENT_ID_BITS))


#: The columns of one event as the live feed reads them (``serialize_values`` takes them in order).
FEED_COLUMNS = ("id", "project_id", "session_id", "run_id", "type", "payload", "actor", "created_at")
#: Placeholders of ``project_page_statement``'s parameters (never valid ids).
PROJECT_PARAM = -(2**62) - 7301
AFTER_PARAM = -(2**62) - 7302
WATERMARK_PARAM = -(2**62) - 7303
#: The statement a reader runs first, on its own: the watermark its page read is limited by.
WATERMARK_SQL = "SELECT nf_event_watermark()"


def project_page_statement(limit: int) -> tuple[str, list[Any]]:
    """Sync (compiles through Django, no query): ``events_after(Event.objects.filter(project_id=P),
    A, limit)`` as one SQL statement returning ``FEED_COLUMNS``, and its parameters, in which
    ``PROJECT_PARAM``, ``AFTER_PARAM`` and ``WATERMARK_PARAM`` stand for P, A and the watermark.

    ``visible()``'s rule for a reader with no transaction of its own (the feed reads in
    autocommit): ids below the watermark, which the reader takes with ``WATERMARK_SQL`` in a
    statement BEFORE this one (a later statement has a later snapshot, so everything that had
    finished when the watermark was taken is in the page). ``ValueError`` if a placeholder does
    not appear exactly once (then the caller reads through the ORM instead)."""
    qs = Event.objects.filter(project_id=PROJECT_PARAM, id__gt=AFTER_PARAM, id__lt=WATERMARK_PARAM).order_by("id")
    sql, params = qs.values_list(*FEED_COLUMNS)[:limit].query.sql_with_params()
    params = list(params)
    if any(params.count(p) != 1 for p in (PROJECT_PARAM, AFTER_PARAM, WATERMARK_PARAM)):
        raise ValueError(f"unexpected parameters in the event page statement: {params!r}")
    return sql, params


def events_after(qs: QuerySet, after: int, limit: int, marks: Marks | None = None) -> list[Event]:
    """Up to ``limit`` visible events of ``qs`` with ``id > after``, oldest first (keyset)."""
    return list(visible(qs.filter(id__gt=after), marks).order_by("id")[:limit])


def latest_visible_id(marks: Marks | None = None) -> int:
    """The highest visible event id (0 for an empty log): "from now on" for a new subscriber."""
    return visible(Event.objects.all(), marks).order_by("-id").values_list("id", flat=True).first() or 0


def serialize(event: Event) -> dict[str, Any]:
    return serialize_values(event.id, event.project_id, event.session_id, event.run_id, event.type, event.payload,
                            event.actor, event.created_at)


def serialize_values(id: int, project_id: int, session_id: int | None, run_id: int | None, type: str,
                     payload: Any, actor: str, created_at: datetime) -> dict[str, Any]:
    """``serialize`` from the columns (``FEED_COLUMNS`` order): the one shape of an event."""
    return {
        "id": id,
        "project_id": project_id,
        "session_id": session_id,
        "run_id": run_id,
        "type": type,
        "family": family_of(type),
        "payload": payload,
        "actor": actor,
        "created_at": created_at.astimezone(timezone.utc).isoformat(),
    }
