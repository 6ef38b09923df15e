"""The API over one websocket (``/ws/api/``): an agent's requests without an HTTP request each.

An agent that checkpoints at every step pays, per HTTP request, for the request's parsing,
Django's request and response objects, the middleware and django-ninja's routing: most of the
server's CPU for a checkpoint (docs/performance.md). On this socket, opened once with the
agent's bearer token, each text frame is one request of the API and each answer is the status
and body that the same HTTP request gets (docs/api.md#the-api-socket):

    → {"id": 7, "method": "POST", "path": "/api/v1/runs/12/checkpoints", "body": "{\\"boundary\\": …}"}
    ← {"id": 7, "status": 201, "body": "{\\"id\\": …}"}

``body`` is the HTTP body as a string (JSON text), both ways. Requests on one socket are
answered one at a time, in order.

- **The handshake** passes the websocket stack every socket passes (the full Origin check,
  ``live/origins.py``), then needs a ``Host`` in ``ALLOWED_HOSTS`` and a valid bearer token in
  the ``Authorization`` header; anything else is refused at the handshake (HTTP 403), nothing
  served.
- **An agent's hot write that succeeds** (``fast_routes``: a checkpoint, a LangGraph put, a
  task's graph writes) takes the fast path: the token recalled as the HTTP route recalls it
  (``apikit/auth.py``), the body parsed by the API's parser rules and validated by the route's
  schema, the route's own action and answer (shared with its view: ``api.runs.write_checkpoint``,
  ``api.graphs.put_answer``, …, each of which checks the recalled token in its statement),
  rendered through the route's response schema as django-ninja renders it.
- **Everything else** — any other route, and any request the fast path does not answer with a
  success (an unknown or changed token, a bad body, any refusal of the write: a refusal writes
  nothing) — is answered by the HTTP route itself, through the lean path's handler
  (``api/asgi.py``), with the socket's ``Host`` and ``Authorization``: one decider, one error
  shape, every refusal exactly as HTTP gives it. A body over the route's limit is the same
  typed 413 (``bodylimit``).
- **A frame that is no request** (not JSON, no ``id``, a method or path the API does not
  have) is answered with a typed 400 ``malformed_body`` carrying the frame's ``id`` when it had
  one; the socket stays open.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from time import perf_counter
from typing import Any
from urllib.parse import unquote

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from ninja.responses import NinjaJSONEncoder
from pydantic import BaseModel

from novelforge_sessions import bodylimit, faults, metrics, tracing
from novelforge_sessions.access import Caller, confirming
from novelforge_sessions.api.asgi import PREFIX, LeanApiApplication, request_connections
from novelforge_sessions.apikit.auth import caller_for_token, recalled_caller
from novelforge_sessions.apikit.base import api
from novelforge_sessions.apikit.schemas import MAX_BODY_DEPTH, loads_json, nested_deeper_than
from novelforge_sessions.errors import LOGGED, InternalError, MalformedBody, ServiceError
from novelforge_sessions.live.consumers import _bearer
from novelforge_sessions.live.origins import served_origin

log = logging.getLogger("novelforge.api")

#: The socket's route (mounted by ``novelforge_sessions.asgi``).
PATH = "ws/api/"
#: The methods a frame may name (the API's).
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
#: The longest path (with its query string) a frame may name.
MAX_PATH_CHARS = 2048
#: The longest string ``id`` a frame may carry (an integer id is any JSON integer in bigint's range).
MAX_ID_CHARS = 100
_UNSAFE_PATH = re.compile(r"[\x00-\x20\x7f]")
_NOT_AN_API_PATH = f"a frame's path is a path of the API under {PREFIX}, at most {MAX_PATH_CHARS} characters"


@dataclass(frozen=True)
class FastRoute:
    """A write the socket answers itself when it succeeds: the route's path (a ``POST``), its
    template (the metrics' route label, as HTTP labels it), its body's schema, its action and
    answer (shared with the route's view: ``(status, data)``) and its response schema."""

    path: re.Pattern[str]
    label: str
    body: type[BaseModel]
    answer: Callable[[Caller, Any, re.Match[str]], tuple[int, Any]]
    out: type[BaseModel]


@functools.cache
def fast_routes() -> tuple[FastRoute, ...]:
    """The agents' hot writes: a checkpoint, a graph put, a task's graph writes."""
    from novelforge_sessions.api import graphs, runs

    return (
        FastRoute(re.compile(rf"{re.escape(PREFIX)}runs/([0-9]{{1,19}})/checkpoints"), f"{PREFIX}runs/<run_id>/checkpoints",
                  runs.CheckpointIn, lambda who, body, match: runs.checkpoint_answer(
                      runs.write_checkpoint(who, int(match[1]), body.model_dump(exclude_unset=True))), runs.CheckpointOut),
        FastRoute(re.compile(rf"{re.escape(PREFIX)}graph-threads/checkpoints"), f"{PREFIX}graph-threads/checkpoints",
                  graphs.GraphPutIn, lambda who, body, match: graphs.put_answer(who, body), graphs.GraphPutOut),
        FastRoute(re.compile(rf"{re.escape(PREFIX)}graph-threads/writes"), f"{PREFIX}graph-threads/writes",
                  graphs.GraphWritesIn, lambda who, body, match: graphs.writes_answer(who, body), graphs.GraphWritesOut),
    )


def _fast_route(method: str, path: str) -> tuple[FastRoute, re.Match[str]] | None:
    if method != "POST":
        return None
    for route in fast_routes():
        match = route.path.fullmatch(path)
        if match is not None:
            return route, match
    return None


class FrameRefused(Exception):
    """A frame that is no request: answered 400 with the frame's ``id`` when it had a valid one."""

    def __init__(self, message: str, frame_id: Any = None) -> None:
        super().__init__(message)
        self.frame_id = frame_id


def _frame_id(value: Any) -> int | str | None:
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return value
    if isinstance(value, str) and len(value) <= MAX_ID_CHARS:
        return value
    return None


def read_frame(text: str | None) -> tuple[int | str, str, str, str, bytes]:
    """A frame's ``(id, method, path, route, body)`` (``route``: :func:`decoded_route` of the path);
    ``FrameRefused`` for anything that is not a request."""
    if text is None:
        raise FrameRefused("frames are JSON text")
    try:
        frame = json.loads(text)
    except (ValueError, RecursionError):
        raise FrameRefused("the frame is not valid JSON") from None
    if not isinstance(frame, dict):
        raise FrameRefused("a frame is a JSON object: id, method, path and body")
    frame_id = _frame_id(frame.get("id"))
    if frame_id is None:
        raise FrameRefused(f"a frame's id is an integer or a string of at most {MAX_ID_CHARS} characters")
    method, path, body = frame.get("method"), frame.get("path"), frame.get("body")
    if method not in METHODS:
        raise FrameRefused(f"a frame's method is one of {sorted(METHODS)}", frame_id)
    if not isinstance(path, str) or len(path) > MAX_PATH_CHARS or _UNSAFE_PATH.search(path):
        raise FrameRefused(_NOT_AN_API_PATH, frame_id)
    route = decoded_route(path)  # refused as the text sent would be, escapes decoded
    if not route.startswith(PREFIX) or _UNSAFE_PATH.search(route):
        raise FrameRefused(_NOT_AN_API_PATH, frame_id)
    if body is not None and not isinstance(body, str):
        raise FrameRefused("a frame's body is the request body as a string (JSON text), or null", frame_id)
    try:
        raw = b"" if body is None else body.encode()
    except UnicodeEncodeError:  # an unpaired surrogate: no UTF-8 form, so no body
        raise FrameRefused("a frame's body is not valid text", frame_id) from None
    return frame_id, method, path, route, raw


def decoded_route(path: str) -> str:
    """The route a frame's path names: without its query string, percent-decoded, as an HTTP
    server decodes a request's path (ASGI's ``path``; ``raw_path`` keeps the text as sent)."""
    return unquote(path.partition("?")[0])


def max_frame_chars() -> int:
    """The longest frame read at all: four characters for each byte of the API's body limit (a
    body's JSON text escaped in a string, non-ASCII text as ``\\u`` escapes), and the rest of the
    frame. A frame the route's limit refuses but this allows is parsed, then refused by the limit
    (413, with its ``id``). The server's own cap on a message comes first where it is lower
    (daphne: 1 MiB, then it drops the connection; uvicorn: 16 MiB)."""
    return 4 * settings.API_MAX_BODY_BYTES + MAX_PATH_CHARS + 1024


def _answer(frame_id: int | str | None, status: int, content: bytes) -> str:
    return json.dumps({"id": frame_id, "status": status, "body": content.decode()})


def _error_body(err: ServiceError) -> tuple[int, bytes]:
    """A refusal's status and body, in the API's one error shape."""
    return err.http_status, json.dumps(err.as_dict()).encode()


class ApiSocket:
    """``/ws/api/``: requests of the API as frames (module docstring); one instance per socket.

    A plain ASGI application, not a channels consumer: a consumer's dispatch hops to a thread
    before every frame (``aclose_old_connections``) and wraps every send for the session
    cookie; this socket's frames need neither (its requests run on the lean path's threads,
    which keep their own connections). Mounted by :class:`Route` (``novelforge_sessions.asgi``)."""

    def __init__(self, lean: LeanApiApplication, scope: dict[str, Any]) -> None:
        self.lean = lean
        self.scope = scope
        self.token = ""
        self.headers: list[tuple[bytes, bytes]] = []

    async def serve(self, receive: Any, send: Any) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        if not await self.connect():
            await send({"type": "websocket.close"})  # before accept: the handshake is refused (403)
            return
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] == "websocket.receive":
                await send({"type": "websocket.send", "text": await self.answer(message.get("text"))})
            elif message["type"] == "websocket.disconnect":
                return

    async def connect(self) -> bool:
        token = _bearer(self.scope)
        if token is None or served_origin(self.scope) is None:
            log.info("api socket refused: %s", "no bearer token" if token is None else "host not allowed")
            return False
        try:
            caller = await self.lean.run(self._look_up, token)
        except Exception as exc:  # the database is unavailable: refused, said in one line
            log.warning("api socket refused: the token could not be looked up (%s)", type(exc).__name__)
            return False
        if caller is None:
            log.info("api socket refused: the bearer token is not valid")
            return False
        self.token = token
        self.headers = [(name, value) for name, value in self.scope["headers"]
                        if name.lower() in (b"host", b"authorization", b"x-request-id", b"user-agent")]
        log.info("api socket open: %s", caller.label)
        return True

    def _look_up(self, token: str) -> Any:
        with request_connections(type(self), self.scope) as hold:
            caller = caller_for_token(token)
            hold()
            return caller

    async def answer(self, text: str | None) -> str:
        """One frame's answer (as text)."""
        if text is not None and len(text) > max_frame_chars():  # not even parsed: no body it carries is allowed
            _, content = bodylimit.refusal(PREFIX, size=len(text), limit=settings.API_MAX_BODY_BYTES, declared=True)
            return _answer(None, 413, content)
        try:
            frame_id, method, path, route, body = read_frame(text)
        except FrameRefused as exc:
            return _answer(exc.frame_id, *_error_body(MalformedBody(str(exc))))
        limit = bodylimit.limit_for(route)
        if len(body) > limit:
            _, content = bodylimit.refusal(route, size=len(body), limit=limit, declared=True)
            return _answer(frame_id, 413, content)
        with tracing.request_span(method, route) as span:
            try:
                status, content = await self.lean.run(self._respond, method, path, body)
            except Exception:  # a bug: a typed 500, logged, and the socket goes on (as HTTP answers one)
                log.exception("api socket: %s %s failed", method, route)
                status, content = _error_body(InternalError(LOGGED))
            span.set(status=status)
        return _answer(frame_id, status, content)

    # ---------------------------------------------------------------- on the lean path's threads
    def _respond(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        found = _fast_route(method, path)
        if found is not None:
            start = perf_counter()
            # The harness's fault hook sees this request as its middleware would.
            marked = faults.serving(path) if settings.FAULT_POINTS else contextlib.nullcontext()
            with request_connections(type(self), self.scope) as hold, marked:
                fast = self._fast(*found, path, body)
                hold()
            if fast is not None:
                if settings.METRICS_ENABLED:
                    metrics.observe_route(method, found[0].label, fast[0], perf_counter() - start)
                return fast
        response, content = self.lean.respond(self._http_scope(method, path, body), body)
        return response.status_code, response.content if content is None else content

    def _fast(self, route: FastRoute, match: re.Match[str], path: str, body: bytes) -> tuple[int, bytes] | None:
        """The fast path's answer to a write that succeeds, or None: the HTTP route answers it."""
        caller = recalled_caller(self.token)
        if caller is None:
            return None
        try:
            data = loads_json(body)
            if nested_deeper_than(data, MAX_BODY_DEPTH):
                return None
            parsed = route.body.model_validate(data)
        except Exception:  # any refusal of the body: the route answers it, in its shape
            return None
        with confirming() as confirmed:
            try:
                status, out = route.answer(caller, parsed, match)
            except ServiceError:  # a refusal writes nothing: the route answers it (a fresh token first)
                return None
            except Exception as exc:  # the database went away, a bug: answered as the route answers it
                response = api.on_exception(self._request("POST", path, body), exc)
                return response.status_code, response.content
            if caller.recheck is not None and not confirmed():  # as answered_with_a_fresh_token
                log.error("POST %s: a recalled caller's success its action did not confirm", path)
                return None
        # As django-ninja answers: the data through the response schema, dumped, its JSON encoder.
        model = out if isinstance(out, route.out) else route.out.model_validate(out)
        return status, json.dumps(model.model_dump(), cls=NinjaJSONEncoder).encode()

    def _http_scope(self, method: str, path: str, body: bytes) -> dict[str, Any]:
        raw, _, query = path.partition("?")  # raw_path and query_string as sent
        headers = [*self.headers, (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        return {
            "type": "http", "asgi": self.scope.get("asgi", {}), "http_version": "1.1", "method": method,
            "scheme": "https" if self.scope.get("scheme") == "wss" else "http", "path": decoded_route(path),
            "raw_path": raw.encode(), "root_path": self.scope.get("root_path", ""), "query_string": query.encode(),
            "headers": headers, "client": self.scope.get("client"), "server": self.scope.get("server"),
        }

    def _request(self, method: str, path: str, body: bytes) -> ASGIRequest:
        return ASGIRequest(self._http_scope(method, path, body), BytesIO(body))


class Route:
    """ASGI: the API socket's path to :class:`ApiSocket`, every other websocket to ``fallback``
    (the channels stack of the event stream)."""

    def __init__(self, lean: LeanApiApplication, fallback: Any) -> None:
        self.lean = lean
        self.fallback = fallback

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and scope["path"] == "/" + PATH:
            await ApiSocket(self.lean, scope).serve(receive, send)
        else:
            await self.fallback(scope, receive, send)
