"""Without Redis, other processes' commits wake a server's sockets through PostgreSQL NOTIFY:
one coalesced ``pg_notify`` per transaction after commit, one LISTEN per server
process (``live/pgnotify.py``) that forwards it to the in-memory layer and survives losing
its connection. The daphne here sweeps once an hour, so every delivery comes from a NOTIFY.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from novelforge_sessions import event_types as et
from novelforge_sessions import events
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.live.pgnotify import APPLICATION_NAME_PREFIX
from novelforge_sessions.models import Event, RuntimeAttachment, Session
from tests.support.factories import make_project, running_session
from tests.support.servers import ROOT, DaphneServer, database_url
from tests.live.conftest import REDIS_URL

pytestmark = pytest.mark.django_db(transaction=True)

#: "Within about a second" (the promise to an operator), measured from the other process's exit / commit.
WITHIN = 1.5
NO_SWEEP = {"LIVE_SWEEP_SECONDS": "3600"}


def _no_redis_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "LIVE_PG_NOTIFY"}}
    env["DATABASE_URL"] = database_url()
    return env


def _listen_conn() -> psycopg.Connection:
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    conn = psycopg.connect(autocommit=True, **params)
    conn.execute(f"LISTEN {events.NOTIFY_CHANNEL}")
    return conn


@pytest.fixture
def listener() -> Iterator[psycopg.Connection]:
    conn = _listen_conn()
    yield conn
    conn.close()


def _notifications(conn: psycopg.Connection, n: int) -> list[dict]:
    got = [json.loads(note.payload) for note in conn.notifies(timeout=10, stop_after=n)]
    assert len(got) == n, got
    return got


def _append(project_id: int, seq: int) -> int:
    return events.append(project_id=project_id, type=et.TRANSCRIPT_APPENDED, payload={"seq": seq, "role": "user"})


def test_one_transaction_with_many_events_sends_exactly_one_notify_after_commit(listener):
    a, b, marker = make_project("n-a"), make_project("n-b"), make_project("n-marker")
    with transaction.atomic():
        ids = [_append(a.id, i) for i in range(25)] + [_append(b.id, i) for i in range(5)]
        # Nothing is published inside the writing transaction.
        assert list(listener.notifies(timeout=0.05)) == []
    with transaction.atomic():
        marker_id = _append(marker.id, 0)
    first, second = _notifications(listener, 2)
    assert first == {"o": events.NOTIFY_ORIGIN, "p": [[a.id, ids[24]], [b.id, ids[-1]]]}
    assert second["p"] == [[marker.id, marker_id]], "exactly one NOTIFY for the 30-event transaction"


def test_a_rolled_back_transaction_notifies_nothing(listener):
    p, marker = make_project("rb"), make_project("rb-marker")
    with pytest.raises(RuntimeError), transaction.atomic():
        _append(p.id, 0)
        raise RuntimeError("rollback")
    with transaction.atomic():
        marker_id = _append(marker.id, 0)
    assert _notifications(listener, 1)[0]["p"] == [[marker.id, marker_id]]


def test_no_notify_with_redis_or_when_switched_off(listener, settings):
    p, marker = make_project("off"), make_project("off-marker")
    settings.LIVE_PG_NOTIFY = False
    with transaction.atomic():
        _append(p.id, 0)
    settings.LIVE_PG_NOTIFY = True
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                                           "CONFIG": {"hosts": [REDIS_URL]}}}
    with transaction.atomic():
        _append(p.id, 1)  # the Redis layer crosses processes itself
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    with transaction.atomic():
        marker_id = _append(marker.id, 0)
    assert _notifications(listener, 1)[0]["p"] == [[marker.id, marker_id]]


def test_the_setting_is_on_by_default_and_off_with_redis():
    code = "import django; django.setup(); from django.conf import settings; print(settings.LIVE_PG_NOTIFY)"
    env = {**_no_redis_env(), "DJANGO_SETTINGS_MODULE": "novelforge_sessions.settings"}
    out = [
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=e, capture_output=True, text=True, check=True).stdout.strip()
        for e in (env, {**env, "REDIS_URL": REDIS_URL}, {**env, "LIVE_PG_NOTIFY": "off"})
    ]
    assert out == ["True", "False", "False"]


def test_payloads_stay_under_postgresqls_limit():
    many = {pid: 10**12 + pid for pid in range(1, 2001)}
    payloads = events.notify_payloads(many)
    assert len(payloads) > 1 and all(len(p.encode()) < 8000 for p in payloads)
    assert [item for p in payloads for item in json.loads(p)["p"]] == [[k, v] for k, v in sorted(many.items())]


def test_the_reconcilers_events_reach_a_socket_on_the_server_within_a_second(ws_server, open_socket):
    """Another process (``manage.py reconcile_runtimes``) turns an expired runtime into
    failed / runtime_lost; the page's socket on daphne (sweep: 1 h) gets every event at once."""
    s = running_session("reconciled", task_mode="t")
    _, token = create_token(s.project, name="agent", permissions=ALL_PERMISSIONS)
    sock = open_socket(ws_server, token=token)
    assert sock.subscribe(project_id=s.project_id) == []
    cursor = Event.objects.filter(project_id=s.project_id).latest("id").id
    RuntimeAttachment.objects.filter(session_id=s.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    done = subprocess.run([sys.executable, "manage.py", "reconcile_runtimes"], cwd=ROOT, env=_no_redis_env(),
                          capture_output=True, text=True, timeout=60)
    exited = time.monotonic()
    assert done.returncode == 0 and f"session {s.id} lost; session is failed" in done.stdout, done.stdout + done.stderr
    assert Session.objects.get(id=s.id).status == "failed"
    written = list(Event.objects.filter(project_id=s.project_id, id__gt=cursor).order_by("id").values_list("id", flat=True))
    assert len(written) >= 2  # runtime.lost, the session's transition (and the run's end)

    got = sock.events_until(written[-1], timeout=WITHIN)
    assert time.monotonic() - exited < WITHIN
    assert [e["id"] for e in got] == written, "no gap, no duplicate, in order"
    assert {"runtime.lost", "session.transitioned"} <= {e["type"] for e in got}
    sock.send({"type": "ping"})
    assert sock.recv(timeout=WITHIN)["type"] == "pong", "nothing sent twice"


def _listener_backend(server: DaphneServer) -> int | None:
    with connection.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                    [f"{APPLICATION_NAME_PREFIX}{server.proc.pid}"])
        rows = cur.fetchall()
    assert len(rows) <= 1, "one listener per process"
    return rows[0][0] if rows else None


@pytest.fixture
def own_server() -> Iterator[DaphneServer]:
    srv = DaphneServer(extra_env=NO_SWEEP)
    yield srv
    srv.stop()


def test_the_listener_recovers_after_its_connection_is_killed(own_server, open_socket):
    project = make_project("killed")
    _, token = create_token(project, name="agent", permissions=ALL_PERMISSIONS)
    sock = open_socket(own_server, token=token)
    assert sock.subscribe(project_id=project.id) == []
    with transaction.atomic():
        first = _append(project.id, 0)  # committed by this (another) process
    assert [e["id"] for e in sock.events_until(first)] == [first]  # so the server LISTENs now
    old = _listener_backend(own_server)
    assert old is not None

    with connection.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", [old])
        assert cur.fetchone()[0] is True
    with transaction.atomic():
        during = _append(project.id, 1)  # its NOTIFY may find nobody listening: read after reconnect
    assert [e["id"] for e in sock.events_until(during)] == [during]
    new = _listener_backend(own_server)
    assert new is not None and new != old

    with transaction.atomic():
        later = _append(project.id, 2)
    committed = time.monotonic()
    assert [e["id"] for e in sock.events_until(later, timeout=WITHIN)] == [later]
    assert time.monotonic() - committed < WITHIN
    sock.send({"type": "ping"})
    assert sock.recv(timeout=WITHIN)["type"] == "pong", "nothing sent twice"
