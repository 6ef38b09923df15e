"""The lean /api/v1/ ASGI path: same answers and headers as the full stack, through a real server;
its threads keep their connections and drop dead ones; its hop hands back results and errors.
(Twisted's Content-Type parse and request log under daphne: tests/test_server_patches.py.)"""
from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from novelforge_sessions.apikit.auth import caller_for_token  # noqa: F401 (the app is configured)

from tests.support.servers import DaphneServer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def servers(project):
    from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token

    _, raw = create_token(project, name="lean", permissions=ALL_PERMISSIONS)
    lean, full = DaphneServer(), DaphneServer(extra_env={"API_LEAN": "false"})
    try:
        yield raw, lean, full
    finally:
        lean.stop()
        full.stop()


def test_the_lean_path_answers_like_the_full_stack(servers):
    raw, lean, full = servers
    auth = {"Authorization": f"Bearer {raw}"}
    seen = {}
    for name, server in (("lean", lean), ("full", full)):
        with httpx.Client(base_url=server.url, timeout=30) as client:
            created = client.post("/api/v1/sessions", headers=auth, json={
                "role": "writer", "memory_policy": "bounded", "task_mode": "drafting", "runtime_family": "cli"})
            assert created.status_code == 201, created.text
            answers = {
                "get": client.get(f"/api/v1/sessions/{created.json()['id']}", headers=auth),
                "no_token": client.get("/api/v1/sessions"),
                "bad_json": client.post("/api/v1/sessions", headers={**auth, "Content-Type": "application/json"},
                                        content=b"{not json"),
                "too_big": client.post("/api/v1/sessions", headers={**auth, "Content-Type": "application/json"},
                                       content=json.dumps({"x": "a" * 300_000}).encode()),
                "no_route": client.get("/api/v1/nowhere", headers=auth),
                "docs": client.get("/api/docs"),
            }
        seen[name] = answers
    for key in seen["lean"]:
        lean_r, full_r = seen["lean"][key], seen["full"][key]
        assert lean_r.status_code == full_r.status_code, key
        if key != "docs" and lean_r.status_code >= 400:
            assert lean_r.json()["error"]["code"] == full_r.json()["error"]["code"], key
        for header in ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "Referrer-Policy"):
            assert (header in lean_r.headers) == (header in full_r.headers), (key, header)
            # the same values (ApiCSPMiddleware builds its policy once per host: every answer after
            # the first comes from that), up to the servers' ports in the websocket origin
            # (django-csp's directive order differs between processes: compared as a set; a page's
            # nonce is fresh per response)
            def value(r, port):
                text = re.sub(r"'nonce-[^']+'", "'nonce'", r.headers.get(header, "").replace(f":{port}", ":PORT"))
                return {d.strip() for d in text.split(";")}

            assert value(lean_r, lean.port) == value(full_r, full.port), (key, header)
    csp = seen["lean"]["no_route"].headers["Content-Security-Policy"]
    assert f"connect-src 'self' ws://127.0.0.1:{lean.port}" in csp and "script-src 'self'" in csp, csp
    assert seen["lean"]["get"].json()["role"] == "writer"
    assert [seen["lean"][k].status_code for k in ("no_token", "bad_json", "too_big", "no_route")] == [401, 400, 413, 404]
    assert "Set-Cookie" not in seen["lean"]["get"].headers  # no session or CSRF machinery on the API


def _get_scope(raw: str) -> dict:
    return {"type": "http", "method": "GET", "path": "/api/v1/sessions", "raw_path": b"/api/v1/sessions",
            "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
            "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {raw}".encode())],
            "server": ("testserver", 80), "client": ("127.0.0.1", 40000)}


def test_a_lean_thread_keeps_its_connection_across_requests_and_drops_one_the_server_ended(project):
    """The lean path's requests run on a thread that keeps its connection (no checkout per request);
    a connection PostgreSQL ended while it sat idle is replaced before the next request uses it."""
    import psycopg
    from django.db import connection

    from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
    from novelforge_sessions.api.asgi import LeanApiApplication
    from tests.support.servers import database_url

    _, raw = create_token(project, name="held", permissions=ALL_PERMISSIONS)
    app = LeanApiApplication(fallback=None)
    try:
        connection.close()
        response, _ = app.respond(_get_scope(raw), b"")
        assert response.status_code == 200
        held = connection.connection
        assert held is not None, "request_finished handed the connection back"
        response, _ = app.respond(_get_scope(raw), b"")
        assert response.status_code == 200 and connection.connection is held

        pid = held.info.backend_pid
        with psycopg.connect(database_url(), autocommit=True) as other:
            assert other.execute("SELECT pg_terminate_backend(%s, 10000)", [pid]).fetchone() == (True,)
        response, content = app.respond(_get_scope(raw), b"")
        assert response.status_code == 200, content  # not a 503 for the dead connection
        assert connection.connection is not None and connection.connection is not held
        assert connection.connection.info.backend_pid != pid
    finally:
        app.pool.shutdown()


def test_a_served_lean_path_survives_its_backends_being_terminated(project):
    """Through a real server with the pool (as make run): every backend it holds is terminated
    between requests, and the next requests still answer 200."""
    import psycopg
    from django.db import connection

    from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
    from tests.support.servers import database_url

    _, raw = create_token(project, name="terminated", permissions=ALL_PERMISSIONS)
    server = DaphneServer(extra_env={"API_THREADS": "2", "LIVE_SWEEP_SECONDS": "3600"})
    try:
        auth = {"Authorization": f"Bearer {raw}"}
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for _ in range(4):
                assert client.get("/api/v1/sessions", headers=auth).status_code == 200
            with psycopg.connect(database_url(), autocommit=True) as other:
                pids = [r[0] for r in other.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND backend_type = 'client backend'").fetchall()]
                # this test's own connection (pytest-django's) is not the server's: keep it
                mine = connection.connection.info.backend_pid if connection.connection else None
                pids = [p for p in pids if p != mine]
                assert pids, "the server holds no backend"
                for pid in pids:
                    assert other.execute("SELECT pg_terminate_backend(%s, 10000)", [pid]).fetchone() == (True,)
            statuses = [client.get("/api/v1/sessions", headers=auth).status_code for _ in range(6)]
        assert statuses == [200] * 6, statuses
    finally:
        server.stop()


def test_api_threads_hand_back_results_and_errors_and_skip_requests_whose_client_left():
    """The lean path's hop: a result and an exception reach the awaiting request; a request
    cancelled while it waited for a thread (its client left) is never run."""
    import asyncio
    import threading

    from novelforge_sessions.api.asgi import ApiThreads

    pool = ApiThreads(1, "nf-api-test")
    release, ran = threading.Event(), []

    def blocker():
        release.wait(30)
        return "first"

    def fails():
        raise ValueError("boom")

    async def scenario():
        first = pool.run(blocker)
        second = pool.run(ran.append, "second")  # queued behind the blocked thread
        second.cancel()
        release.set()
        assert await first == "first"
        with pytest.raises(ValueError, match="boom"):
            await pool.run(fails)
        assert await pool.run(lambda x: x * 2, 21) == 42

    try:
        asyncio.run(scenario())
    finally:
        pool.shutdown()
    assert ran == []  # the cancelled request never ran
    assert all(not t.is_alive() for t in pool.threads)


@pytest.mark.django_db(transaction=True)
def test_stopped_api_threads_close_the_connections_they_kept():
    """A pool thread keeps its database connection across requests; stopped (``shutdown``), it
    closes it: the backend is gone, not left for the process's exit."""
    import asyncio

    from django.db import connection, connections

    from novelforge_sessions.api.asgi import ApiThreads
    from tests.support.waits import wait_until

    def backend() -> tuple[int, Any]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0], connections["default"]  # the thread's own

    async def ask(pool: ApiThreads) -> tuple[int, Any]:
        return await pool.run(backend)

    pool = ApiThreads(1, "nf-api-closing")
    pid, kept = asyncio.run(ask(pool))
    assert asyncio.run(ask(pool))[0] == pid  # kept between requests
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        assert cursor.fetchone()[0] == 1
    pool.shutdown()
    assert kept.connection is None  # closed by its thread, not left for the exit (or the collector)

    def gone() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            return cursor.fetchone()[0] == 0

    wait_until(gone, f"backend {pid} gone once the pool stopped")  # its exit follows the client's close
    assert all(not t.is_alive() for t in pool.threads)


@pytest.mark.django_db(transaction=True)
def test_a_held_connection_numbered_past_fd_setsize_is_kept_not_taken_for_dead():
    """A server holding more than 1,024 sockets (hundreds of agents and dashboards connected)
    gives each database connection it opens later a descriptor past FD_SETSIZE, which
    ``select()`` refuses: the idle check took every such connection for dead and dropped it
    before every request. Polled, a live one is kept, and one the server ended is still dropped."""
    import psycopg
    from django.db import connections

    from novelforge_sessions.api import asgi
    from tests.support.descriptors import FD_SETSIZE, descriptors_up_to
    from tests.support.servers import database_url

    with descriptors_up_to(1300, taken=1100):  # the next descriptors are past 1,024
        conn = connections.create_connection("default")
        try:
            conn.ensure_connection()
            held = conn.connection
            assert held.fileno() > FD_SETSIZE
            asgi._drop_dead_connections([conn])
            assert conn.connection is held  # alive: kept
            assert asgi.has_input(held.fileno()) is False
            with psycopg.connect(database_url(), autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s, 10000)", [held.info.backend_pid])
            assert asgi.has_input(held.fileno()) is True  # the server's FATAL and its close
            asgi._drop_dead_connections([conn])
            assert conn.connection is None  # ended: dropped
        finally:
            conn.close()
