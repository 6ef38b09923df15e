"""A real webhook receiver on loopback: an ``http.server`` in a thread that verifies every
delivery's Standard Webhooks signature with the ``standardwebhooks`` package, as a customer would."""
from __future__ import annotations

import json
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError


@dataclass
class Received:
    webhook_id: str
    headers: dict[str, str]
    body: bytes
    verified_by: list[str]  # the secrets (of ``Receiver.secrets``) whose verify() passed
    status: int

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.body)


@dataclass
class Receiver:
    """``fail_first``: answer 500 to the first N requests of each ``webhook-id``.
    ``hold``: while set, requests wait for ``release`` before answering (a sender caught mid-attempt)."""

    secrets: list[str] = field(default_factory=list)
    fail_first: int = 0
    delay: float = 0.0
    received: list[Received] = field(default_factory=list)
    hold: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> "Receiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                wid = headers.get("webhook-id", "")
                verified = []
                for secret in receiver.secrets:
                    try:
                        Webhook(secret).verify(body, headers)
                        verified.append(secret)
                    except WebhookVerificationError:
                        pass
                with receiver.arrived:
                    seen = sum(1 for r in receiver.received if r.webhook_id == wid)
                    status = 500 if seen < receiver.fail_first else (200 if verified else 401)
                    receiver.received.append(Received(wid, headers, body, verified, status))
                    receiver.arrived.notify_all()
                if receiver.hold.is_set():
                    receiver.release.wait(60)
                elif receiver.delay:
                    receiver.release.wait(receiver.delay)  # a slow endpoint (not a synchronisation)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:  # the sender was killed while it waited
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/in"

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count: int, timeout: float = 30.0) -> None:
        """Until ``count`` requests have arrived (a condition, not a sleep)."""
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.received) >= count, timeout):
                raise AssertionError(f"{len(self.received)} of {count} requests arrived")

    def by_id(self) -> dict[str, list[Received]]:
        out: dict[str, list[Received]] = defaultdict(list)
        for r in list(self.received):
            out[r.webhook_id].append(r)
        return out

    def counts(self) -> Counter:
        return Counter(r.webhook_id for r in list(self.received))
