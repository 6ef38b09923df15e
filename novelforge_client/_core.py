"""The part of the client shared by :class:`Client` and :class:`AsyncClient`: what a call is,
when it may be retried, and how an answer becomes a model or a typed exception. No I/O here.

Retries. A request that failed *before it was sent* (no connection, connect timeout, a pool
timeout) is retried whatever it is: the server never saw it. A request that may have reached the
server (the connection dropped while waiting for the answer, a read timeout, or a 502/503/504 from
a proxy in front) is retried only when repeating it cannot act twice, because the API makes the
repeat answer the first outcome:

- reads (GET);
- writes that carry the logical id or idempotency key of what they create: a checkpoint (the
  client sends a fresh ``idempotency_key`` with each one: a repeat is 200 with the checkpoint the
  first request wrote); starting a run, attaching a runtime, a batch, a handoff and opening a
  review gate (a fresh ``idempotency_key`` with each: a repeat answers what the first request
  answered, the same status and object; a handoff's ``logical_id`` too), a result delivery (the
  handoff's logical result: a repeat is 200 ``already_consumed`` with the original outcome and
  the same receipt), a write intent (its ``idempotency_key``: a repeat replays it), executing a
  write intent (replayed), a verdict (an identical resubmission is 200 with the same verdict);
- writes idempotent by definition: heartbeats and lease renewals, detach, close.

Every other write (create a session, transcript, transition, claim, resume) has no idempotency
key in the API today, so when it may have been
committed the client raises :class:`TransportError` with ``maybe_committed=True`` instead of
guessing: read the state back (the call's ``GET``) and decide.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar
from urllib.parse import urlencode

import httpx
from pydantic import BaseModel, TypeAdapter

from novelforge_client.errors import NovelForgeError, TransportError, error_for

T = TypeVar("T")

#: Statuses a proxy or a restarting server answers while the request may or may not have run.
RETRY_STATUSES = frozenset({502, 503, 504})

#: Failures where the request never left this process: always safe to send again.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: Failures after the request may have reached the server.
MAYBE_SENT = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadTimeout,
              httpx.WriteTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry (exponential backoff with jitter, capped)."""

    attempts: int = 5
    backoff: float = 0.2
    max_backoff: float = 5.0

    def delay(self, attempt: int) -> float:
        base = min(self.max_backoff, self.backoff * (2 ** (attempt - 1)))
        return base * (0.5 + random.random() / 2)


@dataclass
class Call(Generic[T]):
    """One API operation: method, path, body, query, the model of its answer, and whether a repeat
    after an ambiguous failure is safe (see the module doc). ``then`` post-processes the model
    (the client remembers runtime ids); ``none_on`` maps statuses to ``None`` (e.g. 204)."""

    method: str
    path: str
    model: Any = None
    body: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    idempotent: bool = False
    then: Callable[[Any], Any] | None = None
    #: Over the API socket when the client has one (``_wire.Socket``): the checkpoint write.
    socket: bool = False
    _content: bytes | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.method == "GET":
            self.idempotent = True

    def request_kwargs(self) -> dict[str, Any]:
        """The call as ``httpx`` request arguments (the body serialized once: see :meth:`content`)."""
        kwargs: dict[str, Any] = {}
        params = {k: v for k, v in self.params.items() if v is not None}
        if params:
            kwargs["params"] = params
        content = self.content()
        if content is not None:
            kwargs["content"] = content
            kwargs["headers"] = JSON_CONTENT
        return kwargs

    def target(self) -> str:
        """The path with its query string (``None`` parameters left out, lists repeated, booleans
        ``true``/``false``: what ``httpx`` sends for ``params=``)."""
        pairs = [(k, _query_value(item)) for k, v in self.params.items() if v is not None
                 for item in (v if isinstance(v, (list, tuple)) else (v,))]
        return f"{self.path}?{urlencode(pairs)}" if pairs else self.path

    def content(self) -> bytes | None:
        """The JSON body, serialized once per call (every retry sends these same bytes, idempotency
        key included), the way ``httpx``'s ``json=`` serializes it."""
        if self.body is None:
            return None
        if self._content is None:
            self._content = json.dumps(self.body, ensure_ascii=False, separators=(",", ":"),
                                       allow_nan=False).encode("utf-8")
        return self._content


#: The header of a JSON request body.
JSON_CONTENT = {"Content-Type": "application/json"}


def _query_value(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


def body_of(model_cls: type[BaseModel], **fields: Any) -> dict[str, Any]:
    """Validate a request body against its model (typed errors before the round trip) and dump
    only the fields given, the way the server's defaults expect."""
    given = {k: v for k, v in fields.items() if v is not None}
    return model_cls.model_validate(given).model_dump(mode="json", exclude_unset=True, by_alias=True)


_adapters: dict[Any, TypeAdapter] = {}


def decode(call: Call[T], response: httpx.Response) -> T:
    """The model of a successful answer, or the typed exception of a refusal."""
    return decode_body(call, response.status_code, response.content)


def decode_body(call: Call[T], status: int, content: bytes) -> T:
    """:func:`decode` from the status and body bytes. The answer is validated against the call's
    model straight from the JSON bytes (one pass, no intermediate dicts); a body that is not the
    model raises pydantic's ``ValidationError``."""
    if status >= 400:
        try:
            payload = json.loads(content) if content else None
        except ValueError:
            payload = None
        raise error_for(status, payload)
    if call.model is None or status == 204 or not content:
        result: Any = None
    else:
        adapter = _adapters.get(call.model)
        if adapter is None:
            adapter = _adapters[call.model] = TypeAdapter(call.model)
        result = adapter.validate_json(content)
    return call.then(result) if call.then is not None else result


def should_retry(call: Call[Any], *, exc: Exception | None = None, status: int | None = None) -> bool:
    """Whether this failure of this call may be retried (the rules of the module doc)."""
    if exc is not None and isinstance(exc, NOT_SENT):
        return True
    if exc is not None and isinstance(exc, MAYBE_SENT):
        return call.idempotent
    if status is not None and status in RETRY_STATUSES:
        return call.idempotent
    return False


def transport_error(call: Call[Any], exc: Exception) -> NovelForgeError:
    sent = not isinstance(exc, NOT_SENT)
    return TransportError(f"{call.method} {call.path}: {type(exc).__name__}: {exc}", maybe_committed=sent)
