"""Small charts for a long day: counts over time drawn from the event log.

Three series over a bounded window (the last ``WINDOW_MINUTES``), for the overview (the
manager's projects, or one of them) and for one session:

* **sessions per state** — the current counts, walked back through the window's
  ``session.created`` / ``session.transitioned`` / ``session.forgotten`` events to each sample
  time (on the session page: the one session's state, the same walk);
* **events per minute** — the window's events counted per clock minute (in SQL);
* **handoffs waiting and their age** — the waiting count now and the oldest one's age, walked
  back through the window's ``handoff.created`` / ``handoff.result_consumed`` /
  ``handoff.cancelled`` events.

Bounded and index-friendly: the window is turned into an event id once (the newest event
older than the window, found by a backward scan of the primary key that stops at the first
row older than the window), and every event query is then ``project_id IN (…) AND id > cutoff``
(index ``event_project_id``) or ``session_id = … AND id > cutoff`` (``event_session_id``): the
rows read are the window's, never the table's. And never more than ``CHART_EVENTS_MAX``: when
the log's newest ``CHART_EVENTS_MAX`` events are all inside the hour (a busy log), the window
shortens to the whole minutes they cover, and the page says so ("Last N minutes", "a busy
log"). So a page's charts cost the same at 10 k events and at 1 M, however busy the hour.
``tests/dashboard/test_charts.py`` checks the plans (no sequential scan of the event table).

The charts are SVG drawn here as geometry (rectangles, polylines: attributes, no style
attributes, so the strict CSP holds) and coloured by the state classes of ``app.css``.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Count, Min, Q, Value
from django.db.models.functions import TruncMinute
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from novelforge_sessions import event_types as ev
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.control.models import Handoff
from novelforge_sessions.dashboard.presenters import state_label
from novelforge_sessions.models import Event

WINDOW_MINUTES = 60
#: The most events the charts read: on a busier log the window shortens to its newest ones.
CHART_EVENTS_MAX = 10_000
STATE_SAMPLES = 12  # sessions per state: one stacked bar per 5 minutes
W, H = 300, 64  # viewBox of each chart
STATES = [s.value for s in rt.SessionStatus]
_STATE_EVENTS = (ev.SESSION_CREATED.name, ev.SESSION_TRANSITIONED.name, ev.SESSION_FORGOTTEN.name)
_HANDOFF_EVENTS = (ev.HANDOFF_CREATED.name, ev.HANDOFF_RESULT_CONSUMED.name, ev.HANDOFF_CANCELLED.name)


@dataclass(frozen=True)
class Scope:
    """Whose events: the manager's projects (overview) or one session (session page)."""

    project_ids: tuple[int, ...] = ()
    session_id: int | None = None

    def events(self, cutoff: int):
        qs = Event.objects.filter(id__gt=cutoff)
        if self.session_id is not None:
            return qs.filter(session_id=self.session_id)
        return qs.filter(project_id__in=self.project_ids)

    def handoffs(self):
        if self.session_id is not None:
            return Handoff.objects.filter(session_id=self.session_id)
        return Handoff.objects.filter(project_id__in=self.project_ids)


@dataclass
class Rect:
    x: float
    y: float
    w: float
    h: float
    cls: str
    title: str


@dataclass
class Chart:
    key: str
    title: str
    summary: str  # what a screen reader hears, and the caption under the chart
    rects: list[Rect] = field(default_factory=list)
    line: str = ""  # polyline points
    line_title: str = ""
    legend: list[tuple[str, str]] = field(default_factory=list)  # (class, label)
    width: int = W
    height: int = H


@dataclass
class Charts:
    start: datetime
    end: datetime
    cutoff: int
    charts: list[Chart]
    window_minutes: int = WINDOW_MINUTES
    shortened: bool = False  # a busy log: the window is its newest CHART_EVENTS_MAX events' minutes

    @property
    def events_max(self) -> str:
        return f"{CHART_EVENTS_MAX:,}"


_EVENTS = connection.ops.quote_name(Event._meta.db_table)
_ID = f"{_EVENTS}.{connection.ops.quote_name('id')}"
_CREATED = f"{_EVENTS}.{connection.ops.quote_name('created_at')}"
# One backward scan of the primary key over the log's newest CHART_EVENTS_MAX + 1 events, stopping
# at its first two rows that are older than the window or the CHART_EVENTS_MAX-th and the one below.
_WINDOW_SQL = (
    f"SELECT newest.id, newest.created_at FROM (SELECT {_ID} AS id, {_CREATED} AS created_at, "
    f"row_number() OVER (ORDER BY {_ID} DESC) AS n FROM {_EVENTS} ORDER BY {_ID} DESC LIMIT %(limit)s) AS newest "
    f"WHERE newest.created_at < %(start)s OR newest.n >= %(limit)s - 1 ORDER BY newest.id DESC LIMIT 2"
)


def window_bounds(start: datetime, now: datetime) -> tuple[int, datetime]:
    """``(cutoff, start)``: the charts read the events with ``id > cutoff`` and, for counts per
    minute, ``created_at >= start``.

    Usually ``start`` stays and ``cutoff`` is the id of the newest event older than it (0:
    none). When the log's newest ``CHART_EVENTS_MAX`` events are all newer than ``start``,
    ``cutoff`` is the id just below them and ``start`` moves up to the first whole minute they
    cover (at latest the current one): at most ``CHART_EVENTS_MAX`` rows are read, at any size."""
    with connection.cursor() as cur:
        cur.execute(_WINDOW_SQL, {"limit": CHART_EVENTS_MAX + 1, "start": start})
        rows = cur.fetchall()
    if rows and rows[0][1] < start:  # the newest event older than the window
        return rows[0][0], start
    if len(rows) < 2:  # the whole log is inside the window
        return 0, start
    (_, oldest), (cutoff, below) = rows  # the CHART_EVENTS_MAX-th newest and the one below it
    if below < start:
        return cutoff, start
    first_whole = oldest.replace(second=0, microsecond=0)
    if first_whole < oldest:
        first_whole += timedelta(minutes=1)
    return cutoff, max(start, min(first_whole, now.replace(second=0, microsecond=0)))


def _samples(start: datetime, end: datetime, n: int) -> list[datetime]:
    step = (end - start) / n
    return [start + step * (k + 1) for k in range(n)]


def _hms(t: datetime) -> str:
    return f"{t:%H:%M} UTC"


def state_counts_over_time(scope: Scope, cutoff: int, now_counts: Counter, samples: list[datetime]) -> list[Counter]:
    """The counts per state at each sample time: the current counts with the window's state
    events after that time undone (newest first)."""
    rows = list(
        scope.events(cutoff).filter(type__in=_STATE_EVENTS).order_by("-id")
        .values_list("created_at", "type", "payload__from", "payload__to", "payload__status")
    )
    counts = Counter(now_counts)
    out: list[Counter] = []
    i = 0
    for t in reversed(samples):
        while i < len(rows) and rows[i][0] > t:
            _, kind, src, dst, status = rows[i]
            if kind == ev.SESSION_TRANSITIONED.name:
                counts[dst] -= 1
                counts[src] += 1
            elif kind == ev.SESSION_CREATED.name:
                counts[status or rt.SessionStatus.CREATED.value] -= 1
            elif kind == ev.SESSION_FORGOTTEN.name and status:
                counts[status] += 1
            i += 1
        out.append(Counter({k: max(v, 0) for k, v in counts.items()}))
    out.reverse()
    return out


def events_per_minute(scope: Scope, cutoff: int, start: datetime, minutes: int) -> list[int]:
    rows = (scope.events(cutoff).filter(created_at__gte=start).annotate(m=TruncMinute("created_at"))
            .values("m").annotate(n=Count("id")).order_by())
    per = [0] * minutes
    for row in rows:
        k = int((row["m"] - start).total_seconds() // 60)
        if 0 <= k < minutes:
            per[k] += row["n"]
    return per


def handoffs_waiting_over_time(scope: Scope, cutoff: int, start: datetime,
                               samples: list[datetime]) -> list[tuple[int, float | None]]:
    """(waiting count, oldest waiting age in seconds) at each sample time.

    Now: an aggregate over the waiting handoffs. Back in time: minus those created after the
    sample that still wait, plus those that stopped waiting after it (their creation times are
    read by id: only the window's)."""
    waiting_q = Q(state__in=lc.HANDOFF_WAITING)
    agg = scope.handoffs().filter(waiting_q).aggregate(n=Count("id"), oldest=Min("created_at"))
    ended = list(
        scope.events(cutoff).filter(type__in=_HANDOFF_EVENTS[1:]).values_list("created_at", "payload__handoff_id")
    )
    ended_ids = [hid for _, hid in ended if isinstance(hid, int)]
    # One query, whatever there is, of two index reads: the window's still-waiting handoffs (from
    # the waiting handoffs' index alone: ``handoff_claimable``, ``handoff_session_open``) and the
    # ended ones' creation times (by primary key). As one ``OR`` the planner read every waiting
    # row's heap page; as a ``UNION ALL`` each half takes its own index.
    rows = list(
        scope.handoffs().filter(waiting_q, created_at__gte=start).order_by().annotate(waits=Value(True))
        .values_list("id", "created_at", "waits")
        .union(scope.handoffs().filter(id__in=ended_ids).order_by().annotate(waits=Value(False))
               .values_list("id", "created_at", "waits"), all=True))
    recent = [c for _, c, waits in rows if waits]
    created = {hid: c for hid, c, waits in rows if not waits}
    out = []
    for t in samples:
        n = agg["n"] - sum(1 for c in recent if c > t)
        oldest = agg["oldest"] if agg["oldest"] is not None and agg["oldest"] <= t else None
        for at, hid in ended:
            c = created.get(hid)
            if at > t and c is not None and c <= t:
                n += 1
                oldest = c if oldest is None or c < oldest else oldest
        out.append((max(n, 0), (t - oldest).total_seconds() if oldest else None))
    return out


def _age(seconds: float | None) -> str:
    if seconds is None:
        return _("none waiting")
    if seconds < 90:
        return _("%(n)d s") % {"n": int(seconds)}
    if seconds < 5400:
        return _("%(n)d min") % {"n": int(seconds // 60)}
    return _("%(n).1f h") % {"n": seconds / 3600}


def build(scope: Scope, now_counts: Collection[tuple[str, int]] | Counter, *, now: datetime | None = None,
          single_session: bool = False) -> Charts:
    now = now or timezone.now()
    end = now
    hour = (now - timedelta(minutes=WINDOW_MINUTES - 1)).replace(second=0, microsecond=0)
    cutoff, start = window_bounds(hour, now)
    minutes = WINDOW_MINUTES - int((start - hour).total_seconds() // 60)
    samples = _samples(start, end, STATE_SAMPLES)
    counts_now = Counter(dict(now_counts))
    charts = [
        _state_chart(state_counts_over_time(scope, cutoff, counts_now, samples), samples, single_session),
        _events_chart(events_per_minute(scope, cutoff, start, minutes), start),
        _handoffs_chart(handoffs_waiting_over_time(scope, cutoff, start, samples), samples),
    ]
    return Charts(start, end, cutoff, charts, window_minutes=minutes, shortened=start > hour)


def _state_chart(series: list[Counter], samples: list[datetime], single: bool) -> Chart:
    n = len(series)
    slot = W / n
    top = max([sum(c.values()) for c in series] + [1])
    chart = Chart("states", _("State over time") if single else _("Sessions per state"), "")
    seen: list[str] = []
    for k, (c, t) in enumerate(zip(series, samples)):
        y = float(H)
        for state in STATES:
            v = c.get(state, 0)
            if v <= 0:
                continue
            h = v / top * (H - 2)
            y -= h
            chart.rects.append(Rect(round(k * slot + 1, 2), round(y, 2), round(slot - 2, 2), round(h, 2), f"st-{state}",
                                    f"{_hms(t)}: {v} {state_label(state)}"))
            if state not in seen:
                seen.append(state)
    last = series[-1] if series else Counter()
    if single:
        current = next((state_label(s) for s in STATES if last.get(s)), "—")
        chart.summary = _("now %(state)s") % {"state": current}
    else:
        chart.summary = ", ".join(f"{last[s]} {state_label(s)}" for s in STATES if last.get(s)) or _("no sessions")
    chart.legend = [(f"st-{s}", state_label(s)) for s in STATES if s in seen]
    return chart


def _events_chart(per_minute: list[int], start: datetime) -> Chart:
    top = max(per_minute + [1])
    slot = W / len(per_minute)
    chart = Chart("events", _("Events per minute"), "")
    for k, v in enumerate(per_minute):
        if not v:
            continue
        h = max(v / top * (H - 2), 2)
        chart.rects.append(Rect(round(k * slot, 2), round(H - h, 2), round(max(slot - 1, 1), 2), round(h, 2), "bar-events",
                                f"{_hms(start + timedelta(minutes=k))}: "
                                + ngettext("%(n)d event", "%(n)d events", v) % {"n": v}))
    chart.summary = _("%(total)d in the last %(minutes)d min, at most %(most)d a minute") % {
        "total": sum(per_minute), "minutes": len(per_minute), "most": max(per_minute)}
    return chart


def _handoffs_chart(series: list[tuple[int, float | None]], samples: list[datetime]) -> Chart:
    n = len(series)
    slot = W / n
    top = max([c for c, _ in series] + [1])
    top_age = max([a or 0 for _, a in series] + [1])
    chart = Chart("handoffs", _("Handoffs waiting"), "")
    points = []
    for k, ((count, age), t) in enumerate(zip(series, samples)):
        if count:
            h = count / top * (H - 2)
            chart.rects.append(Rect(round(k * slot + 1, 2), round(H - h, 2), round(slot - 2, 2), round(h, 2), "bar-waiting",
                                    f"{_hms(t)}: " + _("%(n)d waiting, oldest %(age)s") % {"n": count, "age": _age(age)}))
        y = H - 1 - ((age or 0) / top_age) * (H - 4)
        points.append(f"{k * slot + slot / 2:.1f},{y:.1f}")
    chart.line = " ".join(points)
    chart.line_title = _("age of the oldest waiting handoff")
    count, age = series[-1] if series else (0, None)
    chart.summary = (_("%(n)d waiting now, oldest %(age)s") % {"n": count, "age": _age(age)}) if count else _("none waiting now")
    chart.legend = [("bar-waiting", _("waiting")), ("line-age", _("oldest age"))]
    return chart
