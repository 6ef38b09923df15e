"""Oversized request bodies are refused while they stream in, with bounded server memory.

A raw socket client streams a 100 MB body, chunked or with its ``Content-Length``, to a real
server process (daphne as ``make run`` serves, and uvicorn as the production server
``python -m novelforge_sessions.serve`` serves: the ASGI layer alone, for a server that streams
bodies to the application). The server's resident memory (``/proc/<pid>/status``)
is sampled while the body goes out and after the answer. Expected, on every route:

- the answer is a 413 (the typed ``payload_too_large`` on ``/api/``, plain text on pages) that
  arrives while the client is still sending, long before the body's end;
- with a ``Content-Length`` over the limit the 413 comes before any body byte is sent;
- the server's memory grows by a small fraction of the body (nothing buffers it whole);
- nothing reaches Django (no session is created), and the server keeps serving.
"""
from __future__ import annotations

import json
import select
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from django.conf import settings

from novelforge_sessions.models import Session
from tests.support.servers import DaphneServer

# The servers need the test database (created for django_db tests); these tests write nothing,
# and the servers' refusals must write nothing either: no transaction=True flush per test.
pytestmark = pytest.mark.django_db

MB = 1024 * 1024
BODY_BYTES = 100 * MB
PIECE = 64 * 1024
#: The server may grow by this much while refusing a 100 MB body (it grew by ~100 MB before).
MAX_GROWTH = 12 * MB


@pytest.fixture(scope="module", params=["daphne", "uvicorn"])
def server(request, django_db_setup, django_db_blocker) -> Iterator[DaphneServer]:
    srv = DaphneServer(server=request.param, extra_env={"DB_POOL_MAX_SIZE": "4", "API_THREADS": "2"})
    # Warm up: the first requests import and build what every later request uses.
    for _ in range(3):
        for path in ("/login/", "/api/v1/sessions"):
            small(srv, path, b"{}")
    yield srv
    srv.stop()


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    sent: int  # body bytes the client had sent when the answer was there
    peak_growth: int  # the server's largest RSS growth seen, in bytes


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    sock.settimeout(15)
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, f"connection closed before an answer: {data!r}"
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        piece = sock.recv(65536)
        if not piece:
            break
        body += piece
    return status, headers, body


def stream(srv, path: str, *, chunked: bool, total: int = BODY_BYTES) -> Answer:
    """POST ``total`` bytes to ``path`` piece by piece, until the server answers."""
    pid = srv.proc.pid
    baseline = rss(pid)
    peak = baseline
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=15)
    try:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nContent-Type: application/json\r\n"
        head += "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {total}\r\n"
        sock.sendall(head.encode() + b"\r\n")
        piece = b"x" * PIECE
        framed = f"{PIECE:x}\r\n".encode() + piece + b"\r\n" if chunked else piece
        sent = 0
        while sent < total:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            try:
                sock.sendall(framed)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += PIECE
            if sent % MB == 0:
                peak = max(peak, rss(pid))
        else:
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        status, headers, body = read_answer(sock)
    finally:
        sock.close()
    peak = max(peak, rss(pid))
    return Answer(status, headers, body, sent, peak - baseline)


def small(srv, path: str, body: bytes) -> int:
    req = urllib.request.Request(srv.url + path, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def assert_api_413(answer: Answer, *, limit: int) -> dict:
    assert answer.status == 413, answer
    assert answer.headers["content-type"].startswith("application/json")
    error = json.loads(answer.body)["error"]
    assert error["code"] == "payload_too_large" and error["message"]
    assert error["details"]["limit"] == limit
    return error


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_an_api_body_over_the_limit_is_refused_while_streaming(server, chunked):
    answer = stream(server, "/api/v1/sessions", chunked=chunked)
    error = assert_api_413(answer, limit=settings.API_MAX_BODY_BYTES)
    if not chunked:
        assert error["details"]["size"] == BODY_BYTES
    assert answer.sent < BODY_BYTES // 4, answer.sent  # answered while the client was still sending
    assert answer.peak_growth < MAX_GROWTH, answer.peak_growth
    assert Session.objects.count() == 0


@pytest.mark.parametrize(
    ("path", "chunked"), [("/login/", True), ("/login/", False), ("/reviews/", True), ("/admin/login/", True)],
)
def test_a_page_body_over_the_limit_is_a_plain_413_while_streaming(server, path, chunked):
    answer = stream(server, path, chunked=chunked)
    assert answer.status == 413, answer
    assert answer.headers["content-type"].startswith("text/plain")
    assert str(settings.PAGE_MAX_BODY_BYTES).encode() in answer.body
    assert answer.sent < BODY_BYTES // 4, answer.sent
    assert answer.peak_growth < MAX_GROWTH, answer.peak_growth


@pytest.mark.parametrize(("path", "limit"), [("/api/v1/sessions", "API_MAX_BODY_BYTES"), ("/login/", "PAGE_MAX_BODY_BYTES")])
def test_a_declared_length_over_the_limit_is_refused_before_any_body_byte(server, path, limit):
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {getattr(settings, limit) + 1}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        status, headers, body = read_answer(sock)  # not one body byte sent
    assert status == 413, body
    assert b"100 Continue" not in body


def test_bodies_within_the_limits_still_reach_the_application(server):
    # At the limit: the API reads it (no token: 401 from the API itself, not a 413).
    assert small(server, "/api/v1/sessions", b" " * (settings.API_MAX_BODY_BYTES - 2) + b"{}") == 401
    # A page form within its limit reaches Django (no CSRF token: 403 from Django).
    assert small(server, "/login/", b"a=" + b"b" * 1000) == 403
    # Chunked, within the limit, in several pieces: the API parses the whole body.
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        body = json.dumps({"role": "writer"}).encode()
        sock.sendall(
            f"POST /api/v1/sessions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: chunked\r\n\r\n".encode()
            + b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (body[:5], body[5:]))
            + b"0\r\n\r\n"
        )
        status, _, answer = read_answer(sock)
    assert status == 401, answer
    with urllib.request.urlopen(server.url + "/healthz", timeout=5) as resp:
        assert resp.status == 200


def test_the_server_keeps_serving_after_refusals(server):
    for _ in range(3):
        assert stream(server, "/api/v1/sessions", chunked=True, total=8 * MB).status == 413
    with urllib.request.urlopen(server.url + "/healthz", timeout=5) as resp:
        assert resp.status == 200
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log
