"""The log consumers' lag and the webhook deliveries in /metrics (docs/observability.md#what-is-exposed):
read from the cursors and rows the sender and the mailer really moved."""
from __future__ import annotations

import pytest

from novelforge_sessions.models import Event
from novelforge_sessions.notify import mailer
from novelforge_sessions.webhooks.sender import run_once
from tests.test_metrics import metrics_on, scrape, value  # noqa: F401  (metrics_on is a fixture)
from tests.webhooks.conftest import make_sessions, register

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_senders_lag_is_the_unread_events_and_their_age(metrics_on, project, manager, receiver, allow_private):
    series = scrape().get("novelforge_event_consumer_lag_seconds", [])
    assert not [labels for labels, _ in series if labels["consumer"] == "webhook_sender"], "never ran: no cursor, no series"
    run_once()
    mailer.run_once()
    samples = scrape()
    for consumer in ("webhook_sender", "mailer"):
        assert value(samples, "event_consumer_behind_events", consumer=consumer) == 0
        assert value(samples, "event_consumer_lag_seconds", consumer=consumer) == 0

    hook = register(manager, receiver.url, ["session.created"])
    receiver.secrets = [hook["secret"]]
    receiver.fail_first = 1
    before = Event.objects.count()
    make_sessions(manager, 2)
    made = Event.objects.count() - before
    samples = scrape()
    assert value(samples, "event_consumer_behind_events", consumer="webhook_sender") == made
    assert value(samples, "event_consumer_lag_seconds", consumer="webhook_sender") > 0
    assert value(samples, "event_consumer_behind_events", consumer="mailer") == made

    run_once()  # both attempts fail once (500): pending, waiting for their retry
    samples = scrape()
    assert value(samples, "event_consumer_behind_events", consumer="webhook_sender") == 0
    assert value(samples, "event_consumer_lag_seconds", consumer="webhook_sender") == 0
    assert value(samples, "event_consumer_behind_events", consumer="mailer") == made  # the mailer has not run
    assert value(samples, "webhook_deliveries", state="pending") == 2
    assert value(samples, "webhook_deliveries", state="delivered") == 0
    assert value(samples, "webhook_deliveries", state="failed") == 0
