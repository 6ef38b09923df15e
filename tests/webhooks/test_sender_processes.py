"""The sender as real processes against PostgreSQL (docs/webhooks.md#delivery): nothing is lost
across a SIGKILL and a restart, and two senders at once never make the same attempt twice."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from novelforge_sessions.webhooks.models import WebhookDelivery
from tests.support.servers import ROOT, database_url
from tests.support.waits import wait_until
from tests.webhooks.conftest import events_of, make_sessions, register

pytestmark = pytest.mark.django_db(transaction=True)


def sender(*args: str, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(DATABASE_URL=database_url(), DJANGO_SETTINGS_MODULE="novelforge_sessions.settings",
               SECRET_KEY=settings.SECRET_KEY, PYTHONUNBUFFERED="1", WEBHOOK_ALLOW_PRIVATE="true")
    return subprocess.Popen([sys.executable, "manage.py", "send_webhooks", *args], cwd=ROOT, env=env,
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def test_nothing_is_lost_across_a_sigkill_and_a_restart(project, manager, receiver, tmp_path, allow_private):
    hooks = [register(manager, receiver.url, ["session.created"]) for _ in range(2)]
    receiver.secrets = [h["secret"] for h in hooks]
    first_batch = make_sessions(manager, 4)
    receiver.hold.set()  # the first attempts hang: the sender is killed while they are in flight
    proc = sender("--loop", "--interval", "0.1", "--concurrency", "2", log=tmp_path / "sender.log")
    try:
        receiver.wait_for(2)  # one attempt in flight per endpoint, none answered
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    in_flight = WebhookDelivery.objects.filter(leased_until__isnull=False, state="pending").count()
    assert in_flight == 2, "the killed sender left its two attempts leased"
    assert not WebhookDelivery.objects.filter(state="delivered").exists()
    receiver.hold.clear()
    receiver.release.set()
    make_sessions(manager, 3)  # more events while no sender runs
    # The killed sender's leases would run out after WEBHOOK_TIMEOUT_SECONDS + 30 s: expire them now.
    WebhookDelivery.objects.filter(leased_until__isnull=False).update(leased_until=timezone.now() - timedelta(seconds=1))

    proc = sender("--loop", "--interval", "0.1", log=tmp_path / "sender.log")
    try:
        expected = events_of(project.id, types=("session.created",))
        assert len(expected) == 7 and len(first_batch) == 4
        wait_until(lambda: WebhookDelivery.objects.filter(state="delivered").count() == 2 * len(expected),
                   what="all delivered", timeout=60)
    finally:
        proc.terminate()
        proc.wait(10)
    rows = list(WebhookDelivery.objects.order_by("event_id", "endpoint_id"))
    assert [(r.endpoint_id, r.event_id) for r in rows] == [(h["id"], e.id) for e in expected for h in hooks], (
        "one delivery row per event and endpoint, none lost")
    assert all(r.state == "delivered" and r.delivered_at is not None for r in rows)
    got = receiver.by_id()
    assert set(got) == {r.webhook_id for r in rows}, "every event arrived"
    assert all(any(t.status == 200 and t.verified_by for t in got[r.webhook_id]) for r in rows)
    resent = [r for r in rows if len(got[r.webhook_id]) > 1]
    assert len(resent) == 2 and all(r.attempts == 2 for r in resent), "only the two in flight were sent again"
    assert sum(r.attempts for r in rows) == len(receiver.received)


def test_two_senders_at_once_never_double_an_attempt(project, manager, receiver, tmp_path, allow_private):
    hooks = [register(manager, receiver.url, ["*"]) for _ in range(2)]
    receiver.secrets = [h["secret"] for h in hooks]
    make_sessions(manager, 30)
    receiver.delay = 0.05  # each pass takes a while: the two processes' claims overlap
    procs = [sender("--once", "--concurrency", "4", log=tmp_path / f"sender{i}.log") for i in range(2)]
    for proc in procs:
        assert proc.wait(120) == 0, (tmp_path / "sender0.log").read_text() + (tmp_path / "sender1.log").read_text()
    expected = 2 * len(events_of(project.id, after=min(
        d.endpoint.start_after_event_id for d in WebhookDelivery.objects.select_related("endpoint"))))
    rows = list(WebhookDelivery.objects.all())
    assert len(rows) == expected == 60
    assert {(r.state, r.attempts) for r in rows} == {("delivered", 1)}
    counts = receiver.counts()
    assert len(counts) == expected and set(counts.values()) == {1}, "each delivery sent exactly once"
    assert all(r.verified_by for r in receiver.received)
    # Both processes did some of the work (each prints what it sent).
    outputs = [(tmp_path / f"sender{i}.log").read_text() for i in range(2)]
    assert sum(int(o.split(" attempts")[0].split()[-1]) for o in outputs if " attempts" in o) == expected
