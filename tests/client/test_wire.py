"""The clients' default transports (novelforge_client/_wire.py) against a live server, through
the loopback proxy of tests/client/proxy.py (which counts connections and can close them): calls
share one keep-alive connection, a connection the server closed while idle is replaced without
being taken for a lost answer, a retried checkpoint reuses its idempotency key, concurrent threads
each get a connection, https trusts what httpx would and checks the certificate, and an environment
proxy sends the client through httpx."""
from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from novelforge_client import AsyncClient, Client, RetryPolicy
from novelforge_client import errors as E
from novelforge_client._wire import usable
from novelforge_sessions.models import Checkpoint, Event, TranscriptEntry

from tests.client.proxy import DroppingProxy

pytestmark = pytest.mark.django_db(transaction=True)

FAST = RetryPolicy(attempts=4, backoff=0.01, max_backoff=0.05)
WRITER = dict(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli")


@pytest.fixture
def proxy(server: Any) -> Iterator[DroppingProxy]:
    p = DroppingProxy(server.port)
    yield p
    p.close()


def _running(nf: Client) -> tuple[Any, Any]:
    s = nf.create_session(**WRITER, runtime={"runtime_family": "cli", "lease_seconds": 300})
    return s, nf.start_run(s.id, cursor={"step": "outline"})


def test_calls_share_one_keep_alive_connection(proxy: DroppingProxy, token: str) -> None:
    """Every HTTP call on one keep-alive connection; the checkpoints on one API socket beside it."""
    with Client(proxy.url, token, retry=FAST) as nf:
        s, run = _running(nf)
        cps = [nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": i}) for i in range(5)]
        assert [c.seq for c in nf.checkpoints(run.id)] == [c.seq for c in cps] == [1, 2, 3, 4, 5]
    assert proxy.connections == 2
    assert proxy.forwarded[("GET", "/ws/api/")] == 1
    assert proxy.forwarded[("POST", f"/api/v1/runs/{run.id}/checkpoints")] == 5


def test_a_connection_closed_while_idle_is_replaced_not_taken_for_a_lost_answer(proxy: DroppingProxy, token: str) -> None:
    """An unkeyed write after the server closed the idle connection is sent once on a new
    connection: never ``TransportError(maybe_committed=True)``, never written twice."""
    nf = Client(proxy.url, token, retry=RetryPolicy(attempts=1))  # no retry could hide a failure
    s, run = _running(nf)
    proxy.close_connections()
    entry = nf.append_transcript(s.id, "assistant", "after the idle close")
    assert proxy.connections == 2
    assert list(TranscriptEntry.objects.filter(session_id=s.id).values_list("seq", "content")) == [
        (entry.seq, "after the idle close")]


def test_a_retried_checkpoint_sends_the_same_idempotency_key_and_the_server_holds_one_row(proxy: DroppingProxy, token: str) -> None:
    nf = Client(proxy.url, token, retry=FAST)
    s, run = _running(nf)
    proxy.drop_responses = 1
    cp = nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": "a"})
    assert proxy.dropped == 1 and proxy.forwarded[("POST", f"/api/v1/runs/{run.id}/checkpoints")] == 2
    rows = list(Checkpoint.objects.filter(run_id=run.id).values_list("id", "idempotency_key"))
    assert len(rows) == 1 and rows[0][0] == cp.id and rows[0][1]  # one row, written with a key
    # the key the retry carried is the one the first attempt wrote: a caller's own key proves it
    proxy.drop_responses = 1
    again = nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": "b"}, idempotency_key="cp-b")
    assert Checkpoint.objects.filter(run_id=run.id, idempotency_key="cp-b").get().id == again.id
    assert Event.objects.filter(type="checkpoint.recorded", session_id=s.id).count() == 2


def test_an_answer_lost_for_an_unkeyed_write_is_not_retried(proxy: DroppingProxy, token: str) -> None:
    nf = Client(proxy.url, token, retry=FAST)
    s, _ = _running(nf)
    proxy.drop_responses = 1
    with pytest.raises(E.TransportError) as info:
        nf.append_transcript(s.id, "assistant", "once")
    assert info.value.maybe_committed is True
    assert TranscriptEntry.objects.filter(session_id=s.id).count() == 1


def test_threads_share_the_client_each_on_its_own_connection(proxy: DroppingProxy, token: str) -> None:
    nf = Client(proxy.url, token, retry=FAST)
    runs = [_running(nf)[1] for _ in range(4)]
    barrier = threading.Barrier(len(runs))
    failures: list[BaseException] = []

    def checkpoint_many(run_id: int) -> None:
        try:
            barrier.wait()
            for i in range(10):
                nf.checkpoint(run_id, boundary="context_freeze", cursor={"step": i})
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=checkpoint_many, args=(r.id,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert {r.id: Checkpoint.objects.filter(run_id=r.id).count() for r in runs} == {r.id: 10 for r in runs}
    assert 1 <= proxy.connections <= len(runs)


def test_a_refused_connection_is_a_transport_error_that_was_never_sent(token: str) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(E.TransportError) as info:
            Client(f"http://127.0.0.1:{port}", token, retry=RetryPolicy(attempts=2, backoff=0.01)).append_transcript(
                1, "assistant", "never sent")
    assert info.value.maybe_committed is False


def test_an_environment_proxy_sends_the_client_through_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert usable("http://127.0.0.1:8000") and usable("https://nf.example")
    assert not usable("unix:///run/nf.sock")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert usable("http://127.0.0.1:8000") and not usable("https://nf.example")
    monkeypatch.setenv("ALL_PROXY", "http://proxy.example:3128")
    assert not usable("http://127.0.0.1:8000")


class _NotFound(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = json.dumps({"error": {"code": "not_found", "message": "no such session", "details": {}}}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A TLS HTTP server with a self-signed certificate for 127.0.0.1: (its URL, the certificate)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}", cert
    httpd.shutdown()
    httpd.server_close()


def test_https_trusts_what_httpx_would_and_checks_the_certificate_and_its_name(tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    url, cert = tls_server
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(E.TransportError) as info:  # self-signed, not in certifi: refused before sending
        Client(url, "nfs_x", retry=RetryPolicy(attempts=1)).session(1)
    assert info.value.maybe_committed is False and "CERTIFICATE_VERIFY_FAILED" in str(info.value)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # httpx's create_ssl_context trusts SSL_CERT_FILE
    with pytest.raises(E.NotFound) as found:  # the round trip over TLS: the server's typed answer
        Client(url, "nfs_x", retry=RetryPolicy(attempts=1)).session(1)
    assert found.value.status == 404 and found.value.code == "not_found"
    with pytest.raises(E.TransportError) as mismatch:  # trusted, but issued for 127.0.0.1, not localhost
        Client(url.replace("127.0.0.1", "localhost"), "nfs_x", retry=RetryPolicy(attempts=1)).session(1)
    assert mismatch.value.maybe_committed is False and "CERTIFICATE_VERIFY_FAILED" in str(mismatch.value)


def test_https_the_same_for_the_async_client(tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    url, cert = tls_server
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)

    async def session(u: str) -> None:
        async with AsyncClient(u, "nfs_x", retry=RetryPolicy(attempts=1)) as nf:
            await nf.session(1)

    with pytest.raises(E.TransportError) as info:
        asyncio.run(session(url))
    assert info.value.maybe_committed is False and "CERTIFICATE_VERIFY_FAILED" in str(info.value)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    with pytest.raises(E.NotFound):
        asyncio.run(session(url))
    with pytest.raises(E.TransportError) as mismatch:
        asyncio.run(session(url.replace("127.0.0.1", "localhost")))
    assert "CERTIFICATE_VERIFY_FAILED" in str(mismatch.value)


def test_the_async_client_keeps_one_connection_and_replaces_one_closed_while_idle(proxy: DroppingProxy, token: str) -> None:
    async def scenario() -> tuple[int, int]:
        async with AsyncClient(proxy.url, token, retry=RetryPolicy(attempts=1)) as nf:
            s = await nf.create_session(**WRITER, runtime={"runtime_family": "cli", "lease_seconds": 300})
            run = await nf.start_run(s.id, cursor={"step": "a"})
            for i in range(3):
                await nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": i})
            assert proxy.connections == 2  # the HTTP connection, and the API socket of the checkpoints
            proxy.close_connections()
            await nf.append_transcript(s.id, "assistant", "after the idle close")
            return s.id, run.id

    session_id, run_id = asyncio.run(scenario())
    assert proxy.connections == 3
    assert list(TranscriptEntry.objects.filter(session_id=session_id).values_list("content", flat=True)) == [
        "after the idle close"]
    assert Checkpoint.objects.filter(run_id=run_id).count() == 3


ANSWERS = {
    # an interim 100, then a chunked answer split inside the JSON, with a chunk extension and a trailer
    "chunked": (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" b"d;x=1\r\n{\"error\": {\"c\r\n"
                b"26\r\node\": \"not_found\", \"message\": \"gone\"}}\r\n0\r\nX-Trailer: 1\r\n\r\n"),
    # no length: the body ends where the server closes
    "close-delimited": (b"HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\n"
                        b"{\"error\": {\"code\": \"not_found\", \"message\": \"gone\"}}"),
}


@pytest.mark.parametrize("framing", sorted(ANSWERS))
def test_the_async_transport_reads_every_http_1_1_framing(framing: str) -> None:
    async def scenario() -> E.NovelForgeError:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(ANSWERS[framing])
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with AsyncClient(f"http://127.0.0.1:{port}", "nfs_x", retry=RetryPolicy(attempts=1)) as nf:
                with pytest.raises(E.NotFound) as info:
                    await nf.session(1)
                return info.value
        finally:
            server.close()

    err = asyncio.run(scenario())
    assert err.status == 404 and err.message == "gone"


def test_the_async_client_serves_a_second_event_loop_after_the_first_closed(server: Any, token: str) -> None:
    """Connections belong to the loop that opened them: a client used again under a new
    ``asyncio.run`` opens a fresh connection instead of writing to the dead loop's."""
    nf = AsyncClient(server.url, token, retry=RetryPolicy(attempts=1))

    async def create() -> int:
        return (await nf.create_session(**WRITER)).id

    first = asyncio.run(create())
    second = asyncio.run(create())

    async def read_back() -> list[int]:
        try:
            return [s.id for s in (await nf.list_sessions()).items]
        finally:
            await nf.aclose()

    assert {first, second} <= set(asyncio.run(read_back())) and first != second
