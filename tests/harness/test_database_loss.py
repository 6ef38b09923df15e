"""Found by the fault-injection harness (``harness/``): after PostgreSQL dropped the server's connections (a restart,
``pg_terminate_backend``) the pooled server answered 500. Now the pool checks each connection
as it leaves it (``CONN_HEALTH_CHECKS``), so the next request is served, and a request whose
connection is cut under it is a typed ``503 database_unavailable`` with ``Retry-After``."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import psycopg
import pytest

from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.models import Session
from tests.support.factories import SESSION, make_project
from tests.support.servers import DaphneServer, database_url
from tests.support.waits import wait_until
from tests.live.conftest import TIMEOUT, api_post

pytestmark = pytest.mark.django_db(transaction=True)


def request(server: DaphneServer, token: str, method: str, path: str, body: dict | None = None):
    req = urllib.request.Request(server.url + "/api/v1" + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def server_backends(conn: psycopg.Connection, exclude: int) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> %s AND pid <> pg_backend_pid() "
        "AND backend_type = 'client backend'", [exclude]).fetchall()]


def own_backend() -> int:
    """This test process's own Django connection (it must survive)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return cur.fetchone()[0]


@pytest.fixture
def server():
    srv = DaphneServer(extra_env={"DB_POOL_MAX_SIZE": "4", "API_THREADS": "2"})
    yield srv
    srv.stop()


def test_requests_after_the_backends_were_terminated_are_served(server):
    project = make_project("db-loss")
    _, token = create_token(project, name="agent", permissions=ALL_PERMISSIONS)
    for _ in range(3):  # the pool now holds idle connections
        assert request(server, token, "GET", "/sessions")[0] == 200
    with psycopg.connect(database_url(), autocommit=True) as admin:
        pids = server_backends(admin, exclude=own_backend())
        assert pids, "the server holds pooled connections"
        for pid in pids:
            # Waits (up to 5 s) until the backend is gone: without it, a request could still
            # find the backend alive but dying, and meet the cut mid-query (a typed 503, the
            # next test's case) instead of a connection already closed.
            assert admin.execute("SELECT pg_terminate_backend(%s, 5000)", [pid]).fetchone()[0]
    statuses = [request(server, token, "GET", "/sessions")[0] for _ in range(4)]
    statuses.append(request(server, token, "POST", "/sessions", SESSION)[0])
    assert statuses == [200, 200, 200, 200, 201]


def test_a_connection_cut_under_a_request_is_a_typed_503(server):
    project = make_project("db-cut")
    _, token = create_token(project, name="agent", permissions=ALL_PERMISSIONS)
    session_id = api_post(server, token, "/sessions", SESSION)["id"]
    with psycopg.connect(database_url(), autocommit=True) as admin, psycopg.connect(database_url()) as locker:
        # Hold the session's row lock, so the server's write is provably in flight (blocked).
        locker.execute(f"SELECT id FROM {Session._meta.db_table} WHERE id = %s FOR UPDATE", [session_id])
        result: dict = {}
        writer = threading.Thread(target=lambda: result.update(answer=request(
            server, token, "POST", f"/sessions/{session_id}/transcript", {"role": "user", "content": "cut"})))
        writer.start()
        blocked = wait_until(lambda: [r[0] for r in admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchall()], "the server's write to block on the lock", timeout=10, interval=0.02)
        admin.execute("SELECT pg_terminate_backend(%s)", [blocked[0]])
        writer.join(timeout=TIMEOUT)
    status, headers, body = result["answer"]
    assert (status, body["error"]["code"]) == (503, "database_unavailable"), body
    assert headers.get("Retry-After") == "1"
    # Nothing was half-written, and the server serves the retry.
    assert request(server, token, "GET", f"/sessions/{session_id}/transcript")[2]["items"] == []
    assert request(server, token, "POST", f"/sessions/{session_id}/transcript", {"role": "user", "content": "cut"})[0] == 201
