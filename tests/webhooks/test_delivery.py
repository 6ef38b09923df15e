"""Delivery from the event log to a real loopback receiver that verifies every signature
(docs/webhooks.md#delivery): every subscribed event arrives, retries keep their ``webhook-id``,
the backoff schedule, giving up after the window, secret rotation, private addresses."""
from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from novelforge_sessions import events
from novelforge_sessions.webhooks import sender
from novelforge_sessions.webhooks.models import WebhookDelivery, WebhookEndpoint
from novelforge_sessions.webhooks.sender import BACKOFF_BASE_SECONDS, JITTER, backoff_seconds, run_once
from tests.support.factories import make_project
from tests.support.waits import wait_until
from tests.webhooks.conftest import events_of, make_sessions, register

pytestmark = pytest.mark.django_db(transaction=True)


def expire_retries() -> int:
    """Make every pending retry due now (instead of waiting out its backoff)."""
    return WebhookDelivery.objects.filter(state="pending").update(next_attempt_at=timezone.now() - timedelta(seconds=1))


def test_backoff_doubles_from_the_base_with_bounded_jitter_and_a_cap():
    assert [backoff_seconds(n, 0.0) for n in (1, 2, 3, 4)] == [5.0, 10.0, 20.0, 40.0]
    assert backoff_seconds(1, 0.999) == pytest.approx(BACKOFF_BASE_SECONDS * (1 + JITTER * 0.999))
    assert backoff_seconds(40, 0.0) == sender.BACKOFF_MAX_SECONDS
    assert backoff_seconds(40, 0.999) < sender.BACKOFF_MAX_SECONDS * (1 + JITTER)
    # Within the 24-hour window a failing delivery is tried a bounded number of times.
    total, attempts = 0.0, 0
    while total <= 24 * 3600:
        attempts += 1
        total += backoff_seconds(attempts, 0.0)
    assert 25 <= attempts <= 40


def test_every_subscribed_event_arrives_signed_and_each_retry_keeps_its_webhook_id(project, manager, receiver, allow_private):
    make_sessions(manager, 1)  # before registration: never delivered
    everything = register(manager, receiver.url, ["*"])
    created_only = register(manager, receiver.url, ["session.created"])
    receiver.secrets = [everything["secret"], created_only["secret"]]
    receiver.fail_first = 2
    start = WebhookEndpoint.objects.get(id=everything["id"]).start_after_event_id
    other = make_project("elsewhere")
    make_sessions(manager, 3)
    with_other = events_of(other.id)
    subscribed_all = events_of(project.id, after=start)
    subscribed_created = [e for e in subscribed_all if e.type == "session.created"]
    assert len(subscribed_created) == 3 and not with_other

    # Attempt 1 fails (500): each delivery waits its first backoff.
    counts = run_once()
    expected = len(subscribed_all) + len(subscribed_created)
    assert counts["attempts"] == expected and counts["delivered"] == 0
    rows = list(WebhookDelivery.objects.all())
    assert len(rows) == expected
    for row in rows:
        wait = (row.next_attempt_at - row.last_attempt_at).total_seconds()
        assert row.attempts == 1 and row.state == "pending" and row.last_status == 500
        assert 5.0 <= wait <= 5.0 * (1 + JITTER) + 0.5, wait
    assert run_once()["attempts"] == 0, "nothing is due before its backoff"

    # Attempt 2 fails too: the second wait doubles.
    expire_retries()
    assert run_once()["attempts"] == expected
    for row in WebhookDelivery.objects.all():
        wait = (row.next_attempt_at - row.last_attempt_at).total_seconds()
        assert row.attempts == 2 and 10.0 <= wait <= 10.0 * (1 + JITTER) + 0.5, wait

    # Attempt 3 is answered 200: delivered, and never sent again.
    expire_retries()
    assert run_once()["delivered"] == expected
    assert set(WebhookDelivery.objects.values_list("state", "attempts")) == {("delivered", 3)}
    expire_retries()
    assert run_once()["attempts"] == 0

    by_id = receiver.by_id()
    assert len(by_id) == expected and all(len(tries) == 3 for tries in by_id.values())
    for endpoint, secret, wanted in ((everything, everything["secret"], subscribed_all),
                                     (created_only, created_only["secret"], subscribed_created)):
        got = {}
        for wid, tries in by_id.items():
            if secret in tries[0].verified_by:
                assert all(t.verified_by == [secret] for t in tries), "each delivery is signed with its endpoint's secret only"
                assert len({t.body for t in tries}) == 1, "every retry sends the same body"
                got[tries[0].json["data"]["id"]] = tries[0]
        assert sorted(got) == [e.id for e in wanted]
        for event in wanted:
            body = got[event.id].json
            assert body == {"type": event.type, "timestamp": body["data"]["created_at"], "data": events.serialize(event)}
    # The API shows the attempts: status, latency, no next retry once delivered.
    detail = manager.get(f"/webhooks/{created_only['id']}").json()
    assert len(detail["recent_deliveries"]) == 3
    assert all(d["state"] == "delivered" and d["last_status"] == 200 and d["next_attempt_at"] is None
               and d["last_latency_ms"] is not None for d in detail["recent_deliveries"])


def test_a_delivery_that_keeps_failing_is_failed_after_its_window_and_redelivered_on_demand(project, manager, receiver,
                                                                                            allow_private):
    hook = register(manager, receiver.url, ["session.created"])
    receiver.secrets = [hook["secret"]]
    receiver.fail_first = 1
    make_sessions(manager, 1)
    run_once()
    row = WebhookDelivery.objects.get()
    assert row.state == "pending" and row.attempts == 1
    WebhookDelivery.objects.update(expires_at=timezone.now() + timedelta(seconds=1))  # the 24 h are nearly over
    receiver.fail_first = 99
    expire_retries()
    run_once()
    row.refresh_from_db()
    assert row.state == "failed" and row.attempts == 2 and row.last_status == 500
    expire_retries()
    assert run_once()["attempts"] == 0, "a failed delivery is not retried by itself"

    receiver.fail_first = 0
    resp = manager.post(f"/webhooks/{hook['id']}/deliveries/{row.id}/redeliver")
    assert resp.status_code == 200 and resp.json()["state"] == "pending", resp.content
    assert run_once()["delivered"] == 1
    row.refresh_from_db()
    assert row.state == "delivered" and row.attempts == 3
    assert run_once()["attempts"] == 0, "a delivered one is not sent again by itself"
    # A delivered one is redelivered on request (a receiver that lost it): a new delivery of the
    # same event with the same webhook-id; the delivered one stays as it was.
    again = manager.post(f"/webhooks/{hook['id']}/deliveries/{row.id}/redeliver")
    assert again.status_code == 200, again.content
    repeat = again.json()
    assert repeat["state"] == "pending" and repeat["id"] != row.id
    assert repeat["webhook_id"] == row.webhook_id and repeat["event_id"] == row.event_id
    assert run_once()["delivered"] == 1
    row.refresh_from_db()
    assert row.state == "delivered" and row.attempts == 3
    assert WebhookDelivery.objects.get(id=repeat["id"]).state == "delivered"
    assert run_once()["attempts"] == 0
    assert len({r.webhook_id for r in receiver.received}) == 1 and len(receiver.received) == 4


def test_after_a_rotation_both_secrets_sign_until_the_overlap_ends(project, manager, receiver, allow_private):
    hook = register(manager, receiver.url, ["session.created"])
    old = hook["secret"]
    rotated = manager.post(f"/webhooks/{hook['id']}/rotate")
    assert rotated.status_code == 200, rotated.content
    new = rotated.json()["secret"]
    assert new != old and new.startswith("whsec_") and rotated.json()["previous_secret_expires_at"]
    assert "secret" not in manager.get(f"/webhooks/{hook['id']}").json(), "the secret is shown once"
    receiver.secrets = [old, new]
    make_sessions(manager, 1)
    assert run_once()["delivered"] == 1
    first = receiver.received[-1]
    assert len(first.headers["webhook-signature"].split(" ")) == 2
    assert first.verified_by == [old, new], "during the overlap a receiver with either secret verifies"

    WebhookEndpoint.objects.update(previous_secret_expires_at=timezone.now() - timedelta(seconds=1))
    make_sessions(manager, 1)
    assert run_once()["delivered"] == 1
    second = receiver.received[-1]
    assert len(second.headers["webhook-signature"].split(" ")) == 1
    assert second.verified_by == [new], "after the overlap only the new secret verifies"


def test_an_endpoint_on_a_private_address_is_refused_at_delivery_too(project, manager, receiver, settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    hook = register(manager, receiver.url, ["*"])
    settings.WEBHOOK_ALLOW_PRIVATE = False  # the setting was turned off since
    receiver.secrets = [hook["secret"]]
    make_sessions(manager, 1)
    counts = run_once()
    assert counts["attempts"] >= 1 and counts["delivered"] == 0
    assert not receiver.received, "no request left for a private address"
    row = WebhookDelivery.objects.first()
    assert row.state == "pending" and row.last_error.startswith("refused:") and "private" in row.last_error


def test_an_inactive_endpoint_gets_no_deliveries(project, manager, receiver, allow_private):
    hook = register(manager, receiver.url, ["*"])
    resp = manager.post(f"/webhooks/{hook['id']}/active", {"active": False})
    assert resp.status_code == 200 and resp.json()["active"] is False
    make_sessions(manager, 2)
    assert run_once()["attempts"] == 0
    assert not WebhookDelivery.objects.exists() and not receiver.received


def test_an_attempt_in_flight_is_claimed_by_no_other_sender_until_its_lease_runs_out(project, manager, receiver,
                                                                                     allow_private):
    hook = register(manager, receiver.url, ["session.created"])
    receiver.secrets = [hook["secret"]]
    make_sessions(manager, 3)
    sender.scan()
    first = sender.claim(10)
    oldest = WebhookDelivery.objects.order_by("event_id").first()
    assert [(c.delivery_id, c.attempts) for c in first] == [(oldest.id, 1)], "one attempt per endpoint in flight, the oldest"
    assert sender.claim(10) == [], "a second sender finds nothing to claim while the attempt is in flight"
    # A sender that died mid-attempt: its lease runs out, and the attempt is made again.
    WebhookDelivery.objects.filter(id=first[0].delivery_id).update(leased_until=timezone.now() - timedelta(seconds=1))
    again = sender.claim(10)
    assert [(c.delivery_id, c.attempts, c.webhook_id) for c in again] == [(first[0].delivery_id, 2, first[0].webhook_id)]
    # The first sender's late answer no longer counts; the lease holder's does, once.
    assert sender.record(first[0], sender.Outcome(True, 200, 1)) is None
    assert sender.record(again[0], sender.Outcome(True, 200, 1)) == "delivered"
    assert sender.record(again[0], sender.Outcome(True, 200, 1)) is None, "recorded delivered exactly once"
    assert WebhookDelivery.objects.get(id=first[0].delivery_id).state == "delivered"
    following = sender.claim(10)
    assert len(following) == 1 and following[0].delivery_id != first[0].delivery_id, "then the endpoint's next one"


def test_a_hanging_endpoint_holds_one_slot_and_never_delays_the_others(project, manager, allow_private):
    from django.db import connection

    from tests.webhooks.receiver import Receiver

    slow, fast = Receiver().start(), Receiver().start()
    try:
        slow_hook = register(manager, slow.url, ["session.created"])
        fast_hook = register(manager, fast.url, ["session.created"])
        slow.secrets, fast.secrets = [slow_hook["secret"]], [fast_hook["secret"]]
        slow.hold.set()  # answers nothing until released
        make_sessions(manager, 3)
        result: dict = {}

        def send() -> None:
            try:
                result["counts"] = run_once(concurrency=3)
            finally:
                connection.close()

        worker = threading.Thread(target=send)
        worker.start()
        # The fast endpoint gets all three while the slow one still holds its requests.
        fast.wait_for(3)
        assert not slow.release.is_set() and len(slow.received) >= 1
        fast_rows = WebhookDelivery.objects.filter(endpoint_id=fast_hook["id"])
        wait_until(lambda: fast_rows.filter(state="delivered").count() >= 3,
                   "the fast endpoint's deliveries to be recorded", timeout=30)
        assert WebhookDelivery.objects.filter(endpoint_id=slow_hook["id"], state="delivered").count() == 0
        slow.release.set()
        worker.join(60)
        assert result["counts"]["delivered"] == 6
    finally:
        slow.stop()
        fast.stop()
