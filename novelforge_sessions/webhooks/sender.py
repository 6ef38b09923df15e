"""The webhook sender: reads the event log, delivers due attempts (docs/webhooks.md#delivery).

A process of its own (``manage.py send_webhooks --loop``), beside the server: the write path
never waits for a webhook. One pass (``run_once``):

1. **Scan.** Under the cursor's row lock (``WebhookCursor``, one row: concurrent senders take
   turns), read the events after the cursor through ``events.events_after`` with one reading
   of the watermark (``events.read_marks``): only the commit-ordered prefix of the log, so an
   event whose transaction commits later can never have an id below the cursor (no event is
   skipped). Each event makes one ``WebhookDelivery`` row per matching active endpoint of its
   project (``ON CONFLICT DO NOTHING`` on (endpoint, event)); the cursor moves in the same
   transaction. A short page moves it to the highest visible id under the same marks.
2. **Claim.** ``UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED)`` sets a lease
   (``leased_until``, a random ``lease_token``) and counts the attempt, in one short
   transaction: no other sender claims a row while its attempt is in flight, and no
   transaction stays open during HTTP (an open one would hold back the log's watermark).
   One attempt per endpoint is in flight at a time (the oldest due one first), so a slow or
   dead endpoint occupies one slot, and one endpoint's deliveries go out in event order
   unless a retry reorders them.
3. **Deliver.** Each claimed attempt is one signed POST, run concurrently on a thread pool
   (a slot is refilled as soon as it frees),
   each bounded by ``WEBHOOK_TIMEOUT_SECONDS`` and a response-size cap, to the address checked
   at that moment (``addresses``). A dead endpoint costs its own attempts only.
4. **Record.** 2xx: ``delivered``. Anything else: the next attempt after an exponential
   backoff with jitter (``backoff_seconds``), or ``failed`` once that would fall after the
   delivery's 24-hour window. Recorded only while the lease is still this sender's; a sender
   killed mid-attempt leaves a lease that runs out, and the attempt is made again (at least
   once; ``webhook-id`` lets the receiver drop a duplicate).
"""
from __future__ import annotations

import json
import logging
import random
import secrets
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any
from datetime import datetime, timedelta, timezone as dt_timezone

import httpx
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.utils import timezone

from novelforge_sessions import events
from novelforge_sessions import lifecycles as lc
from novelforge_sessions.actions.lifecycle import move_rows
from novelforge_sessions.lifecycles import DeliveryState
from novelforge_sessions.models import Event
from novelforge_sessions.webhooks import addresses, signing
from novelforge_sessions.webhooks.endpoints import RETRY_WINDOW_SECONDS, secrets_in_force
from novelforge_sessions.webhooks.models import WebhookCursor, WebhookDelivery, WebhookEndpoint

log = logging.getLogger("novelforge.webhooks")

#: The first retry waits about this long; each next one twice as long, up to ``BACKOFF_MAX_SECONDS``.
BACKOFF_BASE_SECONDS = 5.0
BACKOFF_MAX_SECONDS = 3600.0
#: Each delay is stretched by a random factor in [1, 1 + JITTER): senders retrying many
#: deliveries of one endpoint do not all come back in the same second.
JITTER = 0.25
#: How much of a response is read (its status is what counts; the start of its body is kept for the error).
MAX_RESPONSE_BYTES = 64 * 1024
#: Events read per scan page; attempts in flight at once (``--concurrency``).
SCAN_PAGE = 1000
CONCURRENCY = 8
USER_AGENT = "NovelForge-Webhooks/1"

_D = WebhookDelivery._meta.db_table
_E = WebhookEndpoint._meta.db_table
_PENDING = DeliveryState.PENDING.value
_DELIVERED = DeliveryState.DELIVERED.value
_FAILED = DeliveryState.FAILED.value


def backoff_seconds(attempts: int, rnd: float | None = None) -> float:
    """The wait after the ``attempts``-th failed attempt: ``BASE * 2**(attempts-1)``, at most
    ``BACKOFF_MAX_SECONDS``, times a jitter factor in [1, 1 + JITTER)."""
    raw = min(BACKOFF_BASE_SECONDS * 2 ** max(attempts - 1, 0), BACKOFF_MAX_SECONDS)
    return raw * (1 + JITTER * (random.random() if rnd is None else rnd))


def webhook_id(endpoint_id: int, event_id: int) -> str:
    """The ``webhook-id`` of an event's delivery to an endpoint: the same on every attempt."""
    return f"msg_nf{endpoint_id}e{event_id}"


def body_of(event: Event) -> bytes:
    """``{"type", "timestamp", "data"}``: ``data`` is the event as ``GET /api/v1/events`` shows it."""
    data = events.serialize(event)
    return json.dumps({"type": event.type, "timestamp": data["created_at"], "data": data},
                      cls=DjangoJSONEncoder, separators=(",", ":")).encode()


# ---------------------------------------------------------------- 1. scan
def scan(page: int = SCAN_PAGE) -> int:
    """Turn the events after the cursor into delivery rows (one page); returns the events read
    (``page`` of them: call again)."""
    # The one cursor row, made once (two first senders: one wins). It starts at 0: each endpoint's
    # own ``start_after_event_id`` keeps it from receiving what came before its registration.
    with connection.cursor() as cur:
        cur.execute(f"INSERT INTO {WebhookCursor._meta.db_table} (id, last_event_id, updated_at) "
                    "VALUES (1, 0, now()) ON CONFLICT (id) DO NOTHING")
    with transaction.atomic():
        cursor = WebhookCursor.objects.select_for_update().get(id=1)
        marks = events.read_marks()
        endpoints = list(WebhookEndpoint.objects.filter(active=True))
        if not endpoints:
            read = []
            top = events.latest_visible_id(marks)
        else:
            by_project: dict[int, list[WebhookEndpoint]] = {}
            for endpoint in endpoints:
                by_project.setdefault(endpoint.project_id, []).append(endpoint)
            after = max(cursor.last_event_id, min(e.start_after_event_id for e in endpoints))
            read = events.events_after(Event.objects.filter(project_id__in=sorted(by_project)), after, page, marks)
            now = timezone.now()
            rows = [
                WebhookDelivery(endpoint=endpoint, event_id=event.id, event_type=event.type,
                                webhook_id=webhook_id(endpoint.id, event.id), next_attempt_at=now,
                                expires_at=now + timedelta(seconds=RETRY_WINDOW_SECONDS))
                for event in read for endpoint in by_project.get(event.project_id, ())
                if event.id > endpoint.start_after_event_id and endpoint.wants(event.type)
            ]
            WebhookDelivery.objects.bulk_create(rows, ignore_conflicts=True)
            top = read[-1].id if len(read) >= page else max(events.latest_visible_id(marks), after)
        if top > cursor.last_event_id:
            cursor.last_event_id = top
            cursor.save(update_fields=["last_event_id", "updated_at"])
    return len(read)


# ---------------------------------------------------------------- 2. claim
@dataclass(frozen=True)
class Claim:
    delivery_id: int
    lease_token: str
    event_id: int
    webhook_id: str
    attempts: int
    expires_at: datetime
    url: str
    secrets: tuple[str, ...]
    body: bytes | None = None


#: The oldest due attempt of each active endpoint that has none in flight (one per endpoint: a slow
#: or dead endpoint holds one slot, never the others'), locked with SKIP LOCKED (another sender's
#: claim in progress is passed over) and checked again once locked (a row claimed and committed by
#: another sender meanwhile has its lease now).
_CLAIM_SQL = f"""
UPDATE {_D} AS d SET leased_until = %(lease_until)s, lease_token = %(token)s, attempts = d.attempts + 1,
       last_attempt_at = %(now)s
  FROM {_E} AS e
 WHERE e.id = d.endpoint_id AND d.id IN (
       SELECT d2.id FROM {_D} AS d2
        WHERE d2.id IN (
              SELECT DISTINCT ON (c.endpoint_id) c.id FROM {_D} AS c JOIN {_E} AS ce ON ce.id = c.endpoint_id
               WHERE c.state = %(pending)s AND ce.active AND c.next_attempt_at <= %(now)s
                 AND (c.leased_until IS NULL OR c.leased_until <= %(now)s)
                 AND NOT EXISTS (SELECT 1 FROM {_D} AS f WHERE f.endpoint_id = c.endpoint_id
                                    AND f.state = %(pending)s AND f.leased_until > %(now)s)
               ORDER BY c.endpoint_id, c.next_attempt_at, c.id)
          AND d2.state = %(pending)s AND (d2.leased_until IS NULL OR d2.leased_until <= %(now)s)
        ORDER BY d2.next_attempt_at, d2.id LIMIT %(limit)s
          FOR UPDATE SKIP LOCKED)
RETURNING d.id, d.event_id, d.webhook_id, d.attempts, d.expires_at, e.url, e.secret, e.previous_secret,
          e.previous_secret_expires_at
"""


def claim(limit: int = CONCURRENCY) -> list[Claim]:
    """Lease up to ``limit`` due attempts to this sender, at most one per endpoint (none of an
    endpoint that has one in flight)."""
    now = timezone.now()
    token = secrets.token_hex(8)
    lease = timedelta(seconds=settings.WEBHOOK_TIMEOUT_SECONDS + 30)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(_CLAIM_SQL, {"lease_until": now + lease, "token": token, "now": now, "pending": _PENDING,
                                 "limit": limit})
        rows = cur.fetchall()
    claims = []
    bodies = {e.id: body_of(e) for e in Event.objects.filter(id__in=[r[1] for r in rows])}
    for did, event_id, wid, attempts, expires_at, url, secret, previous, previous_until in rows:
        endpoint = WebhookEndpoint(secret=secret, previous_secret=previous, previous_secret_expires_at=previous_until)
        claims.append(Claim(did, token, event_id, wid, attempts, expires_at, url,
                            tuple(secrets_in_force(endpoint, now)), bodies.get(event_id)))
    return claims


# ---------------------------------------------------------------- 3. deliver
@dataclass(frozen=True)
class Outcome:
    ok: bool
    status: int | None
    latency_ms: int
    error: str = ""


def _pinned_request(url: str) -> tuple[httpx.URL, dict[str, str], dict]:
    """The URL with its host replaced by the address just checked (no second DNS lookup), the
    ``Host`` header and the TLS name to present and verify."""
    scheme, host, port, found = addresses.resolve(url)
    target = httpx.URL(url)
    address = found[0]
    pinned = target.copy_with(host=address)
    default_port = 443 if scheme == "https" else 80
    host_header = (f"[{host}]" if ":" in host else host) + ("" if port == default_port else f":{port}")
    extensions = {"sni_hostname": host} if scheme == "https" else {}
    return pinned, {"Host": host_header}, extensions


def deliver(item: Claim) -> Outcome:
    """One signed POST (no database access: runs on the sender's thread pool)."""
    started = time.monotonic()
    if item.body is None:
        return Outcome(False, None, 0, "the event is no longer in the log")
    try:
        url, host_headers, extensions = _pinned_request(item.url)
    except addresses.Refused as exc:
        return Outcome(False, None, 0, f"refused: {exc}")
    headers = {
        **host_headers, "Content-Type": "application/json", "User-Agent": USER_AGENT,
        **signing.headers(webhook_id=item.webhook_id, timestamp=datetime.now(dt_timezone.utc), body=item.body,
                          secrets_in_force=list(item.secrets)),
    }
    budget = float(settings.WEBHOOK_TIMEOUT_SECONDS)
    try:
        with httpx.Client(timeout=httpx.Timeout(budget), follow_redirects=False, trust_env=False) as client:
            with client.stream("POST", url, content=item.body, headers=headers, extensions=extensions) as resp:
                kept = b""
                for chunk in resp.iter_bytes():
                    if len(kept) < 512:
                        kept += chunk[: 512 - len(kept)]
                    if resp.num_bytes_downloaded >= MAX_RESPONSE_BYTES or time.monotonic() - started > budget:
                        break
                status = resp.status_code
    except httpx.HTTPError as exc:
        return Outcome(False, None, int((time.monotonic() - started) * 1000), f"{type(exc).__name__}: {exc}"[:500])
    latency = int((time.monotonic() - started) * 1000)
    if 200 <= status < 300:
        return Outcome(True, status, latency)
    return Outcome(False, status, latency, f"HTTP {status}: {kept.decode('utf-8', 'replace')}"[:500])


# ---------------------------------------------------------------- 4. record
def record(item: Claim, outcome: Outcome) -> str | None:
    """Write the attempt's result while the lease is still ours; returns the new state (None:
    the lease had passed to another sender, whose attempt counts instead)."""
    now = timezone.now()
    fields = {"last_status": outcome.status, "last_latency_ms": outcome.latency_ms, "last_error": outcome.error,
              "leased_until": None, "lease_token": ""}
    if outcome.ok:
        state = _DELIVERED
        fields.update(delivered_at=now)
    else:
        due = now + timedelta(seconds=backoff_seconds(item.attempts))
        state = _FAILED if due > item.expires_at else _PENDING
        if state == _PENDING:
            fields.update(next_attempt_at=due)
    ours = WebhookDelivery.objects.filter(id=item.delivery_id, lease_token=item.lease_token,
                                          state=DeliveryState.PENDING)
    if not move_rows(ours, lc.WEBHOOK_DELIVERY, state, **fields):
        return None
    if not outcome.ok:
        log.warning("webhook %s attempt %s failed (%s); %s", item.webhook_id, item.attempts, outcome.error or outcome.status,
                    "giving up" if state == _FAILED else f"next at {fields['next_attempt_at'].isoformat()}")
    return state


def run_once(*, concurrency: int = CONCURRENCY, attempt: Callable[[Claim], Outcome] = deliver,
             hop: Callable[[Callable[..., Any]], Callable[..., Any]] = lambda submit: submit) -> dict[str, int]:
    """Scan the whole visible log, then deliver every due attempt (batch after batch).

    ``attempt`` makes one attempt (:func:`deliver`, or the command's traced one); ``hop`` wraps
    the thread pool's ``submit`` (the command's carries the pass's trace context to the threads)."""
    counts = {"events": 0, "attempts": 0, "delivered": 0, "failed": 0}
    while True:
        read = scan()
        counts["events"] += read
        if read < SCAN_PAGE:
            break
    # Claims only what can be in flight at once (a claimed attempt is counted and leased), and
    # refills each slot as it frees: a slow endpoint holds one slot, not the others' attempts.
    in_flight: dict = {}
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="webhook") as pool:
        submit = hop(pool.submit)
        while True:
            room = concurrency - len(in_flight)
            for item in claim(room) if room else ():
                in_flight[submit(attempt, item)] = item
            if not in_flight:
                break
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in done:
                state = record(in_flight.pop(future), future.result())
                counts["attempts"] += 1
                if state == _DELIVERED:
                    counts["delivered"] += 1
                elif state == _FAILED:
                    counts["failed"] += 1
    return counts
