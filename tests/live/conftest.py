"""Fixtures for the live event stream: a real daphne, a synchronous websocket client, and
helpers to commit events through the server (so its own channel layer wakes the sockets)."""
from __future__ import annotations

import json
import os
import time
from collections import deque
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.support.servers import DaphneServer

REDIS_URL = os.environ.get("TEST_REDIS_URL") or "redis://127.0.0.1:6379/14"
#: No periodic sweep: a delivery must come from a wake-up that crossed processes (Redis).
NO_SWEEP = {"LIVE_SWEEP_SECONDS": "3600"}
TIMEOUT = 15.0


@pytest.fixture(scope="session")
def ws_server(django_db_setup, django_db_blocker) -> Iterator[DaphneServer]:
    """One daphne (in-memory channel layer) for the websocket tests of this run.

    Its periodic sweep is off, so every live delivery these tests see comes from a wake-up
    (the sweep has its own test in test_consumer_inprocess.py).
    """
    srv = DaphneServer(extra_env={"LIVE_SWEEP_SECONDS": "3600"})
    yield srv
    srv.stop()


class Socket:
    """A blocking websocket client speaking the /ws/events/ JSON protocol.

    ``batch=True``: subscriptions ask for several events to a frame (``{"type": "events"}``);
    ``subscribe``, ``next_event`` and ``events_until`` return events one by one either way,
    and ``event_frames`` counts the frames that carried them.
    """

    def __init__(
        self, server: DaphneServer, *, token: str | None = None, cookie: str | None = None, origin: str | None = None,
        batch: bool = False,
    ) -> None:
        headers: dict[str, str] = {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if cookie:
            headers["Cookie"] = cookie
        # Entered by hand (closed in ``close``) rather than in a with-block: tests hold sockets.
        self.ws: ClientConnection = connect(
            server.ws_url + "/ws/events/", origin=origin or server.url, additional_headers=headers, open_timeout=TIMEOUT,
        ).__enter__()
        self.batch = batch
        self.pending: deque[dict[str, Any]] = deque()  # events of a batched frame not returned yet
        self.event_frames = 0

    def send(self, message: Any) -> None:
        self.ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))

    def recv(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        return json.loads(self.ws.recv(timeout=timeout))

    def subscribe(self, *, after: int | None = None, **target: int) -> list[dict[str, Any]]:
        """Subscribe and return the backlog's events (everything up to ``caught_up``)."""
        body: dict[str, Any] = {"type": "subscribe", **target}
        if after is not None:
            body["after"] = after
        if self.batch:
            body["batch"] = True
        self.send(body)
        frame = self.recv()
        assert frame["type"] == "subscribed", frame
        backlog = []
        while True:
            frame = self.recv()
            if frame["type"] == "caught_up":
                return backlog
            backlog.extend(self._events_of(frame))

    def _events_of(self, frame: dict[str, Any]) -> list[dict[str, Any]]:
        """The events an event frame carries, checked to be the kind this socket asked for."""
        expected = "events" if self.batch else "event"
        assert frame["type"] == expected, frame
        self.event_frames += 1
        if self.batch:
            assert frame["events"], "a batched frame carries at least one event"
            return frame["events"]
        return [frame["event"]]

    def next_event(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self.pending:
            frame = self.recv(timeout=max(deadline - time.monotonic(), 0.01))
            if frame["type"] in ("event", "events"):
                self.pending.extend(self._events_of(frame))
        return self.pending.popleft()

    def events_until(self, last_id: int, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
        """Every event frame until one with id >= ``last_id`` (deadline-bounded)."""
        deadline = time.monotonic() + timeout
        got: list[dict[str, Any]] = []
        while not got or got[-1]["id"] < last_id:
            got.append(self.next_event(timeout=max(deadline - time.monotonic(), 0.01)))
        return got

    def closed_with(self, timeout: float = TIMEOUT) -> tuple[int, list[dict[str, Any]]]:
        """Read until the server closes; return (close code, frames received before it)."""
        frames = []
        deadline = time.monotonic() + timeout
        try:
            while True:
                frames.append(json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.01))))
        except ConnectionClosed as exc:
            assert exc.rcvd is not None, "the server did not send a close frame"
            return exc.rcvd.code, frames

    def close(self) -> None:
        # A socket a test stopped reading may have a backlog the server cannot send past (the
        # client reads no further once its frame queue is full), so the server's closing frame
        # never arrives: give up on it after a second instead of the library's ten.
        self.ws.close_timeout = 1
        self.ws.close()


@pytest.fixture
def open_socket() -> Iterator[Callable[..., Socket]]:
    sockets: list[Socket] = []

    def make(server: DaphneServer, **kw: Any) -> Socket:
        sock = Socket(server, **kw)
        sockets.append(sock)
        return sock

    yield make
    for sock in sockets:
        sock.close()


def api_post(server: DaphneServer, token: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """A JSON POST to the server's agent API (its commit wakes that server's sockets)."""
    req = urllib.request.Request(
        server.url + "/api/v1" + path, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
        assert resp.status in (200, 201), resp.status
        return json.loads(resp.read())


@pytest.fixture(params=["daphne", "uvicorn"])
def two_servers(request) -> Iterator[tuple[DaphneServer, DaphneServer]]:
    """Two server processes sharing the Redis channel layer, sweep off (stop() tolerates a
    process a test already ended): daphne (``make run``'s server) and the production server
    (``python -m novelforge_sessions.serve``, uvicorn: ``make serve-cluster``)."""
    a = DaphneServer(redis_url=REDIS_URL, extra_env=NO_SWEEP, server=request.param)
    try:
        b = DaphneServer(redis_url=REDIS_URL, extra_env=NO_SWEEP, server=request.param)
    except BaseException:
        a.stop()
        raise
    yield a, b
    a.stop()
    b.stop()
