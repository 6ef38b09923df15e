"""The lean ASGI path for ``/api/v1/``: one hop into a fixed thread pool, persistent connections.

Django's ASGI handler pays, per request: two tasks (the request and a disconnect listener),
async request signals, and, because the project's middleware chain mixes sync and async
(WhiteNoise, the body limit), a ``sync_to_async`` hop at every boundary, each of which starts
or borrows a thread; connections are closed (or returned to the pool) on every request. The
agent API needs none of the page middleware (sessions, CSRF: the API is token-authenticated
and csrf-exempt; auth, messages, WhiteNoise: no static files below /api/v1/). So this handler:

- reads the body on the event loop, then makes ONE hop into a fixed pool of
  ``API_THREADS`` threads that runs Django's sync request path (:class:`ApiHandler`, built from
  Django's public pieces) with ``API_MIDDLEWARE`` only (security headers and HTTPS redirect, the
  Content-Security-Policy header, X-Frame-Options: what API responses carried before);
- refuses a Host outside ``ALLOWED_HOSTS`` first (``disallowed_host``, 400, one log line:
  ``novelforge_sessions/server/hosts.py``), before any signal, middleware or view runs;
- keeps each pool thread's database connection open across requests (with psycopg's pool,
  each thread holds one pooled connection instead of checking one out per request), closing
  it only when it failed, is unusable, or was left inside a transaction;
- resolves each path once (``_resolve``: the URL resolver's answer kept per path, up to
  ``RESOLVED_PATHS_MAX``): Django would try the API's patterns in order on every request, and
  an agent writes to the same run's URLs again and again, so the answer is worth keeping;
- answers exactly as the full handler would (same views, same error shapes).

Everything else (pages, /api/docs, /api/openapi.json, static files) goes through Django's
handler with the full ``MIDDLEWARE``.
"""
from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import queue
import select
import threading
from collections.abc import Iterator
from io import BytesIO
from typing import Any, Callable

from asyncio import iscoroutine, iscoroutinefunction

from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.asgi import ASGIRequest
from django.core.handlers.exception import convert_exception_to_response
from django.core.signals import request_started
from django.db import connections
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.urls import ResolverMatch, get_resolver, set_script_prefix, set_urlconf
from django.utils.log import log_response
from django.utils.module_loading import import_string

from novelforge_sessions.server.hosts import api_refusal, refused_host
from novelforge_sessions.tracing import carry_context

log = logging.getLogger("novelforge.api")

#: The path prefix this handler serves; everything else goes to Django's own handler.
PREFIX = "/api/v1/"
#: Resolved paths kept (least recently used dropped first): a path carries ids, so the cache is bounded.
RESOLVED_PATHS_MAX = 1024


@functools.lru_cache(maxsize=RESOLVED_PATHS_MAX)
def _resolve(resolver: Any, path: str) -> ResolverMatch:
    """``resolver.resolve(path)``, kept. Keyed by the resolver too: a changed ``ROOT_URLCONF``
    (``clear_url_caches``, as tests do) gives a new resolver, so nothing stale is answered. A
    path that resolves to nothing raises ``Resolver404`` and is not kept.

    Kept without its ``tried`` (the patterns tried before the match, a list each: about fifty
    for a path of the API, which nothing reads once it matched): a full cache held some 55,000
    lists for the garbage collector to walk on every full collection, which stopped the whole
    process for as long (about half of what it walked with 800 agents connected)."""
    match = resolver.resolve(path)
    match.tried = None  # as a ResolverMatch made without one
    return match


class ApiHandler:
    """Django's sync request path, built from public pieces, with ``settings.API_MIDDLEWARE``.

    What ``BaseHandler`` does for a sync request, without its private state: each middleware of
    ``API_MIDDLEWARE`` wraps the next (innermost: :meth:`view_response`), each behind
    ``convert_exception_to_response`` (an exception becomes Django's response for it, as between
    Django's own layers); their ``process_view``, ``process_template_response`` and
    ``process_exception`` hooks run where Django runs them. ``ATOMIC_REQUESTS`` is refused (its
    per-view opt-out is private to Django's handler): the API's actions own their transactions.
    """

    def __init__(self) -> None:
        atomic = [alias for alias, db in settings.DATABASES.items() if db.get("ATOMIC_REQUESTS")]
        if atomic:
            raise ImproperlyConfigured(f"the lean API path (API_LEAN) does not support ATOMIC_REQUESTS (databases {atomic})")
        self.view_middleware: list[Callable[..., Any]] = []
        self.template_response_middleware: list[Callable[..., Any]] = []
        self.exception_middleware: list[Callable[..., Any]] = []
        handler = convert_exception_to_response(self.view_response)
        for path in reversed(settings.API_MIDDLEWARE):
            instance = import_string(path)(handler)
            if hasattr(instance, "process_view"):
                self.view_middleware.insert(0, instance.process_view)
            if hasattr(instance, "process_template_response"):
                self.template_response_middleware.append(instance.process_template_response)
            if hasattr(instance, "process_exception"):
                self.exception_middleware.append(instance.process_exception)
            handler = convert_exception_to_response(instance)
        self.chain = handler

    def get_response(self, request: HttpRequest) -> HttpResponseBase:
        """The request through the middleware chain; a 4xx or 5xx logged as Django logs it."""
        set_urlconf(settings.ROOT_URLCONF)
        response = self.chain(request)
        if response.status_code >= 400:
            log_response("%s: %s", response.reason_phrase, request.path, response=response, request=request)
        return response

    def resolve_request(self, request: HttpRequest) -> ResolverMatch:
        """The request's view, as Django resolves it, with the match kept per path (``_resolve``).
        Each request gets its own copy, with its own ``kwargs`` (``args`` is a tuple), so nothing
        a view or view middleware does to them reaches the next request. A request with its own
        ``urlconf`` is resolved through it, uncached."""
        if hasattr(request, "urlconf"):
            set_urlconf(request.urlconf)
            match = get_resolver(request.urlconf).resolve(request.path_info)
        else:
            kept = _resolve(get_resolver(), request.path_info)
            match = object.__new__(type(kept))  # ResolverMatch refuses copy.copy (it forbids pickling)
            match.__dict__.update(kept.__dict__)
            match.kwargs = dict(kept.kwargs)
        request.resolver_match = match
        return match

    def view_response(self, request: HttpRequest) -> HttpResponseBase:
        """The innermost layer: view middleware, the view, template-response middleware."""
        callback, args, kwargs = self.resolve_request(request)
        response = None
        for process_view in self.view_middleware:
            response = process_view(request, callback, args, kwargs)
            if response:
                break
        if response is None:
            view = async_to_sync(callback) if iscoroutinefunction(callback) else callback
            try:
                response = view(request, *args, **kwargs)
            except Exception as exc:
                response = self.exception_response(exc, request)
        self.check_response(response, callback)
        if callable(getattr(response, "render", None)):
            for process_template_response in self.template_response_middleware:
                response = process_template_response(request, response)
                self.check_response(response, process_template_response)
            try:
                response = response.render()
            except Exception as exc:
                response = self.exception_response(exc, request)
        return response

    def exception_response(self, exc: Exception, request: HttpRequest) -> HttpResponseBase:
        """The first ``process_exception`` answer, else the exception goes on (to
        ``convert_exception_to_response``)."""
        for process_exception in self.exception_middleware:
            response = process_exception(request, exc)
            if response:
                return response
        raise exc

    @staticmethod
    def check_response(response: Any, callback: Any) -> None:
        """A view or middleware that answered no response is a bug, reported as Django does."""
        if response is None or iscoroutine(response):
            name = getattr(callback, "__qualname__", None) or type(callback).__name__
            what = "an unawaited coroutine" if response is not None else "None"
            raise ValueError(f"The view {callback.__module__}.{name} didn't return an HttpResponse object. It returned {what} instead.")


def _hold_connections(dbs: list[Any]) -> None:
    """Before the response is closed: this thread keeps its connections past the request.

    ``response.close()`` sends ``request_finished``, whose ``close_old_connections`` closes
    (with the pool: hands back) every connection past its ``close_at``; with the pool
    ``CONN_MAX_AGE`` is 0, so without this each request checked a connection out again: the
    pool's check (a round trip), autocommit and the connection's set-up, all of it repeated
    for nothing on a thread that serves only the API. A connection the request left broken or inside a
    transaction is still closed, there or in ``_keep_or_close_connections``.
    """
    for conn in dbs:
        if conn.connection is not None:
            conn.close_at = None


def _drop_dead_connections(dbs: list[Any]) -> None:
    """Before a request: hand back a held connection the server has ended while it sat idle.

    The pool tests a connection as it leaves (``CONN_HEALTH_CHECKS``); one this thread holds
    did not leave (and Django's own check, one query, is what this replaces). PostgreSQL ends a backend (a restart, ``pg_terminate_backend``, an idle
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
            readable = has_input(raw.fileno())
        except Exception:  # a closed or unusable connection (no descriptor)
            readable = True
        if readable or raw.closed:
            conn.close()
        elif conn.health_check_done is False:
            # request_started marked it unchecked; the select() above was this request's check,
            # so its first query makes no round trip of CONN_HEALTH_CHECKS' own.
            conn.health_check_done = True


def has_input(fd: int) -> bool:
    """Whether descriptor ``fd`` has something to read (or is closed) now, without waiting.

    ``poll()``, which takes any descriptor number: ``select()`` refuses one past FD_SETSIZE
    (1,024), which a server holding that many sockets gives every connection it opens later (so
    each of them was taken for dead and dropped before every request)."""
    if not hasattr(select, "poll"):  # no poll() (Windows): select(), below FD_SETSIZE
        return bool(select.select([fd], [], [], 0)[0])
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


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


@contextlib.contextmanager
def request_connections(sender: Any, scope: dict[str, Any]) -> Iterator[Callable[[], None]]:
    """One request's database connections on a lean-path thread, as Django's handler has them
    around a request: ``request_started`` first (``close_old_connections``: obsolete or broken
    ones go), a held connection the server ended while idle handed back; afterwards broken or
    mid-transaction ones closed. It yields ``hold``, to call once the answer is built (before
    ``request_finished``): this thread then keeps its healthy connections past the request.
    Used by :meth:`LeanApiApplication.respond` and the API socket (``api/socket.py``)."""
    request_started.send(sender=sender, scope=scope)
    # This thread's connection wrappers, looked up once per request: each ``connections[alias]``
    # is a thread-local lookup through asgiref's Local (two exceptions raised and caught).
    dbs = connections.all()
    _drop_dead_connections(dbs)
    try:
        yield functools.partial(_hold_connections, dbs)
    finally:
        _keep_or_close_connections(dbs)


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
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self.work, name=f"{name}_{i}", daemon=True) for i in range(size)]
        for thread in self.threads:
            thread.start()
        # At exit the threads (daemons: they never hold the interpreter up) finish what they hold:
        # atexit runs while daemon threads still run.
        atexit.register(self.shutdown)

    def work(self) -> None:
        take = self.jobs.get
        while True:
            item = take()
            if item is None:  # stopped: the connections this thread kept are closed, not left to the exit
                with contextlib.suppress(Exception):  # a connection that fails to close is gone with the process
                    connections.close_all()
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
        self.jobs.put((loop, future, fn, args))
        return future

    def shutdown(self) -> None:
        """Let each thread finish its queued work, close its database connections and stop; wait
        for them."""
        for _ in self.threads:
            self.jobs.put(None)
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join()


class LeanApiApplication:
    """ASGI app: ``/api/v1/`` through the lean path, the rest to ``fallback``."""

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback
        self.handler = ApiHandler()
        self.pool = ApiThreads(settings.API_THREADS, "nf-api")
        # The hop into the pool: with tracing on, the request's context (its span) goes along, so
        # the view's spans are its children; off, this is ``pool.run`` itself (no cost per request).
        self.run = carry_context(self.pool.run)

    def respond(self, scope: dict[str, Any], body: bytes) -> Any:
        set_script_prefix(scope.get("root_path", "") or "/")
        request = ASGIRequest(scope, BytesIO(body))
        refused = refused_host(request)
        if refused is not None:  # nothing runs for a Host outside ALLOWED_HOSTS: no signal, no view
            return api_refusal(request, refused), None
        with request_connections(type(self), scope) as hold:
            response = self.handler.get_response(request)
            content = b"".join(response) if response.streaming else response.content
            hold()
            response.close()  # request_finished, as Django's handler has it sent
            request.close()
            return response, content

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
        response, content = await self.run(self.respond, scope, b"".join(chunks))
        if content is None:  # refused before anything ran
            content = response.content
        headers = [(k.encode("ascii"), v.encode("latin1")) for k, v in response.items()]
        for cookie in response.cookies.values():
            headers.append((b"Set-Cookie", cookie.output(header="").encode("ascii").strip()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": content})
