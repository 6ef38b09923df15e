"""At-least-once delivery under real concurrency (docs/model.md#results-and-idempotent-delivery).

32 real threads, each with its own PostgreSQL connection, released together by a barrier and
kept alive across rounds (33 connections in all, far below ``max_connections``).
"""
from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from novelforge_sessions.access import Caller
from novelforge_sessions.control.handoffs import claim_handoff, create_handoff
from novelforge_sessions.control.results import deliver_result
from novelforge_sessions.actions.runs import start_run
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.sessions import NewSession, create_session
from novelforge_sessions.control.fingerprints import fingerprint
from novelforge_sessions.control.models import ConsumeReceipt, Handoff, ResultDelivery
from novelforge_sessions.errors import ServiceError
from novelforge_sessions.models import Event, Session
from tests.support.factories import caller_for, make_project

THREADS = 32
BARRIER_TIMEOUT = 60


def storm(who: Caller, rounds: int, setup: Callable[[int], Handoff], result_for: Callable[[int, int], dict],
          check: Callable[[int, Handoff, list[str]], None]) -> None:
    """Run ``rounds`` rounds: the main thread prepares a claimed handoff, then all threads
    deliver ``result_for(round, thread)`` to it at once; ``check`` sees every thread's outcome."""
    start = threading.Barrier(THREADS + 1, timeout=BARRIER_TIMEOUT)
    finish = threading.Barrier(THREADS + 1, timeout=BARRIER_TIMEOUT)
    current: dict[str, Any] = {}
    outcomes: list[str] = [""] * THREADS
    unexpected: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            for r in range(rounds):
                start.wait()
                h = current["handoff"]
                try:
                    outcomes[index] = deliver_result(
                        who, h.id, fencing_token=h.fencing_token, job_fingerprint=h.job_fingerprint,
                        result=result_for(r, index),
                    ).outcome
                except ServiceError as exc:
                    outcomes[index] = exc.code
                except BaseException as exc:  # anything else is a failure of the test
                    outcomes[index] = f"error: {exc!r}"
                    unexpected.append(exc)
                finish.wait()
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(THREADS)]
    for t in threads:
        t.start()
    completed = False
    try:
        for r in range(rounds):
            current["handoff"] = setup(r)
            start.wait()
            finish.wait()
            assert unexpected == [], unexpected
            check(r, current["handoff"], list(outcomes))
        completed = True
    finally:
        if not completed:
            # Release workers stuck at a barrier. Not after a clean run: workers may still be
            # draining the last trip, and an abort then would break their wait.
            for b in (start, finish):
                b.abort()
        for t in threads:
            t.join(timeout=BARRIER_TIMEOUT)


def waiting_handoff(who: Caller, logical_id: str) -> Handoff:
    """A running session whose open run handed off ``logical_id``, claimed by a worker."""
    s = create_session(who, NewSession("writer", "bounded", "drafting", "codex"), runtime=RuntimeSpec("codex"))
    run = start_run(who, s.id)
    create_handoff(who, run.id, logical_id=logical_id, result_schema={"text": "string"})
    return claim_handoff(who, worker="w", capabilities=[])


@pytest.mark.django_db(transaction=True)
def test_32_threads_deliver_the_same_result_exactly_one_receipt_over_20_rounds():
    project = make_project("storm-same")
    who = caller_for(project)
    rounds = 20

    def check(r: int, h: Handoff, outcomes: list[str]) -> None:
        assert Counter(outcomes) == {"consumed": 1, "already_consumed": THREADS - 1}, (r, Counter(outcomes))
        receipts = ConsumeReceipt.objects.filter(project=project, logical_id=h.logical_id)
        assert receipts.count() == 1
        assert receipts.get().result == {"text": f"round {r}"}
        assert ResultDelivery.objects.filter(handoff=h).count() == THREADS
        assert Handoff.objects.get(id=h.id).state == "bound"
        assert Session.objects.get(id=h.session_id).status == "running"
        # exactly one consumption event; duplicates add none
        assert Event.objects.filter(session_id=h.session_id, type="handoff.result_consumed").count() == 1

    storm(who, rounds, lambda r: waiting_handoff(who, f"same-{r}"), lambda r, i: {"text": f"round {r}"}, check)
    assert ConsumeReceipt.objects.filter(project=project).count() == rounds


@pytest.mark.django_db(transaction=True)
def test_32_threads_with_two_hashes_one_receipt_every_loser_conflicts_and_the_session_fails():
    project = make_project("storm-two")
    who = caller_for(project)
    payloads = ({"text": "version A"}, {"text": "version B"})
    rounds = 5

    def check(r: int, h: Handoff, outcomes: list[str]) -> None:
        receipt = ConsumeReceipt.objects.get(project=project, logical_id=h.logical_id)  # exactly one
        winner = 0 if receipt.result_hash == fingerprint(payloads[0]) else 1
        assert receipt.result == payloads[winner]  # the winner's payload, unchanged
        winners = [o for i, o in enumerate(outcomes) if i % 2 == winner]
        losers = [o for i, o in enumerate(outcomes) if i % 2 != winner]
        assert Counter(winners) == {"consumed": 1, "already_consumed": THREADS // 2 - 1}, Counter(winners)
        assert Counter(losers) == {"conflicting_result": THREADS // 2}, Counter(losers)
        session = Session.objects.get(id=h.session_id)
        assert session.status == "failed" and session.status_reason == f"conflicting_result: {h.logical_id}"
        assert Handoff.objects.get(id=h.id).state == "conflicted"
        conflict = Event.objects.filter(session_id=h.session_id, type="handoff.result_conflict")
        assert conflict.count() == 1
        assert conflict.get().payload["consumed_hash"] == receipt.result_hash
        assert Counter(ResultDelivery.objects.filter(handoff=h).values_list("outcome", flat=True)) == {
            "consumed": 1, "already_consumed": THREADS // 2 - 1, "conflicting_result": THREADS // 2}

    storm(who, rounds, lambda r: waiting_handoff(who, f"two-{r}"), lambda r, i: payloads[i % 2], check)
