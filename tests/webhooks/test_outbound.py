"""What one outbound attempt refuses to do (docs/webhooks.md#private-addresses, #what-a-delivery-looks-like):
follow a redirect, read more than the response-size cap, or look the host up a second time (a DNS
answer that changes between the check and the connection — rebinding — is never followed).
Real HTTP servers on loopback; the sender's own ``deliver``."""
from __future__ import annotations

import socket
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from novelforge_sessions.webhooks import addresses, signing
from novelforge_sessions.webhooks.sender import MAX_RESPONSE_BYTES, Claim, deliver
from tests.support.waits import wait_until

BODY = b'{"type":"session.created","timestamp":"2026-12-06T00:00:00+00:00","data":{}}'


class Server:
    """A loopback HTTP server whose handler is ``respond(handler)``; it keeps each request's path and Host."""

    def __init__(self, respond) -> None:
        self.requests: list[tuple[str, str]] = []
        self.sent = 0
        self.closed = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append((self.path, self.headers.get("Host", "")))
                respond(self, outer)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def attempt(url: str) -> Claim:
    return Claim(delivery_id=1, lease_token="t", event_id=1, webhook_id="msg_nf1e1", attempts=1,
                 expires_at=timezone.now() + timedelta(hours=1), url=url, secrets=(signing.new_secret(),), body=BODY)


@pytest.fixture
def servers():
    started: list[Server] = []

    def start(respond) -> Server:
        server = Server(respond)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def test_a_redirect_is_a_failed_attempt_and_is_never_followed(servers, allow_private):
    target = servers(lambda h, s: (h.send_response(204), h.send_header("Content-Length", "0"), h.end_headers()))

    def redirect(h, s):
        h.send_response(307)
        h.send_header("Location", f"http://127.0.0.1:{target.port}/internal")
        h.send_header("Content-Length", "0")
        h.end_headers()

    origin = servers(redirect)
    outcome = deliver(attempt(f"http://127.0.0.1:{origin.port}/hook"))
    assert outcome.ok is False and outcome.status == 307
    assert outcome.error.startswith("HTTP 307")
    assert origin.requests == [("/hook", f"127.0.0.1:{origin.port}")]
    assert target.requests == [], "the redirect's target was never called"


@pytest.mark.parametrize("status", [200, 500])
def test_an_endless_answer_is_read_up_to_the_cap_only(servers, allow_private, settings, status):
    settings.WEBHOOK_TIMEOUT_SECONDS = 60  # the cap, not the budget, must end the read

    def endless(h, s):
        h.send_response(status)
        h.send_header("Content-Type", "text/plain")
        h.end_headers()  # no length: the body runs until the connection closes
        chunk = b"x" * 8192
        try:
            while s.sent < 1024 * MAX_RESPONSE_BYTES:  # 64 MiB: far past the cap
                h.wfile.write(chunk)
                h.wfile.flush()
                s.sent += len(chunk)
        except OSError:  # the sender hung up once it had read its cap
            pass
        finally:
            s.closed.set()

    server = servers(endless)
    outcome = deliver(attempt(f"http://127.0.0.1:{server.port}/hook"))
    assert outcome.status == status and outcome.ok is (status == 200)
    assert outcome.latency_ms < 30_000
    wait_until(server.closed.is_set, "the sender closed the connection", timeout=30)
    assert server.sent < 1024 * MAX_RESPONSE_BYTES, "the sender stopped reading long before the end"
    assert len(outcome.error) <= 500  # the kept start of the answer is bounded too


def test_the_attempt_connects_to_the_address_it_checked_without_a_second_lookup(servers, allow_private, monkeypatch):
    """The host resolves to loopback at the check; any later lookup would answer an unroutable
    address. The request still arrives on loopback, with the host's name as ``Host``."""
    server = servers(lambda h, s: (h.send_response(204), h.send_header("Content-Length", "0"), h.end_headers()))
    real = socket.getaddrinfo
    lookups: list[str] = []

    def rebinding(host, port, *args, **kw):
        if host != "hooks.rebind.test":
            return real(host, port, *args, **kw)
        lookups.append(host)
        address = "127.0.0.1" if len(lookups) == 1 else "203.0.113.7"  # TEST-NET-3: nothing answers there
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(addresses.socket, "getaddrinfo", rebinding)
    outcome = deliver(attempt(f"http://hooks.rebind.test:{server.port}/hook"))
    assert outcome.ok is True and outcome.status == 204, outcome
    assert lookups == ["hooks.rebind.test"], "one lookup per attempt: the check's"
    assert server.requests == [("/hook", f"hooks.rebind.test:{server.port}")]
