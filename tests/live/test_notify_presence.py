"""Without Redis, a server process NOTIFYs only when another process listens.

``live/pgnotify.py``: the listeners announce themselves (a hello after LISTEN, an answer from
each listener that hears it), and a process whose listener knows no other listener sends no
NOTIFY after its commits: its own sockets are woken directly, and the NOTIFY would only come
back to itself. These tests run real daphnes on a database of their own (so that no other
test's server counts as a listener), watch the channel with a plain LISTEN connection (which
no server counts: it is not named as a listener), and tell "a commit sent a NOTIFY" from "it
did not" by a marker NOTIFY sent after the commit's response: PostgreSQL delivers
notifications in commit order, and a server sends its NOTIFY before it answers.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings

from novelforge_sessions import events
from novelforge_sessions.live.pgnotify import APPLICATION_NAME_PREFIX
from novelforge_sessions.models import Event
from tests.support.factories import SESSION
from tests.support.servers import ROOT, DaphneServer, database_url
from tests.live.conftest import api_post

#: "Within about a second", as in test_pg_notify.py.
WITHIN = 1.5
#: How long a condition that depends on another process may take to come true here.
SETTLE = 20.0

_SETUP = """
import json, django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.models import Project
p = Project.objects.create(slug="presence", name="Presence", lock_fingerprint="sha256:" + "a" * 64, framework_version="1")
_, raw = create_token(p, name="agent", permissions=ALL_PERMISSIONS)
print(json.dumps({"project_id": p.id, "token": raw}))
"""


class World:
    def __init__(self, url: str, project_id: int, token: str) -> None:
        self.url, self.project_id, self.token = url, project_id, token
        self.env = {"DATABASE_URL": url, "LIVE_SWEEP_SECONDS": "3600"}

    def connect(self, **kw: Any) -> psycopg.Connection:
        return psycopg.connect(self.url, autocommit=True, **kw)

    def latest_event_id(self) -> int:
        with self.connect() as conn:
            return conn.execute(
                f"SELECT max(id) FROM {Event._meta.db_table} WHERE project_id = %s", [self.project_id]
            ).fetchone()[0]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    db = settings.DATABASES["default"]
    name = f"nf_presence_{uuid.uuid4().hex[:10]}"
    maintenance = database_url().rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = database_url().rsplit("/", 1)[0] + f"/{name}"
    try:
        env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL"}}
        env.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="novelforge_sessions.settings",
                   SECRET_KEY=settings.SECRET_KEY, PYTHONPATH=str(ROOT))
        done = subprocess.run([sys.executable, "-c", _SETUP], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        made = json.loads(done.stdout.strip().splitlines()[-1])
        yield World(url, made["project_id"], made["token"])
    finally:
        assert db["NAME"] != name
        with psycopg.connect(maintenance, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Channel:
    """A plain LISTEN on the wake-up channel: sees every NOTIFY, is counted by no server."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.conn = world.connect()
        self.conn.execute(f"LISTEN {events.NOTIFY_CHANNEL}")
        self.markers = 0
        self.pending: list[dict[str, Any]] = []  # received, not yet looked at

    def until(self, wanted, timeout: float = SETTLE) -> list[dict[str, Any]]:
        """Notifications up to and including the first that ``wanted`` accepts."""
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            while self.pending:
                seen.append(self.pending.pop(0))
                if wanted(seen[-1]):
                    return seen
            if time.monotonic() >= deadline:
                raise AssertionError(f"not seen within {timeout} s; saw {seen}")
            # Read the generator to its end: one packet may carry several notifications, and
            # leaving it early would drop the rest.
            self.pending.extend(
                json.loads(note.payload)
                for note in self.conn.notifies(timeout=max(deadline - time.monotonic(), 0.01), stop_after=1)
            )

    def after(self, write) -> list[dict[str, Any]]:
        """Run ``write`` (it returns once its commit is answered), then a marker NOTIFY; every
        notification before the marker (a wake-up for project 0, which no server has)."""
        self.markers += 1
        marker = f"test-marker-{self.markers}"
        write()
        with self.world.connect() as conn:
            conn.execute("SELECT pg_notify(%s, %s)", [events.NOTIFY_CHANNEL, json.dumps({"o": marker, "p": [[0, 0]]})])
        return self.until(lambda m: m.get("o") == marker)[:-1]

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def channel(world) -> Iterator[Channel]:
    ch = Channel(world)
    yield ch
    ch.close()


@pytest.fixture
def servers() -> Iterator[list[DaphneServer]]:
    started: list[DaphneServer] = []
    yield started
    for srv in started:
        srv.stop()


def _wakeups_from(notes: list[dict[str, Any]], origin: str) -> list[dict[str, Any]]:
    return [m for m in notes if m.get("o") == origin and "p" in m]


def _hello(channel: Channel, but: set[str] = frozenset()) -> str:
    return channel.until(lambda m: m.get("hello") == 1 and m["o"] not in but)[-1]["o"]


def test_a_lone_server_sends_no_notify_until_another_listens_then_both_wake_each_other(
    world, channel, servers, open_socket,
):
    a = DaphneServer(extra_env=world.env)
    servers.append(a)
    sock_a = open_socket(a, token=world.token)
    sock_a.subscribe(project_id=world.project_id)  # a's first socket starts its listener
    origin_a = _hello(channel)

    def write_a() -> None:
        api_post(a, world.token, "/sessions", SESSION)

    # a counted no other listener: right after its hello it stops sending NOTIFY.
    deadline = time.monotonic() + SETTLE
    while _wakeups_from(channel.after(write_a), origin_a):
        assert time.monotonic() < deadline, "a lone server kept sending NOTIFY"
    for _ in range(3):
        assert _wakeups_from(channel.after(write_a), origin_a) == [], "a lone server sent a NOTIFY"
        latest = world.latest_event_id()
        assert sock_a.events_until(latest, timeout=WITHIN)[-1]["id"] == latest, "its own socket still hears it"

    # b starts and listens: a hears b's hello, and answers only once it NOTIFYs again.
    b = DaphneServer(extra_env=world.env)
    servers.append(b)
    sock_b = open_socket(b, token=world.token)
    assert sock_b.subscribe(project_id=world.project_id) == []
    origin_b = _hello(channel, but={origin_a})
    channel.until(lambda m: m.get("here") == 1 and m["o"] == origin_a)

    notes = channel.after(write_a)
    written = world.latest_event_id()
    assert [item[0] for m in _wakeups_from(notes, origin_a) for item in m["p"]] == [world.project_id]
    committed = time.monotonic()
    assert sock_b.events_until(written, timeout=WITHIN)[-1]["id"] == written, "b's socket woken by a's NOTIFY"
    assert time.monotonic() - committed < WITHIN

    notes = channel.after(lambda: api_post(b, world.token, "/sessions", SESSION))
    written = world.latest_event_id()
    assert _wakeups_from(notes, origin_b), "b knows a listens (a answered), so b NOTIFYs"
    assert sock_a.events_until(written, timeout=WITHIN)[-1]["id"] == written


def test_a_counted_listener_that_never_answers_keeps_notify_on_until_its_connection_is_gone(
    world, channel, servers, open_socket,
):
    """A round that ends without an answer from every listener counted (a slow process, or a
    connection about to go) keeps NOTIFY on; the sweep's count turns it off once the silent
    listener's connection is gone, and then too when the other process stops."""
    silent = world.connect(application_name=f"{APPLICATION_NAME_PREFIX}999999999")
    silent.execute(f"LISTEN {events.NOTIFY_CHANNEL}")
    try:
        a = DaphneServer(extra_env={**world.env, "LIVE_SWEEP_SECONDS": "1"})
        servers.append(a)
        sock_a = open_socket(a, token=world.token)
        sock_a.subscribe(project_id=world.project_id)
        origin_a = _hello(channel)

        def write_a() -> None:
            api_post(a, world.token, "/sessions", SESSION)

        # The round waits for the silent listener, then ends unsure: NOTIFY stays on throughout.
        log = a.log_path
        deadline = time.monotonic() + SETTLE
        while "heard from 0 of the 1 other listener(s) it counted; sending NOTIFY" not in log.read_text():
            assert _wakeups_from(channel.after(write_a), origin_a), "NOTIFY off while a counted listener was unheard"
            assert time.monotonic() < deadline, "the round never ended"
        assert _wakeups_from(channel.after(write_a), origin_a), "NOTIFY off after a round that ended unsure"
    finally:
        silent.close()

    deadline = time.monotonic() + SETTLE
    while _wakeups_from(channel.after(write_a), origin_a):
        assert time.monotonic() < deadline, "NOTIFY stayed on after the silent listener's connection closed"
    assert "no other process listens for event wake-ups: this one stops sending NOTIFY" in log.read_text()
    assert _wakeups_from(channel.after(write_a), origin_a) == []


def test_a_server_that_serves_only_the_api_listens_from_its_first_request(world, channel, servers, open_socket):
    """No socket needed: the first HTTP request starts the listener, so a lone API-only server
    stops sending NOTIFY too, and still NOTIFYs once another server's listener says hello."""
    a = DaphneServer(extra_env=world.env)
    servers.append(a)

    def write_a() -> None:
        api_post(a, world.token, "/sessions", SESSION)

    write_a()  # a's first request: no socket anywhere
    origin_a = _hello(channel)
    deadline = time.monotonic() + SETTLE
    while _wakeups_from(channel.after(write_a), origin_a):
        assert time.monotonic() < deadline, "a lone API-only server kept sending NOTIFY"
    for _ in range(3):
        assert _wakeups_from(channel.after(write_a), origin_a) == [], "a lone API-only server sent a NOTIFY"

    b = DaphneServer(extra_env=world.env)
    servers.append(b)
    sock_b = open_socket(b, token=world.token)
    assert sock_b.subscribe(project_id=world.project_id) == []
    _hello(channel, but={origin_a})
    channel.until(lambda m: m.get("here") == 1 and m["o"] == origin_a)
    notes = channel.after(write_a)
    written = world.latest_event_id()
    assert [item[0] for m in _wakeups_from(notes, origin_a) for item in m["p"]] == [world.project_id]
    assert sock_b.events_until(written, timeout=WITHIN)[-1]["id"] == written, "b's socket woken by a's NOTIFY"
