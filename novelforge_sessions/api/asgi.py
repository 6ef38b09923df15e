"""The lean ASGI path for ``/api/v1/``: one hop into a fixed thread pool, persistent connections.

Django's ASGI handler pays, per request: two tasks (the request and a disconnect listener),
async request signals, and, because the project's middleware chain mixes sync and async
(WhiteNoise, the body limit), a ``sync_to_async`` hop at every boundary, each of which starts
or borrows a thread; connections are closed (or returned to the pool) on every request. The
agent API needs none of the page middleware (sessions, CSRF: the API is token-authenticated
and csrf-exempt; auth, messages, WhiteNoise: no static files below /api/v1/). So this handler:

- reads the body on the event loop, then makes ONE hop into a fixed pool of
  ``API_THREADS`` threads that runs Django's sync handler with ``API_MIDDLEWARE`` only
  (security headers and HTTPS redirect, the Content-Security-Policy header, the body limit,
  X-Frame-Options: what API responses carried before);
- keeps each pool thread's database connection open across requests (with psycopg's pool,
  each thread holds one pooled connection instead of checking one out per request), closing
  it only when it failed, is unusable, or was left inside a transaction;
- resolves each path once (``_resolve``: the URL resolver's answer kept per path, up to
  ``RESOLVED_PATHS_MAX``): Django tries the API's patterns in order on every request, ~3.6 %
  of a checkpoint POST's GIL time under py-spy, and an agent writes to the same run's URLs;
- answers exactly as the full handler would (same views, same error shapes).

Everything else (pages, /api/docs, /api/openapi.json, static files) goes through Django's
handler with the full ``MIDDLEWARE``.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import queue
import select
import threading
from io import BytesIO
from typing import Any, Callable

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import convert_exception_to_response
from django.db import connections
from django.urls import get_resolver, set_script_prefix
from django.utils.module_loading import import_string

log = logging.getLogger("novelforge.api")

#: The path prefix this handler serves; everything else goes to Django's own handler.
PREFIX = "/api/v1/"
#: Resolved paths kept (least recently used dropped first): a path carries ids, so the cache is bounded.
RESOLVED_PATHS_MAX = 1024


@functools.lru_cache(maxsize=RESOLVED_PATHS_MAX)
def _resolve(resolver: Any, path: str) -> Any:
    """``resolver.resolve(path)``, kept. Keyed by the resolver too: a changed ``ROOT_URLCONF``
    (``clear_url_caches``, as tests do) gives a new resolver, so nothing stale is answered. A
    path that resolves to nothing raises ``Resolver404`` and is not kept."""
    return resolver.resolve(path)


class _SyncApiHandler(BaseHandler):
    """Django's sync request path with ``settings.API_MIDDLEWARE`` instead of ``MIDDLEWARE``."""

    def load_middleware(self, is_async: bool = False) -> None:  # mirrors BaseHandler's, sync only
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        handler = convert_exception_to_response(self._get_response)
        for path in reversed(settings.API_MIDDLEWARE):
            instance = import_string(path)(handler)
            if hasattr(instance, "process_view"):
                self._view_middleware.insert(0, instance.process_view)
            if hasattr(instance, "process_template_response"):
                self._template_response_middleware.append(instance.process_template_response)
            if hasattr(instance, "process_exception"):
                self._exception_middleware.append(instance.process_exception)
            handler = convert_exception_to_response(instance)
        self._middleware_chain = handler

    def resolve_request(self, request: Any) -> Any:
        """As ``BaseHandler.resolve_request``, with the match kept per path (``_resolve``). Each
        request gets its own copy, with its own ``kwargs`` (``args`` is a tuple), so nothing a
        view or view middleware does to them reaches the next request."""
        if hasattr(request, "urlconf"):
            return super().resolve_request(request)
        kept = _resolve(get_resolver(), request.path_info)
        match = object.__new__(type(kept))  # ResolverMatch refuses copy.copy (it forbids pickling)
        match.__dict__.update(kept.__dict__)
        match.kwargs = dict(kept.kwargs)
        request.resolver_match = match
        return match


def _hold_connections(dbs: list[Any]) -> None:
    """Before the response is closed: this thread keeps its connections past the request.

    ``response.close()`` sends ``request_finished``, whose ``close_old_connections`` closes
    (with the pool: hands back) every connection past its ``close_at``; with the pool
    ``CONN_MAX_AGE`` is 0, so without this each request checked a connection out again: the
    pool's check (a round trip), autocommit and the connection's set-up, ~4 % of a checkpoint
    POST's server time under py-spy. A connection the request left broken or inside a
    transaction is still closed, there or in ``_keep_or_close_connections``.
    """
    for conn in dbs:
        if conn.connection is not None:
            conn.close_at = None


def _drop_dead_connections(dbs: list[Any]) -> None:
    """Before a request: hand back a held connection the server has ended while it sat idle.

    The pool tests a connection as it leaves (``CONN_HEALTH_CHECKS``); one this thread holds
    did not leave. PostgreSQL ends a backend (a restart, ``pg_terminate_backend``, an idle
    timeout) by sending a FATAL error and closing the socket, so an idle connection whose socket
    has anything to read is no longer one to use: it goes back to the pool (which discards it),
    and the request's first query checks out a tested one. No round trip for a live
    connection (``tests/api/test_lean_path.py``: a terminated backend costs no request).
    """
    for conn in dbs:
        raw = conn.connection
        if raw is None:
            continue
        try:
            readable = bool(select.select([raw.fileno()], [], [], 0)[0])
        except Exception:  # a closed or unusable connection (no descriptor)
            readable = True
        if readable or raw.closed:
            conn.close()


def _keep_or_close_connections(dbs: list[Any]) -> None:
    """After a request: keep healthy connections open; close broken or mid-transaction ones."""
    for conn in dbs:
        if conn.connection is None:
            continue
        if conn.in_atomic_block or conn.needs_rollback:
            conn.close()
        elif conn.errors_occurred:
            if conn.is_usable():
                conn.errors_occurred = False
            else:
                conn.close()


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """On the loop: hand a worker's outcome to the request waiting for it (unless it left)."""
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class ApiThreads:
    """``API_THREADS`` threads fed by one queue: the lean path's one hop off the event loop.

    What ``loop.run_in_executor`` with a ``ThreadPoolExecutor`` did, with less on the way: the
    request is put on a ``queue.SimpleQueue`` (C, no Python-level lock or condition), a free
    thread takes it, and its outcome goes back with one ``call_soon_threadsafe``; no
    ``concurrent.futures.Future`` chained to an asyncio one, no work-item or thread-count
    bookkeeping per request. A request whose future was cancelled before a thread took it
    (the client left) is not run. At interpreter exit the threads finish what they hold
    (``shutdown``, as the executor's did).
    """

    def __init__(self, size: int, name: str) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(size)]
        for thread in self._threads:
            thread.start()
        threading._register_atexit(self.shutdown)  # as concurrent.futures does: before non-daemon joins

    def _work(self) -> None:
        take = self._queue.get
        while True:
            item = take()
            if item is None:
                return
            loop, future, fn, args = item
            if future.cancelled():
                continue
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # handed to the awaiting request, as the executor did
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop closed meanwhile: nobody is waiting
                pass

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """``fn(*args)`` on one of the threads; an awaitable of its result."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put((loop, future, fn, args))
        return future

    def shutdown(self) -> None:
        """Let each thread finish its queued work and stop; wait for them."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()


class LeanApiApplication:
    """ASGI app: ``/api/v1/`` through the lean path, the rest to ``fallback``."""

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback
        self.handler = _SyncApiHandler()
        self.handler.load_middleware()
        self.pool = ApiThreads(settings.API_THREADS, "nf-api")

    def _run(self, scope: dict[str, Any], body: bytes) -> Any:
        set_script_prefix(scope.get("root_path", "") or "/")
        # This thread's connection wrappers, looked up once per request: each ``connections[alias]``
        # is a thread-local lookup through asgiref's Local (two exceptions raised and caught).
        dbs = connections.all()
        _drop_dead_connections(dbs)
        request = ASGIRequest(scope, BytesIO(body))
        try:
            response = self.handler.get_response(request)
            content = b"".join(response) if response.streaming else response.content
            _hold_connections(dbs)
            response.close()
            return response, content
        finally:
            _keep_or_close_connections(dbs)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.fallback(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body: nothing to answer
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        response, content = await self.pool.run(self._run, scope, b"".join(chunks))
        headers = [(k.encode("ascii"), v.encode("latin1")) for k, v in response.items()]
        for cookie in response.cookies.values():
            headers.append((b"Set-Cookie", cookie.output(header="").encode("ascii").strip()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": content})


def cache_twisted_content_type() -> bool:
    """Under daphne: memoise Twisted's Content-Type parsing (a pure ``bytes -> bytes`` function).

    ``twisted.web.http._parseContentType`` builds an ``email.message.EmailMessage`` for every
    request with a body, to read the media type: under py-spy that was ~18 % of the server's
    GIL time per checkpoint POST (the issue's "4 % parsing Content-Type with the email
    package", before the rest shrank). Clients send a handful of distinct values, so a small
    LRU cache returns the same answer without the parse. Only when Twisted is already loaded
    (daphne); under uvicorn nothing is imported or changed.
    """
    import functools
    import sys

    http = sys.modules.get("twisted.web.http")
    if http is None or not hasattr(http, "_parseContentType"):
        return False
    if not hasattr(http._parseContentType, "cache_info"):
        http._parseContentType = functools.lru_cache(maxsize=64)(http._parseContentType)
    return True


def _no_request_log(self: Any, request: Any) -> None:
    """``HTTPFactory.log`` under daphne: daphne's own access log is the access log."""


def drop_twisted_request_log() -> bool:
    """Under daphne: Twisted's own per-request log line (``HTTPFactory.log``) is not formatted.

    Twisted formats a Combined Log Format line for every finished request and writes it to its
    legacy log file, which daphne routes to the ``daphne.server`` logger at INFO, below the
    level ``settings.LOGGING`` gives ``daphne``: the line was built (~1.4 % of the server's GIL
    time per checkpoint POST under py-spy) and dropped. Daphne's own access log
    (``AccessLogGenerator``, redacted by ``logredact``) is unchanged and is the one that says
    which request was answered how. Only when daphne is loaded; under uvicorn nothing changes.
    """
    import sys

    protocol = sys.modules.get("daphne.http_protocol")
    if protocol is None:
        return False
    protocol.HTTPFactory.log = _no_request_log
    return True
