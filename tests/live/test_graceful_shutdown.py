"""SIGTERM to a real server drains: it stops listening, closes websockets with 1012 (service
restart), lets the requests in flight finish, then exits 0; so every write a client got a 2xx for
is in the database. With two processes sharing Redis, the other one keeps serving throughout.

Both servers: daphne as ``make run`` serves (the drain is ``novelforge_sessions.server.drain``)
and the production server, uvicorn as ``python -m novelforge_sessions.serve`` configures it
(``make serve-cluster``)."""
from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from http.client import HTTPException

import psycopg
import pytest

from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.server.drain import SHUTDOWN_CLOSE_CODE, grace_seconds
from novelforge_sessions.models import Session, TranscriptEntry
from tests.support.factories import SESSION, make_project
from tests.support.servers import DaphneServer, database_url
from tests.live.conftest import NO_SWEEP, TIMEOUT, api_post
from tests.support.waits import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

#: The servers' drain grace: ``SHUTDOWN_GRACE_SECONDS`` as the servers read it from this environment.
GRACE = grace_seconds()


def post_transcript(server: DaphneServer, token: str, session_id: int, content: str) -> int:
    """POST one transcript entry; the HTTP status (raises on a connection failure)."""
    req = urllib.request.Request(
        f"{server.url}/api/v1/sessions/{session_id}/transcript",
        data=json.dumps({"role": "user", "content": content}).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def refuses_connections(server: DaphneServer) -> bool:
    try:
        urllib.request.urlopen(server.url + "/healthz", timeout=1).close()
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ConnectionRefusedError)
    return False


def exit_code_after_drain(server: DaphneServer, grace: float) -> int:
    """The server's exit code once its drain is over: it may take the whole grace (requests still
    in flight are cancelled when it ends) plus the usual margin. A process still alive then is
    stuck: the failure carries its threads' stacks (uvicorn's ``serve`` dumps them on SIGUSR1)
    and the end of its log."""
    try:
        return server.proc.wait(timeout=grace + TIMEOUT)
    except subprocess.TimeoutExpired:
        if server.server == "uvicorn":
            server.proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.proc.wait(timeout=2)  # the dump is written by then; the process stays stuck
        tail = server.log_path.read_text(errors="replace")[-6000:]
        raise AssertionError(f"{server.server} did not exit after its drain; the end of its log:\n{tail}") from None


@pytest.mark.parametrize("kind", ["daphne", "uvicorn"])
def test_sigterm_finishes_the_request_in_flight_and_closes_sockets_with_1012(open_socket, kind):
    server = DaphneServer(extra_env=NO_SWEEP, server=kind)
    try:
        project = make_project("drain")
        _, token = create_token(project, name="agent", permissions=ALL_PERMISSIONS)
        session_id = api_post(server, token, "/sessions", SESSION)["id"]
        sock = open_socket(server, token=token)
        sock.subscribe(project_id=project.id)

        # Hold the session's row lock from outside, so the server's append is provably in flight
        # (blocked in PostgreSQL) when SIGTERM arrives.
        with psycopg.connect(database_url()) as locker:
            locker.execute(f"SELECT id FROM {Session._meta.db_table} WHERE id = %s FOR UPDATE", [session_id])
            result: dict[str, object] = {}
            writer = threading.Thread(
                target=lambda: result.update(status=post_transcript(server, token, session_id, "in flight"))
            )
            writer.start()

            def blocked() -> bool:
                row = locker.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                ).fetchone()
                return row[0] == 1

            wait_until(blocked, "the append to wait on the row lock", timeout=TIMEOUT)
            server.proc.send_signal(signal.SIGTERM)

            code, _frames = sock.closed_with()
            assert code == SHUTDOWN_CLOSE_CODE == 1012
            wait_until(lambda: refuses_connections(server), "the server to stop listening", timeout=TIMEOUT)
            assert server.proc.poll() is None, "the server exited with a request in flight"
            assert TranscriptEntry.objects.filter(session_id=session_id).count() == 0
            locker.rollback()  # release the lock: the request in flight completes

        writer.join(TIMEOUT)
        assert result == {"status": 201}
        assert exit_code_after_drain(server, GRACE) == 0
        assert list(TranscriptEntry.objects.filter(session_id=session_id).values_list("content", flat=True)) == [
            "in flight"
        ]
    finally:
        server.stop()


class Writer(threading.Thread):
    """Appends transcript entries in a loop through one server; records what was acknowledged."""

    def __init__(self, server: DaphneServer, token: str, session_id: int, name: str) -> None:
        super().__init__(daemon=True)
        self.server, self.token, self.session_id, self.label = server, token, session_id, name
        self.acked: list[str] = []
        self.statuses: list[int] = []
        self.failure: BaseException | None = None
        self.stop_flag = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop_flag.is_set():
            content = f"{self.label}-{i}"
            i += 1
            try:
                status = post_transcript(self.server, self.token, self.session_id, content)
            except (urllib.error.URLError, ConnectionError, HTTPException, TimeoutError) as exc:
                self.failure = exc  # the server went away: this write got no 2xx
                return
            self.statuses.append(status)
            if 200 <= status < 300:
                self.acked.append(content)


def test_sigterm_on_one_of_two_processes_loses_no_acknowledged_write_while_the_other_serves(two_servers, open_socket):
    a, b = two_servers
    writers: list[Writer] = []
    try:
        project = make_project("two-drain")
        _, token = create_token(project, name="agent", permissions=ALL_PERMISSIONS)
        sock_a = open_socket(a, token=token)
        sock_b = open_socket(b, token=token)
        sock_a.subscribe(project_id=project.id)
        sock_b.subscribe(project_id=project.id)
        for server, tag in ((a, "a"), (b, "b")):
            for n in range(2):
                session_id = api_post(server, token, "/sessions", SESSION)["id"]
                writers.append(Writer(server, token, session_id, f"{tag}{n}"))
        for w in writers:
            w.start()
        wait_until(lambda: all(len(w.acked) >= 5 for w in writers), "every writer to get 5 writes acknowledged",
                   timeout=TIMEOUT)

        a.proc.send_signal(signal.SIGTERM)
        code, _frames = sock_a.closed_with()
        assert code == 1012
        assert exit_code_after_drain(a, GRACE) == 0
        on_a, on_b = writers[:2], writers[2:]
        for w in on_a:
            w.join(TIMEOUT)
            assert not w.is_alive() and w.failure is not None  # they stopped because A went away

        # B keeps serving: its writers get further writes acknowledged after A exited.
        after = {w.label: len(w.acked) for w in on_b}
        wait_until(lambda: all(len(w.acked) >= after[w.label] + 5 for w in on_b), "B to keep acknowledging writes",
                   timeout=TIMEOUT)
        for w in on_b:
            w.stop_flag.set()
            w.join(TIMEOUT)
            assert w.failure is None
        # ... and its socket still delivers events (one of the last appends through B).
        assert sock_b.next_event()["type"] in {"session.created", "transcript.appended"}

        for w in writers:
            assert all(200 <= s < 300 for s in w.statuses), (w.label, w.statuses)  # no 5xx while draining
            stored = set(
                TranscriptEntry.objects.filter(session_id=w.session_id).values_list("content", flat=True)
            )
            assert set(w.acked) <= stored, (w.label, sorted(set(w.acked) - stored))
            # Nothing appears that the writer did not send (at most its one unacknowledged last write).
            assert len(stored - set(w.acked)) <= 1
    finally:
        for w in writers:
            w.stop_flag.set()


@pytest.mark.django_db(transaction=False)
def test_the_grace_is_validated_at_start_up(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from novelforge_sessions.server.drain import grace_seconds

    monkeypatch.delenv("SHUTDOWN_GRACE_SECONDS", raising=False)
    assert grace_seconds() == 20.0
    monkeypatch.setenv("SHUTDOWN_GRACE_SECONDS", "2.5")
    assert grace_seconds() == 2.5
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("SHUTDOWN_GRACE_SECONDS", bad)
        with pytest.raises(ImproperlyConfigured):
            grace_seconds()
