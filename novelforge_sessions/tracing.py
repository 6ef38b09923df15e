"""OpenTelemetry traces: off by default, on with the standard ``OTEL_*`` environment variables.

One module sets tracing up, once per process, at start-up (:func:`setup`): the ASGI entry
(``novelforge_sessions/asgi.py``, under daphne and uvicorn alike) and the commands that run
loops (``reconcile_runtimes``, ``send_webhooks``, ``send_notifications``). Tracing is on when

- ``OTEL_SDK_DISABLED`` is not ``true``, and
- ``OTEL_TRACES_EXPORTER`` names exporters (``otlp``, ``console``, or both, comma-separated;
  ``none`` is off), or, with it unset, ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (then ``otlp``).

Everything else is the SDK's own reading of the standard variables: ``OTEL_SERVICE_NAME``
(``novelforge-sessions`` when neither it nor ``OTEL_RESOURCE_ATTRIBUTES`` names one), the OTLP/HTTP
exporter's endpoint, headers and timeout, the batch processor's ``OTEL_BSP_*``, the sampler's
``OTEL_TRACES_SAMPLER``, and ``OTEL_PYTHON_ASGI_EXCLUDED_URLS``.

When on, :func:`setup` installs the SDK's tracer provider, instruments psycopg (one span per
statement, its text with placeholders, never its parameters) and makes :func:`asgi` wrap the
application in the ASGI instrumentation (one server span per HTTP request and per websocket,
named ``METHOD /path/{id}``; string attributes go through the log redaction, so a token in a
query string is never exported). The write path opens its own spans with :func:`span`
(``checkpoint``, ``claim``, ``deliver``, ``resume``, ...): under the request's span, above the
statements they run.

When off (the default), nothing of OpenTelemetry is imported and nothing is wrapped: :func:`asgi`
and :func:`carry_context` return what they are given, and :func:`span` returns one shared object
whose ``with`` does nothing. ``tests/test_tracing.py`` checks both sides against a real server.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable

from novelforge_sessions.errors import ServiceError
from novelforge_sessions.logredact import redact

#: The service name spans carry when the environment names none.
DEFAULT_SERVICE_NAME = "novelforge-sessions"
#: The prefix of the write path's own span attributes.
PREFIX = "novelforge."
EXPORTERS = ("otlp", "console")

#: True once :func:`setup` installed tracing in this process.
ENABLED = False
_tracer: Any = None


def wanted_exporters(environ: Any = None) -> list[str]:
    """The exporters the environment asks for; empty when tracing is off."""
    environ = os.environ if environ is None else environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if named:
        names = [n.strip() for n in named.split(",") if n.strip()]
        return [] if names == ["none"] else names
    if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return ["otlp"]
    return []


def setup() -> bool:
    """Install tracing if the environment asks for it (idempotent); whether it is on.

    An unknown exporter name is a ``ValueError``, and traces asked for without the ``otel`` extra
    installed a ``RuntimeError``: the process refuses to start rather than run without the traces
    it was asked for."""
    global ENABLED, _tracer
    if ENABLED:
        return True
    names = wanted_exporters()
    if not names:
        return False
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise ValueError(f"OTEL_TRACES_EXPORTER: unsupported exporter(s) {unknown}; use otlp, console or none")

    try:
        from opentelemetry import trace
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise RuntimeError(
            f"the OTEL_* environment asks for traces, but OpenTelemetry is not installed ({exc.name}): "
            "pip install '.[otel]'"
        ) from exc

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = Resource.create({SERVICE_NAME: DEFAULT_SERVICE_NAME})
    provider = TracerProvider(resource=resource)  # flushes and shuts down at interpreter exit
    for name in names:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    PsycopgInstrumentor().instrument(tracer_provider=provider, skip_dep_check=True)
    _tracer = trace.get_tracer("novelforge_sessions")
    # The one-statement writes open their cursor themselves (commit.py), past the connection's
    # cursor factory that the instrumentation wraps: they get a traced subclass of their own, on
    # psycopg's and OpenTelemetry's public interfaces (the statement's span as the
    # instrumentation makes it: client kind, db.system, db.statement with placeholders).
    from novelforge_sessions import commit

    commit.CURSOR = _traced_cursor(trace.SpanKind.CLIENT)
    ENABLED = True
    return True


def _traced_cursor(client_kind: Any) -> type:
    """``psycopg.Cursor`` whose ``execute`` runs in a span of the statement (never its parameters)."""
    import psycopg

    class TracedCursor(psycopg.Cursor):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            text = query if isinstance(query, str) else query.decode() if isinstance(query, bytes) else str(query)
            verb = text.split(None, 1)[0].upper() if text.strip() else "SQL"
            info = self.connection.info
            with _tracer.start_as_current_span(verb, kind=client_kind, attributes={
                "db.system": "postgresql", "db.name": info.dbname, "db.user": info.user,
                "net.peer.name": info.host, "net.peer.port": info.port, "db.statement": text,
            }):
                return super().execute(query, params, **kwargs)

    return TracedCursor


# ---- the ASGI application and the lean API path's thread hop

_ID_SEGMENT = re.compile(r"/\d+(?=/|$)")


def _span_details(scope: dict[str, Any]) -> tuple[str, dict]:
    """The server span's name: the method and the path with its numeric ids as ``{id}`` (a name
    of few values, as the semantic conventions ask); a websocket's is ``WS /path``."""
    path = _ID_SEGMENT.sub("/{id}", scope.get("path", ""))
    method = scope.get("method") or ("WS" if scope.get("type") == "websocket" else "")
    return f"{method} {path}".strip(), {}


def _redact_attributes(span: Any, scope: dict[str, Any]) -> None:
    """The server span's string attributes redacted as log lines are (a token in a query string)."""
    for key, value in list((getattr(span, "attributes", None) or {}).items()):
        if isinstance(value, str):
            cleaned = redact(value)
            if cleaned != value:
                span.set_attribute(key, cleaned)


def asgi(application: Any) -> Any:
    """``application`` wrapped in the ASGI instrumentation when tracing is on; else itself."""
    if not ENABLED:
        return application
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    return OpenTelemetryMiddleware(
        application, default_span_details=_span_details, server_request_hook=_redact_attributes,
        exclude_spans=["receive", "send"],  # one span per request or socket, not one per ASGI message
    )


def carry_context(run: Callable[..., Any]) -> Callable[..., Any]:
    """``run(fn, *args)`` (a hop to another thread) made to run ``fn`` in the caller's context, so
    the request's span is the parent of what ``fn`` does; ``run`` itself when tracing is off."""
    if not ENABLED:
        return run
    import contextvars

    def run_in_context(fn: Callable[..., Any], *args: Any) -> Any:
        return run(contextvars.copy_context().run, fn, *args)

    return run_in_context


# ---- the write path's own spans


class _NoSpan:
    """What :func:`span` returns when tracing is off: a ``with`` that does nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False

    def set(self, **attributes: Any) -> None:
        pass


_NO_SPAN = _NoSpan()


def _attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    return {PREFIX + k: v for k, v in attributes.items() if v is not None}


class _Span:
    """An action's span, current while its ``with`` runs. A refusal (a ``ServiceError``) sets
    ``novelforge.outcome=refused`` and ``novelforge.refusal=<code>``; any other exception marks
    the span as an error with the exception recorded."""

    __slots__ = ("name", "attributes", "_manager", "span")

    def __init__(self, name: str, attributes: dict[str, Any]) -> None:
        self.name, self.attributes = name, attributes

    def __enter__(self) -> _Span:
        self._manager = _tracer.start_as_current_span(
            self.name, attributes=_attributes(self.attributes), record_exception=False, set_status_on_exception=False,
        )
        self.span = self._manager.__enter__()
        return self

    def set(self, **attributes: Any) -> None:
        self.span.set_attributes(_attributes(attributes))

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        if isinstance(exc, ServiceError):
            self.set(outcome="refused", refusal=exc.code)
        elif exc is not None:
            from opentelemetry.trace import Status, StatusCode

            self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        return bool(self._manager.__exit__(kind, exc, tb))


def span(name: str, **attributes: Any) -> Any:
    """``with span("checkpoint", run_id=7) as s: ...; s.set(outcome="created")``: a span named
    ``name`` with ``novelforge.``-prefixed attributes (``None`` values left out). Ids, outcomes and
    refusal codes only: never a token, a body or content."""
    if not ENABLED:
        return _NO_SPAN
    return _Span(name, attributes)


def request_span(method: str, path: str) -> Any:
    """``with request_span("POST", "/api/v1/runs/7/checkpoints") as s: ...; s.set(status=201)``: the
    server span of a request that arrives without an HTTP request of its own (a frame of the API
    socket, ``api/socket.py``), named as the ASGI instrumentation names an HTTP request's span.
    Each is the root of its own trace (a socket lives for hours: its requests are not one trace),
    linked to the span of the socket it came on; the write path's spans are its children."""
    if not ENABLED:
        return _NO_SPAN
    return _RequestSpan(method, path)


class _RequestSpan:
    __slots__ = ("name", "path", "method", "span", "_token")

    def __init__(self, method: str, path: str) -> None:
        self.method, self.path = method, path
        self.name = _span_details({"method": method, "path": path})[0]  # as an HTTP request's span is named

    def __enter__(self) -> _RequestSpan:
        from opentelemetry import context, trace

        socket = trace.get_current_span().get_span_context()
        self.span = _tracer.start_span(
            self.name, context=context.Context(), kind=trace.SpanKind.SERVER,
            links=[trace.Link(socket)] if socket.is_valid else None,
            attributes={"http.request.method": self.method, "url.path": redact(self.path)},
        )
        self._token = context.attach(trace.set_span_in_context(self.span))
        return self

    def set(self, *, status: int) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.span.set_status(Status(StatusCode.ERROR))

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        from opentelemetry import context

        context.detach(self._token)
        if exc is not None:
            self.span.record_exception(exc)
        self.span.end()
        return False
