"""``/metrics`` for Prometheus: request latency, the work waiting in the database, this process.

Off unless ``METRICS_TOKEN`` or ``METRICS_ALLOW_IPS`` is set (``settings.py``; what each metric
means, how to protect and scrape them: ``docs/observability.md``). When on:

- **Requests.** :func:`observe_requests`, the first middleware of both request paths (Django's
  ``MIDDLEWARE`` and the lean API path's ``API_MIDDLEWARE``), makes one ``observe`` per request
  into ``novelforge_http_request_duration_seconds``, labelled by method, **route template**
  (``/api/v1/sessions/<int:session_id>``, never the raw path with its ids) and status code:
  the labels stay bounded whatever the clients send. No database, no lock beyond the
  histogram's own.
- **The database**, computed when Prometheus scrapes (:class:`DatabaseCollector`): sessions by
  status, runtimes live and lease-expired, handoffs waiting and the oldest wait, review gates
  pending and the oldest, write intents awaiting approval, the event log's head id: one
  aggregate statement plus the head's two.
- **This process** (:class:`ProcessCollector`): websocket subscribers, live feeds and how far
  the furthest behind is from the log (``live/fanout.py``: the event log's consumers in this
  process), and psycopg's pool (``get_stats()``) when ``DB_POOL_MAX_SIZE`` turns it on.

Several processes: with ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multi-process mode)
the request histogram of every process sharing the directory is answered by each; without it,
each process answers its own (scrape each as its own target).

Access (:func:`refusal`): ``Authorization: Bearer <METRICS_TOKEN>`` (compared in constant time)
or a client address inside ``METRICS_ALLOW_IPS``; anything else gets the service's typed error
(401 ``unauthorized`` when a token is configured, else 403 ``forbidden``), and nothing about the
service is in it.
"""
from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from collections.abc import Callable, Iterator
from inspect import iscoroutinefunction
from time import perf_counter
from typing import Any

from django.conf import settings
from django.db import connection, connections
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.utils.decorators import sync_and_async_middleware
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from novelforge_sessions import errors, events
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.control.models import Handoff, WriteIntent
from novelforge_sessions.health import PROBES
from novelforge_sessions.live import fanout
from novelforge_sessions.models import Event, RuntimeAttachment, Session
from novelforge_sessions.notify.models import EmailCursor
from novelforge_sessions.webhooks.models import WebhookCursor, WebhookDelivery
from reviews.models import ReviewGate

log = logging.getLogger("novelforge.metrics")

PREFIX = "novelforge"

# No "_created" series beside each counter and histogram: a start time per label set doubles
# what is scraped and stored, and Prometheus does not need it to compute rates.
disable_created_metrics()

REQUEST_SECONDS = Histogram(
    f"{PREFIX}_http_request_duration_seconds",
    "Time from the first middleware to the response, by method, route template and status code.",
    ["method", "route", "status"],
)

#: Counted by the process that collects (the reconciler, ``control/graph_gc.py``): a server's
#: scrape answers it when the reconciler shares ``PROMETHEUS_MULTIPROC_DIR`` with the servers.
GRAPH_BLOBS_COLLECTED = Counter(
    f"{PREFIX}_graph_blobs_collected",
    "Graph state blobs removed by garbage collection because nothing cited them.",
)

#: Methods kept as a label value; any other becomes "other" (a client picks the method).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: Route labels of requests no URL pattern answered.
ROUTE_STATIC, ROUTE_UNMATCHED = "static", "unmatched"

# (method, route, status) → the histogram's child: labels() takes a lock and builds a tuple per
# call; the label set is bounded (methods × routes × statuses), so the children are kept.
_children: dict[tuple[str, str, int], Any] = {}


def route_of(request: HttpRequest) -> str:
    """The request's route template: the URL pattern that answered it, as written in the
    URLconf (``/api/v1/sessions/<int:session_id>``); a probe's path; ``static`` for a static
    file; ``unmatched`` for anything no pattern answered (a 404, a refused Host)."""
    match = getattr(request, "resolver_match", None)
    if match is not None and match.route is not None:
        return "/" + match.route
    path = request.path_info
    if path in PROBES:
        return path
    if path.startswith(settings.STATIC_URL):
        return ROUTE_STATIC
    return ROUTE_UNMATCHED


def observe(request: HttpRequest, status: int, seconds: float) -> None:
    observe_route(request.method or "", route_of(request), status, seconds)


def observe_route(method: str, route: str, status: int, seconds: float) -> None:
    """One request answered on ``route`` (a route template, as ``route_of`` gives it): the
    middleware's, and the API socket's for what it answers without the middleware."""
    method = method if method in METHODS else "other"
    key = (method, route, status)
    child = _children.get(key)
    if child is None:
        child = _children.setdefault(key, REQUEST_SECONDS.labels(key[0], key[1], str(status)))
    child.observe(seconds)


@sync_and_async_middleware
def observe_requests(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """Middleware (first in ``MIDDLEWARE`` and ``API_MIDDLEWARE`` when metrics are on): one
    ``observe`` per request, after the response is built."""
    if iscoroutinefunction(get_response):
        async def timed_async(request: HttpRequest) -> HttpResponse:
            start = perf_counter()
            response = await get_response(request)
            observe(request, response.status_code, perf_counter() - start)
            return response

        return timed_async

    def timed(request: HttpRequest) -> HttpResponse:
        start = perf_counter()
        response = get_response(request)
        observe(request, response.status_code, perf_counter() - start)
        return response

    return timed


# ---------------------------------------------------------------- scrape-time gauges

def _gauge(name: str, documentation: str, value: float | None = None, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", documentation, value=value, labels=labels)


def _aggregate_sql() -> str:
    """One statement, one row: every count the database gauges need (state values are parameters)."""
    sessions, runtimes = Session._meta.db_table, RuntimeAttachment._meta.db_table
    handoffs, intents, gates = Handoff._meta.db_table, WriteIntent._meta.db_table, ReviewGate._meta.db_table
    return (
        "SELECT"
        f" (SELECT coalesce(json_object_agg(status, n), '{{}}'::json) FROM (SELECT status, count(*) AS n FROM {sessions} GROUP BY status) AS s),"
        f" (SELECT count(*) FROM {runtimes} WHERE state = %(runtime_live)s AND lease_expires_at > %(now)s),"
        f" (SELECT count(*) FROM {runtimes} WHERE state = %(runtime_live)s AND lease_expires_at <= %(now)s),"
        " h.n, h.oldest, g.n, g.oldest,"
        f" (SELECT count(*) FROM {intents} WHERE state = %(intent_proposed)s)"
        f" FROM (SELECT count(*) AS n, min(created_at) AS oldest FROM {handoffs} WHERE state = ANY(%(handoff_waiting)s)) AS h,"
        f" (SELECT count(*) AS n, min(created_at) AS oldest FROM {gates} WHERE state = %(gate_pending)s) AS g"
    )


def _feed_lag_sql() -> str:
    """Per live feed of this process: the visible events of its project past its head."""
    return (
        f"SELECT f.project_id, count(e.id) FROM unnest(%(projects)s::bigint[], %(heads)s::bigint[]) AS f(project_id, head)"
        f" LEFT JOIN {Event._meta.db_table} AS e ON e.project_id = f.project_id AND e.id > f.head AND e.id <= %(top)s"
        " GROUP BY f.project_id"
    )


def _age(now: Any, oldest: Any) -> float:
    return max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0


class DatabaseCollector:
    """The work waiting in the database, read when Prometheus scrapes (any process answers the
    same numbers). If the database cannot be read, ``novelforge_database_up`` is 0 and these
    gauges are left out of that scrape (never a stale value)."""

    def describe(self) -> list[Any]:
        return []  # nothing read at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = timezone.now()
        try:
            with connection.cursor() as cur:
                cur.execute(_aggregate_sql(), {
                    "now": now, "runtime_live": rt.RuntimeState.LIVE.value,
                    "handoff_waiting": [s.value for s in lc.HANDOFF_WAITING],
                    "gate_pending": lc.GateState.PENDING.value, "intent_proposed": lc.IntentState.PROPOSED.value,
                })
                by_status, live, expired, waiting, waiting_since, gates, gates_since, proposed = cur.fetchone()
            head = events.latest_visible_id()
        except Exception:  # a scrape must answer: the database's absence is itself the metric
            log.warning("metrics: the database could not be read", exc_info=True)
            yield _gauge("database_up", "1 when this scrape read the database, else 0.", 0)
            return
        yield _gauge("database_up", "1 when this scrape read the database, else 0.", 1)
        sessions = _gauge("sessions", "Sessions by status.", labels=["status"])
        for status in rt.SessionStatus:
            sessions.add_metric([status.value], (by_status or {}).get(status.value, 0))
        yield sessions
        runtimes = _gauge("runtimes", "Runtimes recorded live: lease running (live) or run out, not yet reconciled (expired).",
                          labels=["lease"])
        runtimes.add_metric(["live"], live)
        runtimes.add_metric(["expired"], expired)
        yield runtimes
        yield _gauge("handoffs_waiting", "Handoffs waiting for a result (pending or claimed).", waiting)
        yield _gauge("handoff_oldest_wait_seconds", "Age of the oldest handoff still waiting (0: none).", _age(now, waiting_since))
        yield _gauge("review_gates_pending", "Review gates waiting for their verdicts.", gates)
        yield _gauge("review_gate_oldest_wait_seconds", "Age of the oldest pending review gate (0: none).", _age(now, gates_since))
        yield _gauge("write_intents_awaiting_approval", "Write intents proposed and not yet approved or rejected.", proposed)
        yield _gauge("event_log_head_id", "The highest visible event id (0: an empty log).", head)
        try:
            consumers = consumer_lags(now)
            deliveries = dict(WebhookDelivery.objects.values_list("state").annotate(n=Count("id")).order_by())
        except Exception:
            log.warning("metrics: the log consumers' lag could not be read", exc_info=True)
            return
        behind = _gauge("event_consumer_behind_events",
                        f"Visible events past a log consumer's cursor (counted up to {LAG_COUNT_CAP}).", labels=["consumer"])
        lag = _gauge("event_consumer_lag_seconds",
                     "Age of the oldest visible event a log consumer has not read yet (0: caught up).", labels=["consumer"])
        for name, (n, age) in consumers.items():
            behind.add_metric([name], n)
            lag.add_metric([name], age)
        yield behind
        yield lag
        by_state = _gauge("webhook_deliveries", "Webhook deliveries by state (pending: waiting for an attempt or its retry).",
                          labels=["state"])
        for state in lc.DeliveryState:
            by_state.add_metric([state.value], deliveries.get(state.value, 0))
        yield by_state


#: Counting the events past a cursor stops here (a consumer far behind costs no more than this).
LAG_COUNT_CAP = 10_000
#: The event-log consumers with a cursor in the database: the webhook sender and the mailer.
CONSUMER_CURSORS = {"webhook_sender": WebhookCursor, "mailer": EmailCursor}


def consumer_lags(now: Any) -> dict[str, tuple[int, float]]:
    """Per consumer that has run (its cursor row exists): the visible events past its cursor
    (capped) and the age of the oldest of them."""
    marks = events.read_marks()
    found = {}
    for name, model in CONSUMER_CURSORS.items():
        cursor = model.objects.filter(id=1).values_list("last_event_id", flat=True).first()
        if cursor is None:
            continue
        unread = events.visible(Event.objects.filter(id__gt=cursor), marks)
        oldest = unread.order_by("id").values_list("created_at", flat=True).first()
        found[name] = (unread.order_by("id")[:LAG_COUNT_CAP].count(), _age(now, oldest))
    return found


class ProcessCollector:
    """What this process holds: websocket subscribers, live feeds and their lag, the DB pool."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        subscribers, feeds = fanout.snapshot()
        yield _gauge("websocket_subscribers", "This process's websockets with at least one subscription.", subscribers)
        yield _gauge("live_feeds", "This process's live feeds (one per project its sockets follow).", len(feeds))
        lag = 0
        if feeds:
            try:
                top = events.latest_visible_id()
                with connection.cursor() as cur:
                    cur.execute(_feed_lag_sql(), {"projects": [p for p, _ in feeds], "heads": [h for _, h in feeds], "top": top})
                    lag = max((n for _, n in cur.fetchall()), default=0)
            except Exception:
                log.warning("metrics: the live feeds' lag could not be read", exc_info=True)
                lag = None
        if lag is not None:
            yield _gauge("live_feed_lag_events",
                         "Visible events the furthest-behind live feed of this process has not read yet.", lag)
        pool = connections["default"].pool if settings.DB_POOL_MAX_SIZE else None
        if pool is not None:
            stats = pool.get_stats()
            for key, name, doc in (
                ("pool_size", "db_pool_connections", "Connections the pool holds (in use and idle)."),
                ("pool_available", "db_pool_idle_connections", "Connections idle in the pool."),
                ("pool_max", "db_pool_max_connections", "The pool's maximum size (DB_POOL_MAX_SIZE)."),
                ("requests_waiting", "db_pool_requests_waiting", "Requests waiting for a connection."),
            ):
                yield _gauge(name, doc, stats.get(key, 0))


_DATABASE, _PROCESS = DatabaseCollector(), ProcessCollector()
_registered = False


def registry() -> CollectorRegistry:
    """What a scrape answers. One process: the default registry (the request histogram, the
    collectors above, prometheus_client's own process and Python metrics). Multi-process mode:
    a registry per scrape holding every process's request histogram, read from the shared
    directory, and the collectors above."""
    global _registered
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        scrape = CollectorRegistry()
        MultiProcessCollector(scrape)
        scrape.register(_DATABASE)
        scrape.register(_PROCESS)
        return scrape
    if not _registered:
        REGISTRY.register(_DATABASE)
        REGISTRY.register(_PROCESS)
        _registered = True
    return REGISTRY


# ---------------------------------------------------------------- access

def _bearer(request: HttpRequest) -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _address_allowed(request: HttpRequest) -> bool:
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in network for network in settings.METRICS_ALLOW_IPS)


def _error(error: errors.ServiceError, **headers: str) -> JsonResponse:
    response = JsonResponse(error.as_dict(), status=error.http_status)
    for name, value in headers.items():
        response[name] = value
    return response


def refusal(request: HttpRequest) -> JsonResponse | None:
    """``None`` when the scrape may be answered; else the typed refusal, which says nothing
    about the service."""
    token = settings.METRICS_TOKEN
    presented = _bearer(request)
    if token and presented is not None and hmac.compare_digest(presented.encode(), token.encode()):
        return None
    if _address_allowed(request):
        return None
    if token:
        return _error(errors.Unauthorized("metrics need Authorization: Bearer <METRICS_TOKEN>"),
                      **{"WWW-Authenticate": 'Bearer realm="metrics"'})
    return _error(errors.Forbidden("this address may not read the metrics"))


def view(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: the Prometheus text exposition, to an authorised scraper only."""
    if not settings.METRICS_ENABLED:
        return _error(errors.NotFound("metrics are off: set METRICS_TOKEN or METRICS_ALLOW_IPS"))
    refused = refusal(request)
    if refused is not None:
        return refused
    if request.method not in ("GET", "HEAD"):
        return _error(errors.MethodNotAllowed("metrics are read with GET"), Allow="GET, HEAD")
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
