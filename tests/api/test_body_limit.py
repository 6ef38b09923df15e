"""The ASGI body limit (novelforge_sessions.bodylimit.BodyLimitMiddleware), in process.

The served application refuses a body over its route's limit with 413 before Django sees the
request: at once on a declared ``Content-Length`` (no body read), else as soon as the pieces
received pass the limit (the rest is never asked for). Within the limit, Django gets the whole
body, unchanged, and later ``receive`` calls (``http.disconnect``) still reach the server.
With real servers and a 100 MB body: tests/live/test_body_limits.py.
"""
from __future__ import annotations

import asyncio
import json
import re

import pytest
from django.conf import settings

from novelforge_sessions.asgi import application
from novelforge_sessions.bodylimit import BodyLimitMiddleware
from novelforge_sessions.models import Session

from tests.support.factories import SESSION

PIECE = 16 * 1024


def http_scope(path: str, *, length: int | None = None) -> dict:
    headers = [(b"host", b"testserver"), (b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
        "client": ("127.0.0.1", 5000), "server": ("testserver", 80),
    }


class Client:
    """Feeds an ASGI app a body in pieces and records what it asked for and answered."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)
        self.asked = 0
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        self.asked += 1
        if self.pieces:
            body = self.pieces.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(self.pieces)}
        await asyncio.sleep(3600)  # the client stays connected; the app must not wait for this
        raise AssertionError("unreachable")

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])


def run(app, scope: dict, client: Client) -> None:
    asyncio.run(asyncio.wait_for(app(scope, client.receive, client.send), timeout=30))


def api_error(client: Client) -> dict:
    assert client.status == 413, client.sent
    headers = dict(client.sent[0]["headers"])
    assert headers[b"content-type"] == b"application/json"
    body = json.loads(client.body)
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == "payload_too_large"
    return body["error"]


@pytest.mark.django_db(transaction=True)
def test_a_declared_length_over_the_limit_is_refused_without_reading_the_body():
    limit = settings.API_MAX_BODY_BYTES
    client = Client([b"x" * PIECE] * 100)
    run(application, http_scope("/api/v1/sessions", length=limit + 1), client)
    error = api_error(client)
    assert error["details"] == {"size": limit + 1, "limit": limit}
    assert client.asked == 0
    assert Session.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_streamed_api_body_is_refused_once_it_passes_the_limit():
    limit = settings.API_MAX_BODY_BYTES
    client = Client([b"x" * PIECE] * 1000)  # 16 MB, no length declared (chunked)
    run(application, http_scope("/api/v1/sessions"), client)
    error = api_error(client)
    assert error["details"]["limit"] == limit and error["details"]["size"] > limit
    assert client.asked == limit // PIECE + 1  # not one piece more than needed to know
    assert Session.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_streamed_page_body_is_a_plain_413():
    limit = settings.PAGE_MAX_BODY_BYTES
    client = Client([b"a=" + b"x" * PIECE] * 1000)
    run(application, http_scope("/login/"), client)
    assert client.status == 413
    assert dict(client.sent[0]["headers"])[b"content-type"].startswith(b"text/plain")
    assert str(limit).encode() in client.body
    assert client.asked <= limit // PIECE + 1


def test_a_body_within_the_limit_reaches_the_app_whole_and_receive_passes_through():
    seen: list[dict] = []

    async def app(scope, receive, send):
        while True:
            message = await receive()
            seen.append(message)
            if not message.get("more_body"):
                break
        seen.append(await receive())  # after the body: the server's own receive (disconnect)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    class Disconnecting(Client):
        async def receive(self):
            if not self.pieces:
                self.asked += 1
                return {"type": "http.disconnect"}
            return await super().receive()

    pieces = [b"a" * 1000, b"b" * 1000, b""]
    client = Disconnecting(pieces)
    run(BodyLimitMiddleware(app), http_scope("/api/v1/sessions"), client)
    assert client.status == 204
    assert b"".join(m.get("body", b"") for m in seen[:-1]) == b"a" * 1000 + b"b" * 1000
    assert seen[-1] == {"type": "http.disconnect"}


@pytest.mark.django_db(transaction=True)
def test_the_served_app_still_parses_a_body_at_the_limit():
    from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
    from tests.support.factories import make_project

    _, raw = create_token(make_project("novel"), name="owner", permissions=ALL_PERMISSIONS)
    body = json.dumps(SESSION).encode()
    body += b" " * (settings.API_MAX_BODY_BYTES - len(body))  # exactly the limit
    scope = http_scope("/api/v1/sessions", length=len(body))
    scope["headers"].append((b"authorization", f"Bearer {raw}".encode()))
    client = Client([body[:PIECE], body[PIECE:]])
    run(application, scope, client)
    assert client.status == 201, client.body
    assert Session.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_every_operation_that_takes_a_body_answers_the_413_it_declares():
    """The limit covers every ``/api/`` body, so every operation that takes one
    answers 413 over it (the served application, before any route runs), and declares it."""
    from tests.api.declared import served

    limit = settings.API_MAX_BODY_BYTES
    operations = [(method, path) for path, item in served()["paths"].items() for method, op in item.items()
                  if "requestBody" in op]
    assert len(operations) >= 30
    for method, path in operations:
        assert "413" in served()["paths"][path][method]["responses"], (method, path)
        scope = http_scope(re.sub(r"\{[a-z_]+\}", "1", path), length=limit + 1)
        scope["method"] = method.upper()
        client = Client([b"x" * PIECE])
        run(application, scope, client)
        assert api_error(client)["details"] == {"size": limit + 1, "limit": limit}, (method, path)
        assert client.asked == 0
