"""Commit-ordered event ids: no reader ever finds a gap (issue 13).

A gap: a reader saw id N, and later finds a committed id below N (it would never replay it,
since cursors are "after N"). Real threads against PostgreSQL, transaction=True (each writer
commits for real; readers read in autocommit like the servers do).
"""
from __future__ import annotations

import random
import threading

import pytest
from django.db import connection, transaction

from novelforge_sessions import event_types as ev
from novelforge_sessions import events
from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.control.checkpoints import record_checkpoint
from novelforge_sessions.models import Event, Session
from novelforge_sessions.live.replay import Subscription, events_after, latest_event_id

from tests.conftest import caller_for, make_project

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def _append(project_id: int, session_id: int, n: int = 1) -> list[int]:
    return [
        events.append(project_id=project_id, session_id=session_id, type=ev.CHECKPOINT_RECORDED,
                      payload={"checkpoint_id": 0, "seq": i, "boundary": "context_freeze", "cursor": {}})
        for i in range(n)
    ]


def _running_session(who) -> Session:
    s = sessions.create_session(
        who, sessions.NewSession(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli"),
        runtime=RuntimeSpec(runtime_family="cli"),
    )
    runs.start_run(who, s.id, cursor={"step": 0})
    return Session.objects.get(id=s.id)


def _read_all(sub: Subscription, after: int) -> list[int]:
    ids: list[int] = []
    while True:
        page = events_after(sub, after, 50)
        ids += [e["id"] for e in page]
        if len(page) < 50:
            return ids
        after = page[-1]["id"]


def test_an_open_event_writer_holds_back_later_writers_until_it_ends():
    """The interleaving a bare serial id gets wrong: T1 has drawn its event id and is still open
    when T2 appends. T2 must not commit an id a reader could see before T1's."""
    project = make_project("order")
    session_id = _running_session(caller_for(project)).id
    sub = Subscription(key=f"project:{project.id}", project_id=project.id, session_id=None)
    start = latest_event_id()
    t1_drew, t1_may_commit, t2_started = (threading.Event() for _ in range(3))
    ids: dict[str, list[int]] = {}

    def t1() -> None:
        try:
            with transaction.atomic():
                ids["t1"] = _append(project.id, session_id)
                t1_drew.set()
                assert t1_may_commit.wait(30)
        finally:
            connection.close()

    def t2() -> None:
        try:
            assert t1_drew.wait(30)
            t2_started.set()
            with transaction.atomic():
                ids["t2"] = _append(project.id, session_id, 2)
        finally:
            connection.close()

    threads = [threading.Thread(target=t1), threading.Thread(target=t2)]
    for t in threads:
        t.start()
    assert t2_started.wait(30)
    assert _read_all(sub, start) == []  # T1 open: nothing of T1 or T2 is visible yet
    t1_may_commit.set()
    for t in threads:
        t.join()
    assert ids["t1"][0] < ids["t2"][0]
    assert _read_all(sub, start) == ids["t1"] + ids["t2"]


def test_a_rolled_back_transaction_leaves_no_hole_a_reader_waits_on():
    project = make_project("rollback")
    session_id = _running_session(caller_for(project)).id
    sub = Subscription(key=f"project:{project.id}", project_id=project.id, session_id=None)
    start = latest_event_id()
    with pytest.raises(Boom):
        with transaction.atomic():
            _append(project.id, session_id, 3)
            raise Boom
    with transaction.atomic():
        kept = _append(project.id, session_id)
    assert _read_all(sub, start) == kept


def test_no_gaps_under_concurrent_writers_and_readers():
    """Writers (real checkpoints through the action layer, plus transactions that take their
    xid early and draw event ids late, some rolled back) race readers that stream "after my
    cursor" the way the websocket does. Each reader records what it saw; afterwards: its ids
    strictly increase across reads (never an id below its high-water mark), and it saw every
    committed event exactly once (an id that appeared below the mark later would be missing)."""
    project = make_project("nogap")
    who = caller_for(project)
    writers, per_writer, readers = 6, 25, 3
    sessions_ = [_running_session(who) for _ in range(writers)]
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
