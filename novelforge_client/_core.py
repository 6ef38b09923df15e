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
  first request wrote), a handoff (its
  ``logical_id``: an identical repeat is 200 with the same handoff), a result delivery (the
  handoff's logical result: a repeat is 200 ``already_consumed`` with the original outcome and
  the same receipt), a write intent (its ``idempotency_key``: a repeat replays it), executing a
  write intent (replayed), a verdict (an identical resubmission is 200 with the same verdict);
- writes idempotent by definition: heartbeats and lease renewals, detach, close.

Every other write (create a session, attach, start a run, a batch, transcript, transition,
open a gate, claim, resume) has no idempotency key in the API today, so when it may have been
committed the client raises :class:`TransportError` with ``maybe_committed=True`` instead of
guessing: read the state back (the call's ``GET``) and decide.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

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

    def __post_init__(self) -> None:
        if self.method == "GET":
            self.idempotent = True

    def request_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        params = {k: v for k, v in self.params.items() if v is not None}
        if params:
            kwargs["params"] = params
        if self.body is not None:
            kwargs["json"] = self.body
        return kwargs


def body_of(model_cls: type[BaseModel], **fields: Any) -> dict[str, Any]:
    """Validate a request body against its model (typed errors before the round trip) and dump
    only the fields given, the way the server's defaults expect."""
    given = {k: v for k, v in fields.items() if v is not None}
    return model_cls.model_validate(given).model_dump(mode="json", exclude_unset=True, by_alias=True)


_adapters: dict[Any, TypeAdapter] = {}


def decode(call: Call[T], response: httpx.Response) -> T:
    """The model of a successful answer, or the typed exception of a refusal."""
    if response.status_code >= 400:
        try:
            payload = response.json()
        except ValueError:
            payload = None
        raise error_for(response.status_code, payload)
    if call.model is None or response.status_code == 204 or not response.content:
        result: Any = None
    else:
        adapter = _adapters.get(call.model)
        if adapter is None:
            adapter = _adapters[call.model] = TypeAdapter(call.model)
        result = adapter.validate_python(response.json())
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
