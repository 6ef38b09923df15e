"""The "handoff waiting longer than N" notice (docs/webhooks.md#event-types): one
``handoff.waiting_long`` event per handoff still waiting past ``HANDOFF_LONG_WAIT_SECONDS``,
written once however many senders run, and delivered to an endpoint that subscribed to it."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from novelforge_sessions.control.long_waits import notice_long_waits
from novelforge_sessions.control.models import Handoff
from novelforge_sessions.models import Event
from novelforge_sessions.webhooks.sender import run_once
from tests.control.conftest import claim, make_handoff
from tests.support.races import race
from tests.webhooks.conftest import register

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 900


def waiting_handoff(owner, new_session, logical_id: str, waited: int) -> dict:
    """A handoff of a new running session, created ``waited`` seconds ago."""
    session = new_session(run=True)
    handoff = make_handoff(owner, session["run"]["id"], logical_id, timeout_seconds=60)
    Handoff.objects.filter(id=handoff["id"]).update(created_at=timezone.now() - timedelta(seconds=waited))
    return handoff


def long_waits() -> list[Event]:
    return list(Event.objects.filter(type="handoff.waiting_long").order_by("id"))


def test_a_handoff_waiting_past_the_limit_gets_one_event_and_a_younger_one_none(owner, new_session):
    claimed = waiting_handoff(owner, new_session, "claimed-job", LIMIT + 60)
    old = waiting_handoff(owner, new_session, "old-job", LIMIT + 5)
    young = waiting_handoff(owner, new_session, "young-job", LIMIT - 60)
    assert claim(owner, worker="w1")["id"] == claimed["id"]  # the first made; claimed: still waiting for its result

    assert notice_long_waits(LIMIT) == 2
    found = long_waits()
    assert [e.payload["handoff_id"] for e in found] == [claimed["id"], old["id"]]  # oldest first
    first = found[1]
    assert first.payload["logical_id"] == "old-job" and first.payload["threshold_seconds"] == LIMIT
    assert first.payload["waited_seconds"] >= LIMIT + 5 and first.payload["state"] == "pending"
    assert found[0].payload["state"] == "claimed"
    assert first.session_id is not None and first.actor == "system:long-wait"
    assert young["id"] not in {e.payload["handoff_id"] for e in found}

    # Once per handoff; off with 0.
    assert notice_long_waits(LIMIT) == 0 and len(long_waits()) == 2
    Handoff.objects.filter(id=young["id"]).update(created_at=timezone.now() - timedelta(seconds=LIMIT + 1))
    assert notice_long_waits(0) == 0 and len(long_waits()) == 2
    assert notice_long_waits(LIMIT) == 1 and len(long_waits()) == 3


def test_several_senders_at_once_write_one_event_per_handoff(owner, new_session):
    ids = {waiting_handoff(owner, new_session, f"job-{i}", LIMIT + 10)["id"] for i in range(3)}
    outcomes = race(lambda i: notice_long_waits(LIMIT), n=4)
    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    assert sum(n for _, n in outcomes) == 3
    assert sorted(e.payload["handoff_id"] for e in long_waits()) == sorted(ids)


def test_an_endpoint_subscribed_to_long_waits_receives_it(owner, new_session, manager, receiver, allow_private):
    hook = register(manager, receiver.url, ["handoff.waiting_long"])
    receiver.secrets = [hook["secret"]]
    handoff = waiting_handoff(owner, new_session, "slow-job", LIMIT + 1)
    assert run_once()["attempts"] == 0  # handoff.created and the rest are not subscribed
    assert notice_long_waits(LIMIT) == 1
    assert run_once()["delivered"] == 1
    [got] = receiver.received
    assert got.verified_by == [hook["secret"]]
    assert got.json["type"] == "handoff.waiting_long" and got.json["data"]["payload"]["handoff_id"] == handoff["id"]
