"""The API socket (``/ws/api/``, novelforge_sessions/api/socket.py) against live servers: every
answer is the one the same HTTP request gets (successes, replays and every refusal, refusals
writing nothing), the handshake refuses what the event stream refuses and a token that is not
valid, frames that are no request get a typed 400 and the socket goes on, a revoked token is
refused on an open socket, 16 sockets racing one idempotency key leave one row, and the shipped
client sends its checkpoints there, falling back to HTTP where a server has no socket."""
from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Origin

from novelforge_client import Client, RetryPolicy
from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.models import ApiToken, Checkpoint, Event

from tests.client.proxy import DroppingProxy
from tests.support.factories import make_project
from tests.support.servers import DaphneServer

pytestmark = pytest.mark.django_db(transaction=True)

WRITER = dict(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli")
FAST = RetryPolicy(attempts=4, backoff=0.01, max_backoff=0.05)


@pytest.fixture(scope="module")
def uvicorn_server(django_db_setup, django_db_blocker) -> Iterator[DaphneServer]:
    """The production server (uvicorn) of this module's own."""
    srv = DaphneServer(server="uvicorn")
    yield srv
    srv.stop()


@pytest.fixture(params=["daphne", "uvicorn"])
def live(request: Any, server: DaphneServer) -> DaphneServer:
    return server if request.param == "daphne" else request.getfixturevalue("uvicorn_server")


def open_socket(srv: DaphneServer, token: str | None, *, origin: str | None = None,
                host: str | None = None) -> ClientConnection:
    """A socket to ``srv``; ``host``: the handshake names that host (the connection still goes to ``srv``)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    url = f"ws://{host}:{srv.port}/ws/api/" if host is not None else f"{srv.ws_url}/ws/api/"
    sock = socket.create_connection(("127.0.0.1", srv.port))
    return connect(url, sock=sock, origin=Origin(origin or srv.url), additional_headers=headers, proxy=None).__enter__()


class Socket:
    """A test's side of the API socket: one request frame, its answer."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.sent = 0

    def call(self, method: str, path: str, body: Any = None, *, raw: str | None = None) -> tuple[int, Any]:
        self.sent += 1
        text = raw if raw is not None else json.dumps(body)
        self.ws.send(json.dumps({"id": self.sent, "method": method, "path": path, "body": None if body is None and raw is None else text}))
        answer = json.loads(self.ws.recv(timeout=30))
        assert answer["id"] == self.sent
        return answer["status"], json.loads(answer["body"]) if answer["body"] else None


def http(srv: DaphneServer, token: str, method: str, path: str, body: Any = None, *, raw: str | None = None) -> tuple[int, Any]:
    content = raw.encode() if raw is not None else (None if body is None else json.dumps(body).encode())
    r = httpx.request(method, srv.url + path, content=content, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    return r.status_code, r.json() if r.content else None


def running(srv: DaphneServer, token: str) -> tuple[Any, Any]:
    with Client(srv.url, token) as nf:
        s = nf.create_session(**WRITER, runtime={"runtime_family": "cli", "lease_seconds": 300})
        return s, nf.start_run(s.id, cursor={"step": "outline"})


def without_time(body: Any) -> Any:
    return {k: v for k, v in body.items() if k not in ("id", "seq", "created_at")} if isinstance(body, dict) else body


def test_a_checkpoint_on_the_socket_is_the_route_s_answer(live: DaphneServer, token: str) -> None:
    s, run = running(live, token)
    path = f"/api/v1/runs/{run.id}/checkpoints"
    sock = Socket(open_socket(live, token))
    status, first = sock.call("POST", path, {"boundary": "context_freeze", "cursor": {"step": 1}, "idempotency_key": "k1"})
    assert status == 201 and first["seq"] == 1
    # byte for byte what the API answers for that checkpoint: a GET, and the same key replayed over HTTP
    assert http(live, token, "GET", f"/api/v1/checkpoints/{first['id']}") == (200, first)
    assert http(live, token, "POST", path, {"boundary": "context_freeze", "cursor": {"step": 1},
                                            "idempotency_key": "k1"}) == (200, first)
    assert sock.call("POST", path, {"boundary": "context_freeze", "cursor": {"step": 1}, "idempotency_key": "k1"}) == (200, first)
    status, second = sock.call("POST", path, {"boundary": "context_freeze", "cursor": {"step": 2}})
    assert status == 201 and second["seq"] == 2
    # what HTTP answers for another body of the same route: the same, but for the row's own id, seq and time
    status, third = http(live, token, "POST", path, {"boundary": "context_freeze", "cursor": {"step": 2}})
    assert status == 201 and without_time(third) == without_time(second)
    assert list(Checkpoint.objects.filter(run_id=run.id).values_list("seq", flat=True).order_by("seq")) == [1, 2, 3]
    assert Event.objects.filter(type="checkpoint.recorded", session_id=s.id).count() == 3
    # any other route is answered by the route itself
    assert sock.call("GET", f"/api/v1/runs/{run.id}/checkpoints?limit=2") == http(
        live, token, "GET", f"/api/v1/runs/{run.id}/checkpoints?limit=2")
    sock.ws.close()


def test_a_graph_put_and_its_writes_on_the_socket_are_the_routes_answers(live: DaphneServer, token: str) -> None:
    from novelforge_sessions.control.models import GraphCheckpoint, GraphWrite

    sock = Socket(open_socket(live, token))
    thread = f"socket-{live.server}"
    put = {"thread_id": thread, "checkpoint_id": "0001", "open": {"task_mode": "drafting"},
           "checkpoint": {"v": 1, "id": "0001", "channel_versions": {"step": 1}},
           "blobs": [{"channel": "step", "version": 1, "value": {"serde": "json", "data": "MQ=="}}]}
    status, first = sock.call("POST", "/api/v1/graph-threads/checkpoints", put)
    assert status == 201 and first["created"] is True and first["runtime_id"] is not None
    # an identical retry, over HTTP and over the socket: the same 200
    again = http(live, token, "POST", "/api/v1/graph-threads/checkpoints", {k: v for k, v in put.items() if k != "open"})
    assert again[0] == 200 and again[1]["created"] is False
    assert sock.call("POST", "/api/v1/graph-threads/checkpoints", {k: v for k, v in put.items() if k != "open"}) == again
    writes = {"thread_id": thread, "checkpoint_id": "0001", "task_id": "t1",
              "writes": [{"idx": 0, "channel": "step", "value": {"serde": "json", "data": "Mg=="}}]}
    assert sock.call("POST", "/api/v1/graph-threads/writes", writes) == (200, {"stored": 1})
    assert http(live, token, "POST", "/api/v1/graph-threads/writes", writes) == (200, {"stored": 0})
    assert sock.call("POST", "/api/v1/graph-threads/writes", writes) == (200, {"stored": 0})
    # a refusal is the route's, and writes nothing: another checkpoint under the same id
    conflict = {**put, "checkpoint": {"v": 1, "id": "0001", "channel_versions": {"step": 2}}}
    refused = sock.call("POST", "/api/v1/graph-threads/checkpoints", conflict)
    assert refused == http(live, token, "POST", "/api/v1/graph-threads/checkpoints", conflict)
    assert refused[0] == 409 and refused[1]["error"]["code"] == "graph_checkpoint_conflict"
    assert GraphCheckpoint.objects.filter(thread__thread_id=thread).count() == 1
    assert GraphWrite.objects.filter(thread__thread_id=thread).count() == 1
    sock.ws.close()


REFUSED = {
    "a body the schema refuses": ({"boundary": "nowhere", "cursor": {}}, None, 422),
    "a non-finite number": (None, '{"boundary": "context_freeze", "cursor": {"x": NaN}}', 422),
    "not JSON": (None, "{", 400),
    "an unbounded cursor": ({"boundary": "context_freeze", "cursor": {"messages": ["x"] * 5}}, None, 422),
    "a duplicate key": (None, '{"boundary": "context_freeze", "boundary": "user_wait", "cursor": {}}', 422),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_checkpoint_is_refused_as_http_refuses_it_and_writes_nothing(server: DaphneServer, token: str,
                                                                                case: str) -> None:
    body, raw, status = REFUSED[case]
    s, run = running(server, token)
    path = f"/api/v1/runs/{run.id}/checkpoints"
    before = Event.objects.count()
    sock = Socket(open_socket(server, token))
    answered = sock.call("POST", path, body, raw=raw)
    assert answered == http(server, token, "POST", path, body, raw=raw)
    assert answered[0] == status and "error" in answered[1]
    assert Checkpoint.objects.filter(run_id=run.id).count() == 0 and Event.objects.count() == before
    sock.ws.close()


def test_refusals_of_the_write_are_the_route_s_and_write_nothing(server: DaphneServer, token: str, project: Any) -> None:
    s, run = running(server, token)
    sock = Socket(open_socket(server, token))
    body = {"boundary": "context_freeze", "cursor": {"step": 1}}
    # a run of another project: not found, as over HTTP
    _, other_token = create_token(make_project("elsewhere"), name="other", permissions=["read", "write"])
    other = Socket(open_socket(server, other_token))
    assert other.call("POST", f"/api/v1/runs/{run.id}/checkpoints", body) == http(
        server, other_token, "POST", f"/api/v1/runs/{run.id}/checkpoints", body)
    assert other.call("POST", f"/api/v1/runs/{run.id}/checkpoints", body)[0] == 404
    assert sock.call("POST", "/api/v1/runs/999999999/checkpoints", body)[0] == 404
    # an ended run: run_not_open, nothing written
    with Client(server.url, token) as nf:
        nf.end_run(run.id, "completed")
    status, error = sock.call("POST", f"/api/v1/runs/{run.id}/checkpoints", body)
    assert (status, error) == http(server, token, "POST", f"/api/v1/runs/{run.id}/checkpoints", body)
    assert status == 409 and error["error"]["code"] == "run_not_open"
    # a token that may only read: forbidden
    _, reader = create_token(project, name="reader", permissions=["read"])
    assert Socket(open_socket(server, reader)).call("POST", f"/api/v1/runs/{run.id}/checkpoints", body)[0] == 403
    assert Checkpoint.objects.filter(run_id=run.id).count() == 0
    sock.ws.close()
    other.ws.close()


def test_a_token_revoked_while_the_socket_is_open_is_refused_401(server: DaphneServer, token: str) -> None:
    s, run = running(server, token)
    path = f"/api/v1/runs/{run.id}/checkpoints"
    sock = Socket(open_socket(server, token))
    assert sock.call("POST", path, {"boundary": "context_freeze", "cursor": {"step": 1}})[0] == 201
    assert sock.call("POST", path, {"boundary": "context_freeze", "cursor": {"step": 2}})[0] == 201  # recalled
    ApiToken.objects.filter(key_hash=ApiToken.hash_key(token)).update(revoked_at="2026-01-01T00:00:00Z")
    status, error = sock.call("POST", path, {"boundary": "context_freeze", "cursor": {"step": 3}})
    assert status == 401 and error["error"]["code"] == "unauthorized"
    assert list(Checkpoint.objects.filter(run_id=run.id).values_list("seq", flat=True).order_by("seq")) == [1, 2]
    sock.ws.close()


def test_the_handshake_refuses_what_is_not_an_agent_of_this_server(server: DaphneServer, token: str) -> None:
    for why, kwargs in {
        "no token": dict(token=None), "an unknown token": dict(token="nfs_" + "x" * 40),
        "another origin": dict(token=token, origin="http://evil.example"),
        "another port": dict(token=token, origin="http://127.0.0.1:1"),
        "a host not allowed": dict(token=token, host="evil.example", origin=f"http://evil.example:{server.port}"),
    }.items():
        with pytest.raises(InvalidStatus) as refused:
            open_socket(server, **kwargs)
        assert refused.value.response.status_code == 403, why


def test_frames_that_are_no_request_get_a_typed_400_and_the_socket_goes_on(server: DaphneServer, token: str) -> None:
    s, run = running(server, token)
    ws = open_socket(server, token)
    for frame, frame_id in [
        ("not json", None), ("[1, 2]", None), ('{"method": "GET", "path": "/api/v1/sessions"}', None),
        ('{"id": true, "method": "GET", "path": "/api/v1/sessions"}', None),
        ('{"id": 5, "method": "TRACE", "path": "/api/v1/sessions"}', 5),
        ('{"id": 6, "method": "GET", "path": "/admin/"}', 6),
        ('{"id": 7, "method": "GET", "path": "/api/v1/sessions\\r\\nX: y"}', 7),
        ('{"id": 9, "method": "GET", "path": "/api/v1/sessions%0D%0AX:%20y"}', 9),  # the same, percent-encoded
        ('{"id": "eight", "method": "POST", "path": "/api/v1/sessions", "body": {"not": "a string"}}', "eight"),
    ]:
        ws.send(frame)
        answer = json.loads(ws.recv(timeout=30))
        assert answer["id"] == frame_id and answer["status"] == 400, frame
        assert json.loads(answer["body"])["error"]["code"] == "malformed_body"
    assert Socket(ws).call("POST", f"/api/v1/runs/{run.id}/checkpoints",
                           {"boundary": "context_freeze", "cursor": {"step": 1}})[0] == 201
    ws.close()


def test_a_percent_encoded_path_names_the_route_http_decodes_it_to(server: DaphneServer, token: str) -> None:
    """A frame's path is decoded as an HTTP server decodes a request's (ASGI ``path``): the same
    answer as over HTTP, for a route named with escapes, and for a query string left as sent."""
    s, run = running(server, token)
    ws = Socket(open_socket(server, token))
    escaped = f"/api/v1/run%73/%3{str(run.id)[0]}{str(run.id)[1:]}"  # "runs/<id>", two characters escaped
    over_socket, over_http = ws.call("GET", escaped), http(server, token, "GET", escaped)
    assert over_socket == over_http and over_socket[0] == 200 and over_socket[1]["id"] == run.id, over_socket
    listed = ws.call("GET", f"/api/v1/sessions/{s.id}/runs?limit=%31")  # limit=1
    assert listed == http(server, token, "GET", f"/api/v1/sessions/{s.id}/runs?limit=%31")
    assert listed[0] == 200 and [r["id"] for r in listed[1]["items"]] == [run.id]
    ws.ws.close()


def test_a_body_over_the_route_s_limit_is_413_and_writes_nothing(live: DaphneServer, token: str) -> None:
    from django.conf import settings

    s, run = running(live, token)
    path = f"/api/v1/runs/{run.id}/checkpoints"
    sock = Socket(open_socket(live, token))
    big = json.dumps({"boundary": "context_freeze", "cursor": {"pad": "x" * settings.API_MAX_BODY_BYTES}})
    status, error = sock.call("POST", path, raw=big)
    assert status == 413 and error["error"]["code"] == "payload_too_large"
    assert http(live, token, "POST", path, raw=big)[0] == 413
    assert Checkpoint.objects.filter(run_id=run.id).count() == 0
    sock.ws.close()


def test_a_frame_longer_than_any_body_is_refused_before_it_is_read(uvicorn_server: DaphneServer, token: str) -> None:
    """(uvicorn: its cap on a message is 16 MiB; daphne's, 1 MiB, drops the connection first.)"""
    from novelforge_sessions.api.socket import max_frame_chars

    s, run = running(uvicorn_server, token)
    sock = Socket(open_socket(uvicorn_server, token))
    sock.ws.send("[" * (max_frame_chars() + 1))
    answer = json.loads(sock.ws.recv(timeout=30))
    assert answer["id"] is None and answer["status"] == 413
    assert json.loads(answer["body"])["error"]["code"] == "payload_too_large"
    assert sock.call("GET", f"/api/v1/runs/{run.id}/checkpoints")[0] == 200  # and the socket goes on
    sock.ws.close()


def test_sixteen_sockets_retrying_one_key_leave_one_row(live: DaphneServer, token: str) -> None:
    s, run = running(live, token)
    sockets = [Socket(open_socket(live, token)) for _ in range(16)]
    barrier = threading.Barrier(16)
    answers: list[tuple[int, Any]] = []
    lock = threading.Lock()

    def retry(sock: Socket) -> None:
        barrier.wait()
        answer = sock.call("POST", f"/api/v1/runs/{run.id}/checkpoints",
                           {"boundary": "context_freeze", "cursor": {"step": "same"}, "idempotency_key": "race"})
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=retry, args=(sock,)) for sock in sockets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(status for status, _ in answers) == [200] * 15 + [201]
    assert len({body["id"] for _, body in answers}) == 1
    assert Checkpoint.objects.filter(run_id=run.id).count() == 1
    assert Event.objects.filter(type="checkpoint.recorded", session_id=s.id).count() == 1
    for sock in sockets:
        sock.ws.close()


def test_the_client_sends_checkpoints_on_the_socket_and_everything_else_over_http(server: DaphneServer, token: str) -> None:
    proxy = DroppingProxy(server.port)
    try:
        with Client(proxy.url, token, retry=FAST) as nf:
            s = nf.create_session(**WRITER, runtime={"runtime_family": "cli", "lease_seconds": 300})
            run = nf.start_run(s.id, cursor={"step": "a"})
            cps = [nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": i}) for i in range(3)]
            proxy.drop_responses = 1  # the answer frame lost after the commit: the retry replays its key
            cps.append(nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": 3}))
            assert [c.seq for c in nf.checkpoints(run.id)] == [c.seq for c in cps] == [1, 2, 3, 4]
        assert proxy.dropped == 1
        assert proxy.forwarded[("POST", f"/api/v1/runs/{run.id}/checkpoints")] == 5  # 4, one of them twice
        assert proxy.forwarded[("GET", "/ws/api/")] == 2  # the socket, and the one that replaced it
        assert Checkpoint.objects.filter(run_id=run.id).count() == 4
    finally:
        proxy.close()


def test_the_client_falls_back_to_http_where_the_server_has_no_socket(server: DaphneServer, token: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A server without the API socket (its handshake refused, as an older service's is) gets the
    checkpoints over HTTP, and the client does not knock again."""
    from novelforge_client import _wire

    proxy = DroppingProxy(server.port)
    real_init = _wire.Socket.__init__

    def elsewhere(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        self.url = self.url.replace("/ws/api/", "/ws/no-such-socket/")

    monkeypatch.setattr(_wire.Socket, "__init__", elsewhere)
    try:
        with Client(proxy.url, token, retry=FAST) as nf:
            s = nf.create_session(**WRITER, runtime={"runtime_family": "cli", "lease_seconds": 300})
            run = nf.start_run(s.id, cursor={"step": "a"})
            cps = [nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": i}) for i in range(3)]
            assert [c.seq for c in cps] == [1, 2, 3]
        assert proxy.forwarded[("GET", "/ws/no-such-socket/")] == 1
        assert proxy.forwarded[("POST", f"/api/v1/runs/{run.id}/checkpoints")] == 3
    finally:
        proxy.close()


def test_the_fast_routes_metrics_labels_are_the_http_routes() -> None:
    from django.urls import resolve

    from novelforge_sessions.api import socket

    for route, path in zip(socket.fast_routes(), ["/api/v1/runs/12/checkpoints", "/api/v1/graph-threads/checkpoints",
                                                  "/api/v1/graph-threads/writes"]):
        assert route.path.fullmatch(path)
        assert "/" + resolve(path).route == route.label


def test_a_failure_inside_the_socket_is_a_typed_500_and_the_socket_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process (channels' communicator, the real application): a request whose handling raises
    is answered 500 ``internal_error`` with its id, and the next request on the socket is served."""
    import asyncio

    from channels.testing import WebsocketCommunicator

    from novelforge_sessions.actions.tokens import ALL_PERMISSIONS
    from novelforge_sessions.api import socket as api_socket
    from novelforge_sessions.asgi import application

    raw = create_token(make_project("socket-bug"), name="agent", permissions=ALL_PERMISSIONS)[1]
    real = api_socket.ApiSocket._respond

    def failing(self: Any, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        if path.endswith("/boom"):
            raise RuntimeError("a bug")
        return real(self, method, path, body)

    monkeypatch.setattr(api_socket.ApiSocket, "_respond", failing)

    async def scenario() -> list[dict[str, Any]]:
        ws = WebsocketCommunicator(application, "/ws/api/", headers=[
            (b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8000"), (b"authorization", f"Bearer {raw}".encode())])
        connected, _ = await ws.connect()
        assert connected
        answers = []
        for frame_id, path in [(1, "/api/v1/boom"), (2, "/api/v1/sessions")]:
            await ws.send_to(text_data=json.dumps({"id": frame_id, "method": "GET", "path": path, "body": None}))
            answers.append(json.loads(await ws.receive_from(timeout=30)))
        await ws.disconnect()
        return answers

    boom, sessions = asyncio.run(scenario())
    assert (boom["id"], boom["status"], json.loads(boom["body"])["error"]["code"]) == (1, 500, "internal_error")
    assert (sessions["id"], sessions["status"]) == (2, 200)
