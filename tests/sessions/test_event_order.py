"""Commit-ordered event ids without a global lock (docs/model.md#events): no reader ever finds a gap.

A gap: a reader saw id N, and later finds a committed id below N (it would never replay it,
since cursors are "after N"). Real threads against PostgreSQL, transaction=True (each writer
commits for real; readers read in autocommit like the servers do).
"""
from __future__ import annotations

import random
import threading

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from novelforge_sessions import event_types as ev
from novelforge_sessions import events
from novelforge_sessions.control.checkpoints import record_checkpoint
from novelforge_sessions.models import Event, Session
from novelforge_sessions.live.replay import Subscription, events_after, latest_event_id, settled_and_page

from tests.support.factories import caller_for, make_project, running_session
from tests.support.races import oks, race

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def _append(project_id: int, session_id: int, n: int = 1) -> list[int]:
    return [
        events.append(project_id=project_id, session_id=session_id, type=ev.CHECKPOINT_RECORDED,
                      payload={"checkpoint_id": 0, "seq": i, "boundary": "context_freeze", "cursor": {}})
        for i in range(n)
    ]


def _read_all(sub: Subscription, after: int) -> list[int]:
    ids: list[int] = []
    while True:
        page = events_after(sub, after, 50)
        ids += [e["id"] for e in page]
        if len(page) < 50:
            return ids
        after = page[-1]["id"]


def test_an_older_open_transaction_holds_back_later_commits_until_it_ends():
    """The interleaving a serial id gets wrong: T1 takes its xid first and draws its event id
    last; T2 (another session: the two do not wait for each other) commits in between. A
    reader must not see T2's event before T1's is visible."""
    project = make_project("order")
    session_id = running_session(caller_for(project)).id
    other_id = running_session(caller_for(project)).id
    sub = Subscription(key=f"project:{project.id}", project_id=project.id, session_id=None)
    start = latest_event_id()
    t1_has_xid, t1_may_commit, t2_done, t1_drew = (threading.Event() for _ in range(4))
    ids: dict[str, list[int]] = {}

    def t1() -> None:
        try:
            with transaction.atomic():
                events.order_lock(session_id)
                Session.objects.filter(id=session_id).update(provider_metadata={"t": 1})  # first write: xid
                t1_has_xid.set()
                assert t2_done.wait(30)
                ids["t1"] = _append(project.id, session_id)  # drawn after T2's
                t1_drew.set()
                assert t1_may_commit.wait(30)
        finally:
            connection.close()

    def t2() -> None:
        try:
            assert t1_has_xid.wait(30)
            with transaction.atomic():
                events.order_lock(other_id)
                ids["t2"] = _append(project.id, other_id, 2)
        finally:
            t2_done.set()
            connection.close()

    threads = [threading.Thread(target=t1), threading.Thread(target=t2)]
    for t in threads:
        t.start()
    assert t2_done.wait(30)
    assert t1_drew.wait(30)  # T1 has drawn its id and is still open
    assert ids["t1"][0] < ids["t2"][0]  # ids follow the transactions, not the insert order
    seen_while_open = _read_all(sub, start)
    assert seen_while_open == []  # T2 committed, but below it T1 is still open
    assert latest_event_id() == start
    assert ids["t2"][-1] >= events.watermark()  # announced, not yet readable
    t1_may_commit.set()
    for t in threads:
        t.join()
    assert _read_all(sub, start) == ids["t1"] + ids["t2"]
    assert ids["t2"][-1] < events.watermark()


def test_a_rolled_back_transaction_releases_the_watermark():
    project = make_project("rollback")
    session_id = running_session(caller_for(project)).id
    sub = Subscription(key=f"project:{project.id}", project_id=project.id, session_id=None)
    start = latest_event_id()
    with pytest.raises(Boom):
        with transaction.atomic():
            events.order_lock(session_id)
            _append(project.id, session_id, 3)
            raise Boom
    with transaction.atomic():
        events.order_lock(session_id)
        kept = _append(project.id, session_id)
    assert _read_all(sub, start) == kept


def _raw_connection() -> psycopg.Connection:
    """Another backend of the test database (not a Django connection): a transaction held open."""
    db = connection.settings_dict
    return psycopg.connect(dbname=db["NAME"], host=db["HOST"] or None, port=db["PORT"] or None,
                           user=db["USER"] or None, password=db["PASSWORD"] or None)


def _take_xid(conn: psycopg.Connection) -> int:
    return int(conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0])


def test_the_watermark_stops_at_the_oldest_open_transaction_and_never_goes_back():
    """Two write transactions open at once. The newer one's xid is at or above the snapshot's
    xmax (the latest completed xid + 1); 0004's watermark widened it with an unsigned distance
    and came out hugely negative. The watermark must sit exactly at the oldest open xid, move
    only forward, and pass both once they end."""
    marks = [events.watermark()]
    with _raw_connection() as a, _raw_connection() as b:
        xa = _take_xid(a)
        marks.append(events.watermark())
        xb = _take_xid(b)
        assert xb > xa
        marks.append(events.watermark())
        assert marks[-1] == xa << events.EVENT_ID_BITS
        a.commit()
        marks.append(events.watermark())
        assert marks[-1] == xb << events.EVENT_ID_BITS
        b.rollback()
        marks.append(events.watermark())
        assert marks[-1] > xb << events.EVENT_ID_BITS
    assert marks == sorted(marks)


def test_committed_events_stay_visible_while_two_transactions_are_open():
    """What a subscriber saw when the watermark went negative: "the highest visible id" was 0
    (a new subscriber asking for "from now on" got the whole log) and the backlog page after
    its cursor was empty, after which the stream's catch-up moved the cursor past events it
    never sent (the harness's Redis-restart run found 77 missing)."""
    project = make_project("two-open")
    session_id = running_session(caller_for(project)).id
    sub = Subscription(key=f"project:{project.id}", project_id=project.id, session_id=None)
    start = latest_event_id()
    with transaction.atomic():
        events.order_lock(session_id)
        kept = _append(project.id, session_id, 2)
    with _raw_connection() as a, _raw_connection() as b:
        _take_xid(a)
        _take_xid(b)
        assert latest_event_id() == kept[-1]
        assert _read_all(sub, start) == kept
        # The stream's drain: "the highest visible id" and its page under ONE watermark
        # reading, so a short page never leaves out an id at or below the first.
        with CaptureQueriesContext(connection) as queries:
            settled, page = settled_and_page(sub, start)
        assert (settled, [e["id"] for e in page]) == (kept[-1], kept)
        assert sum("nf_event_watermark" in q["sql"] for q in queries.captured_queries) == 1
        a.rollback()
        b.rollback()


def test_no_gaps_under_concurrent_writers_and_readers():
    """Writers (real checkpoints through the action layer, plus transactions that take their
    xid early and draw event ids late, some rolled back) race readers that stream "after my
    cursor" the way the websocket does. Each reader records what it saw; afterwards: its ids
    strictly increase across reads (never an id below its high-water mark), and it saw every
    committed event exactly once (an id that appeared below the mark later would be missing)."""
    project = make_project("nogap")
    who = caller_for(project)
    writers, per_writer, readers = 6, 25, 3
    sessions_ = [running_session(who) for _ in range(writers)]
    run_ids = [s.runs.get(state="open").id for s in sessions_]
    sub = Subscription(key=f"project:{project.id}", project_id=project.id, session_id=None)
    start = latest_event_id()
    done = threading.Event()
    barrier = threading.Barrier(writers + readers)
    committed: list[list[int]] = [[] for _ in range(writers)]
    seen: list[list[list[int]]] = [[] for _ in range(readers)]
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        rng = random.Random(w)
        try:
            barrier.wait()
            for i in range(per_writer):
                shape = rng.choice(["checkpoint", "late", "late", "rollback"])
                if shape == "checkpoint":
                    record_checkpoint(who, run_ids[w], {"boundary": "context_freeze", "cursor": {"i": i, "w": w}})
                    committed[w].append(
                        Event.objects.filter(run_id=run_ids[w], type=ev.CHECKPOINT_RECORDED.name).order_by("-id")
                        .values_list("id", flat=True).first()
                    )
                    continue
                try:
                    with transaction.atomic():
                        events.order_lock(sessions_[w].id)
                        Session.objects.filter(id=sessions_[w].id).update(provider_metadata={"i": i})  # xid first
                        for _ in range(rng.randint(0, 3)):
                            Session.objects.filter(id=sessions_[w].id).values_list("id").first()  # widen the window
                        got = _append(project.id, sessions_[w].id, rng.randint(1, 3))
                        if shape == "rollback":
                            raise Boom
                    committed[w].extend(got)
                except Boom:
                    pass
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def reader(r: int) -> None:
        cursor = start
        try:
            barrier.wait()
            while True:
                last_round = done.is_set()
                got = _read_all(sub, cursor)
                seen[r].append(got)
                if got:
                    cursor = got[-1]
                if last_round:
                    return
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    reader_threads = [threading.Thread(target=reader, args=(r,)) for r in range(readers)]
    for t in threads + reader_threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    for t in reader_threads:
        t.join()
    assert not errors, errors
    all_committed = sorted(i for ids in committed for i in ids)
    assert len(all_committed) >= writers * per_writer // 2
    for r in range(readers):
        flat = [i for batch in seen[r] for i in batch]
        assert flat == sorted(set(flat)), f"reader {r} saw an id at or below its high-water mark later"
        assert flat == all_committed, f"reader {r} missed {sorted(set(all_committed) - set(flat))[:5]}"
        assert sum(1 for batch in seen[r] if batch) >= 2  # it really read while writers wrote


def test_a_sessions_events_follow_the_order_its_writers_held_it():
    """Causality, not only no gaps: ids carry the writing transaction's xid, and PostgreSQL may
    give a transaction its xid while it still queues for a contended row lock (several waiters
    on a row the holder updated: one wins with a later xid). Eight threads append to ONE
    session's transcript; each append numbers its entry under the session lock. Ordered by
    event id, the numbers must be 1..N: the session's ordering lock (an advisory lock, which
    queues without an xid) is what makes the xid follow the lock order."""
    from novelforge_sessions.actions.transcript import append_transcript

    project = make_project("causal")
    who = caller_for(project)
    session_id = running_session(who).id
    threads_n, per_thread = 8, 8

    def writer(_: int) -> None:
        for _ in range(per_thread):
            append_transcript(who, session_id, role="assistant", content="x")

    oks(race(writer, threads_n))
    seqs = list(
        Event.objects.filter(session_id=session_id, type=ev.TRANSCRIPT_APPENDED.name).order_by("id")
        .values_list("payload__seq", flat=True)
    )
    assert seqs == list(range(1, threads_n * per_thread + 1))


def test_the_suite_checks_the_ordering_rule_and_a_refused_write_stores_nothing():
    """``NOVELFORGE_EVENT_ORDER_CHECKS`` (on in the suite, tests/conftest.py): an ordering lock
    taken after the transaction's first write, or a session's event written without it, fails
    loudly, so a write path that forgets the rule cannot pass the suite."""
    project = make_project("rule")
    session_id = running_session(caller_for(project)).id
    before = Event.objects.count()
    with pytest.raises(AssertionError, match="after this transaction's first write"):
        with transaction.atomic():
            Session.objects.filter(id=session_id).update(provider_metadata={"late": True})
            events.order_lock(session_id)
    with pytest.raises(AssertionError, match="without their ordering lock"):
        with transaction.atomic():
            _append(project.id, session_id)
    assert Event.objects.count() == before
    assert Session.objects.get(id=session_id).provider_metadata != {"late": True}
    with transaction.atomic():  # the rule kept: lock, write, events
        events.order_lock(session_id)
        Session.objects.filter(id=session_id).update(provider_metadata={"kept": True})
        kept = _append(project.id, session_id)
    assert Event.objects.count() == before + 1 and Event.objects.filter(id__in=kept).exists()
