"""A claim that loses its candidate's session to racing claimers tries the next session.

A claim picks the session of the oldest candidate, queues on that session's ordering lock,
then claims inside that session only (events.order_lock_candidate). Before, when the claimers
queued ahead of it took the session's last row, it answered "nothing to claim" although other
sessions still had eligible work (a note of an earlier stop). Each test holds the first
session's ordering lock from a connection of its own, lets two claimers queue on it (read from
pg_locks, never a sleep), then lets go: one takes that session's only row, and the other, which
lost it, must take the next session's.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import connection

from novelforge_sessions import events
from novelforge_sessions.actions.runs import start_run
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.sessions import NewSession, create_session
from novelforge_sessions.apikit.auth import caller_for_token
from novelforge_sessions.control import handoffs as actions
from novelforge_sessions.control.models import Handoff
from novelforge_sessions.models import Event
from reviews import actions as review_actions
from reviews.models import ReviewAssignment
from tests.support.factories import caller_for, make_project
from tests.support.servers import database_url
from tests.support.waits import wait_until
from tests.reviews.factories import RUBRIC, add_writer, agent_reviewer, citing, make_world, orchestrator

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def holding_ordering_lock(session_id: int) -> Iterator[psycopg.Connection]:
    with psycopg.connect(database_url()) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", [events.ORDER_LOCK_NS, events.order_lock_key(session_id)])
        yield conn
        conn.rollback()


def wait_for_waiters(session_id: int, count: int) -> None:
    with psycopg.connect(database_url(), autocommit=True) as conn:
        wait_until(lambda: conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s "
            "AND NOT granted", [events.ORDER_LOCK_NS, events.order_lock_key(session_id)]).fetchone()[0] >= count,
            f"{count} claimers to queue on session {session_id}'s ordering lock", timeout=30, interval=0.01)


def claim_while_queued(session_id: int, claims: list[Callable[[], Any]]) -> list[Any]:
    """Run ``claims`` in threads while the test holds ``session_id``'s ordering lock; let go once
    all of them queue on it; return their results (or exceptions)."""
    results: list[Any] = [None] * len(claims)

    def run(i: int) -> None:
        try:
            results[i] = claims[i]()
        except Exception as exc:  # asserted on below
            results[i] = exc
        finally:
            connection.close()

    with holding_ordering_lock(session_id):
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(claims))]
        for t in threads:
            t.start()
        wait_for_waiters(session_id, len(claims))
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return results


def test_a_job_claim_that_lost_its_session_takes_the_next_sessions_handoff():
    project = make_project("claim-retry")
    who = caller_for(project)
    handoffs = []
    for i in range(2):  # the first session's handoff is the older one: every claim picks it first
        s = create_session(who, NewSession("writer", "bounded", "drafting", "codex"), runtime=RuntimeSpec("codex"))
        run = start_run(who, s.id)
        handoffs.append(actions.create_handoff(who, run.id, logical_id=f"retry-{i}").handoff)
    first_session = handoffs[0].session_id

    results = claim_while_queued(first_session, [
        lambda n=n: actions.claim_handoff(who, worker=f"w{n}", capabilities=[]) for n in range(2)
    ])

    assert not [r for r in results if isinstance(r, Exception)], results
    assert None not in results, "a claim answered 'nothing to claim' while a handoff was pending"
    assert sorted(h.id for h in results) == sorted(h.id for h in handoffs)
    assert set(Handoff.objects.values_list("state", "attempt", "fencing_token")) == {("claimed", 1, 1)}
    assert Event.objects.filter(type="handoff.claimed").count() == 2


def test_a_claim_with_nothing_left_anywhere_still_answers_nothing():
    project = make_project("claim-none")
    who = caller_for(project)
    s = create_session(who, NewSession("writer", "bounded", "drafting", "codex"), runtime=RuntimeSpec("codex"))
    only = actions.create_handoff(who, start_run(who, s.id).id, logical_id="only").handoff

    results = claim_while_queued(s.id, [
        lambda n=n: actions.claim_handoff(who, worker=f"w{n}", capabilities=[]) for n in range(2)
    ])

    assert not [r for r in results if isinstance(r, Exception)], results
    assert sorted([r.id if r else 0 for r in results]) == [0, only.id]  # one claimed it, the other got nothing
    assert Event.objects.filter(type="handoff.claimed").count() == 1


def test_a_review_claim_that_lost_its_session_takes_the_next_sessions_slot(project):
    world = make_world(project)
    first = world.gate(route="agent", required_verdicts=1)
    writer2, raw2 = add_writer(project)
    caller2 = caller_for_token(raw2)
    start_run(orchestrator(project), writer2.id, cursor={"step": "draft"}, frozen_inputs=citing(world.version))
    second = review_actions.open_gate(caller2, writer2.id, review_actions.GateSpec(
        candidate_version_id=world.version.id, rubric=RUBRIC, route="agent", reviewers=[], required_verdicts=1))
    agents = [agent_reviewer(project)[1] for _ in range(2)]

    results = claim_while_queued(first.session_id, [lambda api=api: api.post("/review-packets/claim") for api in agents])

    assert [r.status_code for r in results] == [200, 200], results
    packets = [r.json()["packet"] for r in results]
    assert None not in packets, "a reviewer was told 'nothing to claim' while a slot was open"
    assert {p["id"] for p in packets} == {first.packet.id, second.packet.id}
    assert ReviewAssignment.objects.filter(state="assigned").count() == 2
    assert Event.objects.filter(type="review.packet_claimed").count() == 2



def test_more_claimers_than_any_fixed_number_of_tries_all_get_a_handoff():
    """Twelve claimers queue on the oldest session's lock, twelve sessions have one handoff
    each: the k-th claimer to get that lock loses k-1 sessions to the ones ahead of it, so a
    claim that gave up after a fixed number of tries (it was 8) answered "nothing to claim"
    with handoffs still pending. A claim now gives up only when no session it has not tried
    has a candidate."""
    project = make_project("claim-many")
    who = caller_for(project)
    handoffs = []
    for i in range(12):
        s = create_session(who, NewSession("writer", "bounded", "drafting", "codex"), runtime=RuntimeSpec("codex"))
        handoffs.append(actions.create_handoff(who, start_run(who, s.id).id, logical_id=f"many-{i}").handoff)

    results = claim_while_queued(handoffs[0].session_id, [
        lambda n=n: actions.claim_handoff(who, worker=f"w{n}", capabilities=[]) for n in range(12)
    ])

    assert not [r for r in results if isinstance(r, Exception)], results
    assert None not in results, f"{results.count(None)} claims answered 'nothing to claim' with handoffs pending"
    assert sorted(h.id for h in results) == sorted(h.id for h in handoffs)
    assert set(Handoff.objects.values_list("state", "attempt", "fencing_token")) == {("claimed", 1, 1)}
    assert Event.objects.filter(type="handoff.claimed").count() == 12
