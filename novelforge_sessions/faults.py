"""A test-only fault hook: the server SIGKILLs itself at a chosen commit (used by ``harness/``).

Off unless the process starts with ``NOVELFORGE_FAULT_POINTS`` in its environment; it is read
once, by the settings, and nothing a request sends can turn it on, move it or read it. The
settings refuse it (``ImproperlyConfigured``) with a deployment's own ``SECRET_KEY`` or with
``REQUIRE_SECRET_KEY=true``: it only ever runs with the public development key.

Format: comma-separated ``POINT:N:PATH_REGEX`` — at the N-th database commit made while serving
a request whose path matches ``PATH_REGEX`` (``re.search``), the process kills itself with
SIGKILL, either just *before* the commit (``before_commit``: the transaction is lost with the
connection) or just *after* it (``after_commit``: committed, but no response is ever sent).
Example: ``NOVELFORGE_FAULT_POINTS='after_commit:3:/results$'``.

Which commits it sees, through public interfaces only:

- every real commit of a transaction: Django's ``connection_created`` signal hands over each
  new (or, with psycopg's pool, handed-out-again) psycopg connection, and ``install`` replaces
  that instance's public ``commit`` method, once, with one that fires ``before_commit`` and
  ``after_commit`` around it. ``transaction.atomic()`` ends its outermost block with that
  method. A ``commit()`` with no transaction open on the server (psycopg then sends nothing:
  the transaction was already ended, e.g. by a statement carrying its own ``COMMIT``) is not a
  commit and is not counted;
- a write that is one statement executed as its own transaction in autocommit mode commits
  without calling ``commit()``: the code that executes it calls ``fire("before_commit")`` just
  before the statement and ``fire("after_commit")`` just after it returns.

Counted per process: a restarted server counts again from zero (``harness/`` restarts it).
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import re
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from psycopg.pq import TransactionStatus

POINTS = ("before_commit", "after_commit")
ENV = "NOVELFORGE_FAULT_POINTS"


@dataclass
class FaultPoint:
    point: str
    nth: int
    path: re.Pattern[str]
    hits: int = field(default=0)


def parse(spec: str) -> list[FaultPoint]:
    """``POINT:N:PATH_REGEX[,…]`` → fault points; ``ValueError`` names what is wrong."""
    out = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        point, sep1, rest = item.partition(":")
        nth, sep2, path = rest.partition(":")
        if not (sep1 and sep2) or point not in POINTS:
            raise ValueError(f"{ENV}: {item!r} is not POINT:N:PATH_REGEX with POINT one of {', '.join(POINTS)}")
        if not nth.isdigit() or int(nth) < 1:
            raise ValueError(f"{ENV}: N must be a positive integer in {item!r}")
        try:
            pattern = re.compile(path or ".")
        except re.error as exc:
            raise ValueError(f"{ENV}: bad path regex in {item!r}: {exc}") from None
        out.append(FaultPoint(point, int(nth), pattern))
    if not out:
        raise ValueError(f"{ENV} is set but names no fault point")
    return out


_current_path: contextvars.ContextVar[str | None] = contextvars.ContextVar("nf_fault_path", default=None)
_points: list[FaultPoint] = []
_lock = threading.Lock()
#: The psycopg connections whose ``commit`` is already wrapped (``_watch``).
_watched: weakref.WeakSet[Any] = weakref.WeakSet()


def fire(point: str) -> None:
    path = _current_path.get()
    if path is None:
        return
    for fp in _points:
        if fp.point != point or not fp.path.search(path):
            continue
        with _lock:
            fp.hits += 1
            due = fp.hits == fp.nth
        if due:
            sys.stderr.write(f"fault point {point} #{fp.nth} on {path}: SIGKILL\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def _watch(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: fire the kill points around this psycopg connection's
    real commits. Idempotent: psycopg's pool hands the same connection out again, and Django
    sends the signal each time."""
    raw = connection.connection
    if raw is None or raw in _watched:
        return
    real: Callable[[], Any] = raw.commit

    def commit() -> Any:
        if raw.info.transaction_status == TransactionStatus.IDLE:
            return real()  # nothing to commit: psycopg sends nothing, so no commit to kill at
        fire("before_commit")
        result = real()
        fire("after_commit")
        return result

    raw.commit = commit
    _watched.add(raw)


def install(points: list[FaultPoint]) -> None:
    """Arm ``points`` and watch every connection Django opens from now on (idempotent). Called
    by the app's ready(), before any request."""
    from django.db.backends.signals import connection_created

    _points[:] = points
    connection_created.connect(_watch, dispatch_uid="novelforge_sessions.faults")


@contextlib.contextmanager
def serving(path: str) -> Iterator[None]:
    """Marks ``path`` as the request being served: what ``FaultMiddleware`` does for a request,
    for a request served without the middleware (the API socket's fast path, ``api/socket.py``)."""
    token = _current_path.set(path)
    try:
        yield
    finally:
        _current_path.reset(token)


class FaultMiddleware:
    """Marks the request being served: first in MIDDLEWARE and in API_MIDDLEWARE (the lean API
    path, api/asgi.py) when the hook is configured (settings.py), in neither otherwise."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        with serving(request.path):
            return self.get_response(request)
