"""The fault hook (novelforge_sessions/faults.py) in a real daphne serving the lean API path
(novelforge_sessions/api/asgi.py, the default): a kill point on a heartbeat, a handoff, a
result, a checkpoint (single, keyed, batch, over the API socket) and a graph path (put, writes) lets the first matching write through (answered, committed) and
kills the server with SIGKILL at the second one. ``before_commit`` leaves nothing of that write
in the database; ``after_commit`` leaves it written, and the client gets no answer."""
from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect
from websockets.typing import Origin

from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.control.models import ConsumeReceipt, GraphCheckpoint, GraphWrite, Handoff
from novelforge_sessions.models import Checkpoint, RuntimeAttachment, Session
from tests.support.factories import RUNTIME, SESSION, make_project
from tests.support.servers import DaphneServer

pytestmark = pytest.mark.django_db(transaction=True)

SCHEMA = {"text": "string"}


@dataclass
class World:
    """A server with a session, a live runtime, an open run and claimed handoffs, made through
    requests that match no kill point."""

    server: DaphneServer
    http: httpx.Client
    runtime_id: int
    run_id: int
    handoffs: list[dict[str, Any]]  # claimed: each with its fencing token

    def post(self, path: str, body: Any) -> httpx.Response:
        return self.http.post(path, json=body)

    def ok(self, path: str, body: Any) -> dict[str, Any]:
        resp = self.post(path, body)
        assert resp.is_success, (path, resp.status_code, resp.text)
        return resp.json()


@pytest.fixture
def world() -> Iterator[Callable[[str, int], World]]:
    """Factory: ``world(spec, handoffs)`` starts daphne with ``NOVELFORGE_FAULT_POINTS=spec``
    and claims ``handoffs`` handoffs."""
    made: list[tuple[DaphneServer, httpx.Client]] = []
    project = make_project("kill-points")
    _, token = create_token(project, name="agent", permissions=ALL_PERMISSIONS)

    def make(spec: str, handoffs: int) -> World:
        server = DaphneServer(extra_env={"NOVELFORGE_FAULT_POINTS": spec})
        http = httpx.Client(base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                            timeout=httpx.Timeout(30.0, connect=5.0))
        made.append((server, http))
        w = World(server, http, 0, 0, [])
        session = w.ok("/sessions", {**SESSION, "runtime": RUNTIME})
        w.runtime_id = session["runtime_id"]
        w.run_id = w.ok(f"/sessions/{session['id']}/runs", {"cursor": {"step": 0}, "runtime_id": w.runtime_id})["id"]
        for n in range(handoffs):
            h = w.ok(f"/runs/{w.run_id}/handoffs", {"logical_id": f"setup-{n}", "result_schema": SCHEMA})
            claimed = w.ok("/handoffs/claim", {"worker": "w", "capabilities": [], "handoff_id": h["id"]})["handoff"]
            w.handoffs.append(claimed)
        return w

    yield make
    for server, http in made:
        http.close()
        server.stop()


def killed(w: World, point: str, path: str, send: Callable[[], httpx.Response]) -> None:
    """``send()`` gets no answer: the server killed itself (SIGKILL) at ``point`` of ``path``."""
    with pytest.raises(httpx.TransportError):
        resp = send()
        pytest.fail(f"answered {resp.status_code} {resp.text[:300]}")
    assert w.server.proc.wait(timeout=30) == -signal.SIGKILL
    log = w.server.log_path.read_text(errors="replace")
    assert f"fault point {point} #2 on /api/v1{path}: SIGKILL" in log, log[-2000:]


# Each case: the path regex, and a write (the first and second of two on that path) that
# returns a function reading from the database whether that write is there.
def heartbeat(w: World, n: int) -> tuple[str, Callable[[], httpx.Response], Callable[[], bool]]:
    path = f"/runtimes/{w.runtime_id}/heartbeat"
    seconds = 1000 + 1000 * n  # each heartbeat moves the lease to its own distance

    def there() -> bool:
        r = RuntimeAttachment.objects.get(id=w.runtime_id)
        return (r.lease_expires_at - r.heartbeat_at).total_seconds() == pytest.approx(seconds, abs=1)

    return path, lambda: w.post(path, {"lease_seconds": seconds}), there


def handoff(w: World, n: int) -> tuple[str, Callable[[], httpx.Response], Callable[[], bool]]:
    path, logical_id = f"/runs/{w.run_id}/handoffs", f"job-{n}"
    return (path, lambda: w.post(path, {"logical_id": logical_id, "result_schema": SCHEMA}),
            lambda: Handoff.objects.filter(logical_id=logical_id).exists())


def result(w: World, n: int) -> tuple[str, Callable[[], httpx.Response], Callable[[], bool]]:
    h = w.handoffs[n]
    path = f"/handoffs/{h['id']}/results"
    body = {"fencing_token": h["fencing_token"], "job_fingerprint": h["job_fingerprint"], "result": {"text": f"r{n}"}}
    return path, lambda: w.post(path, body), lambda: ConsumeReceipt.objects.filter(logical_id=h["logical_id"]).exists()


def checkpoint(keyed: bool) -> Callable[[World, int], tuple[str, Callable[[], httpx.Response], Callable[[], bool]]]:
    def case(w: World, n: int) -> tuple[str, Callable[[], httpx.Response], Callable[[], bool]]:
        path, key = f"/runs/{w.run_id}/checkpoints", uuid.uuid4().hex
        body = {"boundary": "context_freeze", "cursor": {"step": n, "key": key}, **({"idempotency_key": key} if keyed else {})}
        return path, lambda: w.post(path, body), lambda: Checkpoint.objects.filter(cursor__key=key).exists()

    return case


def batch(w: World, n: int) -> tuple[str, Callable[[], httpx.Response], Callable[[], bool]]:
    path, key = f"/runs/{w.run_id}/batch", uuid.uuid4().hex
    items = [{"kind": "checkpoint", "checkpoint": {"boundary": "context_freeze", "cursor": {"step": i, "key": key}}}
             for i in range(3)]
    return path, lambda: w.post(path, {"items": items}), lambda: Checkpoint.objects.filter(cursor__key=key).count() == 3


VALUE = {"serde": "json", "data": "InN0ZXAi"}
OPEN = {"task_mode": "drafting"}


def graph_put(w: World, n: int) -> tuple[str, Callable[[], httpx.Response], Callable[[], bool]]:
    if n == 0:  # the thread opened by a request on the other graph path (its commits are not counted)
        w.ok("/graph-threads/writes", {"thread_id": "kill", "checkpoint_id": "0000", "task_id": "setup",
                                       "writes": [{"idx": 0, "channel": "step", "value": VALUE}], "open": OPEN})
    path, cp = "/graph-threads/checkpoints", f"cp-{n}"
    body = {"thread_id": "kill", "checkpoint_id": cp, "checkpoint": {"v": 1, "id": cp, "channel_versions": {"step": n + 1}},
            "metadata": {"step": n}, "blobs": [{"channel": "step", "version": n + 1,
                                               "value": {"serde": "json", "data": VALUE["data"] + "I" * 4 * n}}]}
    return path, lambda: w.post(path, body), lambda: GraphCheckpoint.objects.filter(checkpoint_id=cp).exists()


def graph_writes(w: World, n: int) -> tuple[str, Callable[[], httpx.Response], Callable[[], bool]]:
    if n == 0:
        w.ok("/graph-threads/checkpoints", {"thread_id": "kill", "checkpoint_id": "0000", "open": OPEN,
                                            "checkpoint": {"v": 1, "id": "0000", "channel_versions": {}}, "blobs": []})
    path, task = "/graph-threads/writes", f"task-{n}"
    body = {"thread_id": "kill", "checkpoint_id": "0000", "task_id": task,
            "writes": [{"idx": 0, "channel": "step", "value": {"serde": "json", "data": f"{n:04d}"}}]}
    return path, lambda: w.post(path, body), lambda: GraphWrite.objects.filter(task_id=task).exists()


def socket_checkpoint(w: World, n: int) -> tuple[str, Callable[[], httpx.Response], Callable[[], bool]]:
    """A keyed checkpoint over the API socket (its fast path: no HTTP request, no middleware)."""
    path, key = f"/runs/{w.run_id}/checkpoints", uuid.uuid4().hex
    body = {"boundary": "context_freeze", "cursor": {"step": n, "key": key}, "idempotency_key": key}

    def send() -> httpx.Response:
        ws = connect(f"{w.server.ws_url}/ws/api/", origin=Origin(w.server.url), proxy=None,
                     additional_headers={"Authorization": w.http.headers["Authorization"]}).__enter__()
        try:
            ws.send(json.dumps({"id": n, "method": "POST", "path": "/api/v1" + path, "body": json.dumps(body)}))
            try:
                answer = json.loads(ws.recv(timeout=30))
            except ConnectionClosed as exc:  # the server died before answering
                raise httpx.ReadError(str(exc)) from exc
        finally:
            ws.close()
        return httpx.Response(answer["status"], content=answer["body"].encode())

    return path, send, lambda: Checkpoint.objects.filter(idempotency_key=key).exists()


CASES = {  # name: (path regex, case, handoffs claimed first)
    "heartbeat": (r"/heartbeat$", heartbeat, 0),
    "handoff": (r"/handoffs$", handoff, 0),
    "result": (r"/results$", result, 2),
    "checkpoint": (r"/runs/\d+/checkpoints$", checkpoint(keyed=False), 0),
    "keyed checkpoint": (r"/runs/\d+/checkpoints$", checkpoint(keyed=True), 0),
    "checkpoint on the API socket": (r"/runs/\d+/checkpoints$", socket_checkpoint, 0),
    "batch": (r"/batch$", batch, 0),
    "graph put": (r"/graph-threads/checkpoints$", graph_put, 0),
    "graph writes": (r"/graph-threads/writes$", graph_writes, 0),
}


@pytest.mark.parametrize("point", ["before_commit", "after_commit"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_kill_point_fires_at_the_expected_commit(world: Callable[[str, int], World], name: str, point: str) -> None:
    regex, case, handoffs = CASES[name]
    w = world(f"{point}:2:{regex}", handoffs)
    path, send, there = case(w, 0)
    resp = send()  # the first write on the path: committed and answered
    assert resp.is_success, (resp.status_code, resp.text)
    assert there()
    path, send, there = case(w, 1)
    killed(w, point, path, send)
    assert there() is (point == "after_commit")


def test_the_full_handler_path_is_marked_too() -> None:
    """Without the lean path (API_LEAN=false: the API through Django's handler and MIDDLEWARE),
    the same kill point fires."""
    server = DaphneServer(extra_env={"NOVELFORGE_FAULT_POINTS": r"before_commit:1:/sessions$", "API_LEAN": "false"})
    try:
        token = create_token(make_project("full-handler"), name="agent", permissions=ALL_PERMISSIONS)[1]
        with httpx.Client(base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}) as http:
            with pytest.raises(httpx.TransportError):
                http.post("/sessions", json={**SESSION, "runtime_family": "full-handler"})
        assert server.proc.wait(timeout=30) == -signal.SIGKILL
        assert not Session.objects.filter(runtime_family="full-handler").exists()
        assert "fault point before_commit #1 on /api/v1/sessions: SIGKILL" in server.log_path.read_text(errors="replace")
    finally:
        server.stop()


def test_a_server_without_the_hook_is_not_killed() -> None:
    """The control: the same second write, on a server without NOVELFORGE_FAULT_POINTS, is answered."""
    server = DaphneServer()
    try:
        token = create_token(make_project("no-hook"), name="agent", permissions=ALL_PERMISSIONS)[1]
        with httpx.Client(base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}) as http:
            for _ in range(2):
                assert http.post("/sessions", json=SESSION).status_code == 201
        assert server.proc.poll() is None
    finally:
        server.stop()
