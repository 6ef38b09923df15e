"""Charts for a long day (dashboard/charts.py): the series are walked back from the event log
over a bounded window, and no query reads the event table by a sequential scan."""
from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from novelforge_sessions.control.models import Handoff
from novelforge_sessions.dashboard import charts
from novelforge_sessions.models import Event, Session
from tests.dashboard.test_handoffs import claim, deliver, handoff

pytestmark = pytest.mark.django_db

EVENT_TABLE = Event._meta.db_table


def shift(minutes: float, **where) -> None:
    """Move rows back in time in the database (what a long day looks like)."""
    delta = timedelta(minutes=minutes)
    for model, field, flt in ((Event, "created_at", where.get("events")), (Handoff, "created_at", where.get("handoffs"))):
        if flt is not None:
            for row in model.objects.filter(**flt):
                model.objects.filter(pk=row.pk).update(**{field: getattr(row, field) - delta})


def scope_of(project) -> charts.Scope:
    return charts.Scope(project_ids=(project.id,))


def counts_now(project) -> dict:
    out: dict[str, int] = {}
    for s in Session.objects.filter(project=project):
        out[s.status] = out.get(s.status, 0) + 1
    return out


def test_sessions_per_state_are_walked_back_from_the_event_log(make_session, project):
    early = make_session(run=True)  # running
    shift(40, events={"session_id": early.id})
    late = make_session()  # created, now
    result = charts.build(scope_of(project), counts_now(project).items())
    states = result.charts[0]
    samples = charts._samples(result.start, result.end, charts.STATE_SAMPLES)
    series = charts.state_counts_over_time(scope_of(project), result.cutoff, counts_now(project), samples)
    assert series[-1] == {"running": 1, "created": 1}
    # 30 minutes ago: only the early session existed, already running; before it, nothing.
    k30 = max(k for k, t in enumerate(samples) if t <= timezone.now() - timedelta(minutes=30))
    assert +series[k30] == {"running": 1}
    assert +series[0] == {}
    assert states.summary == "1 created, 1 running"
    assert any(r.cls == "st-running" for r in states.rects) and late.status == "created"


def test_events_per_minute_count_the_window_only(make_session, project):
    old = make_session(run=True)
    shift(120, events={"session_id": old.id})  # outside the 60-minute window
    s = make_session(run=True)
    n_now = Event.objects.filter(session_id=s.id).count()
    result = charts.build(scope_of(project), counts_now(project).items())
    per = charts.events_per_minute(scope_of(project), result.cutoff, result.start, charts.WINDOW_MINUTES)
    assert sum(per) == n_now and per[-1] == n_now
    assert result.charts[1].summary.startswith(f"{n_now} in the last 60 min")


def test_handoffs_waiting_and_their_age_over_time(make_session, project):
    s = make_session(run=True)
    waiting = handoff(s, "long-wait")
    shift(40, events={"session_id": s.id, "type": "handoff.created", "payload__handoff_id": waiting.id},
          handoffs={"id": waiting.id})
    done = claim(handoff(s, "done-now"))
    shift(20, events={"session_id": s.id, "type": "handoff.created", "payload__handoff_id": done.id},
          handoffs={"id": done.id})
    deliver(done, {"verdict": "ok"})
    result = charts.build(scope_of(project), counts_now(project).items())
    samples = charts._samples(result.start, result.end, charts.STATE_SAMPLES)
    series = charts.handoffs_waiting_over_time(scope_of(project), result.cutoff, result.start, samples)
    now = timezone.now()
    for t, (n, age) in zip(samples, series):
        expected = (t >= now - timedelta(minutes=40)) + (now - timedelta(minutes=20) <= t < now - timedelta(seconds=30))
        if abs((t - (now - timedelta(minutes=20))).total_seconds()) < 30 or abs((t - (now - timedelta(minutes=40))).total_seconds()) < 30:
            continue  # too close to an edge to call
        assert n == expected, (t, n, expected)
        if n:
            assert age == pytest.approx((t - Handoff.objects.get(id=waiting.id).created_at).total_seconds(), abs=1)
    assert series[-1][0] == 1 and result.charts[2].summary.startswith("1 waiting now, oldest 40 min")


def _walk(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _walk(child)


def test_the_chart_queries_never_scan_the_event_table_sequentially(make_session, project):
    """EXPLAIN (FORMAT JSON) of every query the charts send that reads the event table, with
    sequential scans disabled in the test session (so a tiny table does not make the planner
    pick one where an index serves): no Seq Scan node on the event table remains."""
    s = make_session(run=True)
    handoff(s, "explain-me")
    for scope, counts in ((scope_of(project), counts_now(project)), (charts.Scope(session_id=s.id), {s.status: 1})):
        with CaptureQueriesContext(connection) as ctx:
            charts.build(scope, counts.items())
        reading = [q["sql"] for q in ctx.captured_queries if f'"{EVENT_TABLE}"' in q["sql"]]
        assert len(reading) >= 4, reading  # cutoff, states, per minute, handoff endings
        for sql in reading:
            bounded = re.search(rf'"{EVENT_TABLE}"\."id" > \d+', sql)
            cutoff = re.search(rf'ORDER BY "{EVENT_TABLE}"\."id" DESC LIMIT \d+', sql)
            assert bounded or cutoff, f"every event query is bounded by the window's id: {sql}"
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute("SET LOCAL enable_seqscan = off")
                cur.execute("EXPLAIN (FORMAT JSON) " + sql)
                raw = cur.fetchone()[0]
            plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
            scans = [(n["Node Type"], n.get("Index Name")) for n in _walk(plan) if n.get("Relation Name") == EVENT_TABLE]
            assert scans and all(kind != "Seq Scan" for kind, _ in scans), (sql, scans)


def _rows_read(sql: str) -> list[int]:
    """Rows each scan of the event table read running ``sql`` (EXPLAIN ANALYZE: the rows it
    returned plus those its filter removed)."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        raw = cur.fetchone()[0]
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    return [int(n["Actual Rows"]) * int(n.get("Actual Loops", 1)) + int(n.get("Rows Removed by Filter", 0))
            for n in _walk(plan) if n.get("Relation Name") == EVENT_TABLE]


def test_a_busy_log_shortens_the_window_to_its_newest_events_and_reads_no_more(
        make_session, project, monkeypatch, mgr_client):
    """More events inside the hour than the charts read (CHART_EVENTS_MAX, 15 here): the window
    shortens to the whole minutes of the newest 15, the charts read those 15 and finding them
    reads 17 rows (one statement) (the flat cost: the same at 10 k events as at 1 M), and the page says so."""
    from novelforge_sessions import event_types as ev
    from novelforge_sessions import events

    monkeypatch.setattr(charts, "CHART_EVENTS_MAX", 15)
    earlier = make_session(run=True)
    shift(30, events={"session_id": earlier.id})  # inside the hour, older than the newest 15
    s = make_session(run=True)
    with transaction.atomic():
        events.order_lock(s.id)
        for i in range(20):
            events.append(project_id=project.id, session_id=s.id, type=ev.CHECKPOINT_RECORDED,
                          payload={"checkpoint_id": 0, "seq": i, "boundary": "context_freeze", "cursor": {}})
    newest = list(Event.objects.order_by("-id").values_list("id", "created_at")[:16])
    assert Event.objects.filter(created_at__gte=timezone.now() - timedelta(minutes=59)).count() > 16
    with CaptureQueriesContext(connection) as ctx:
        result = charts.build(scope_of(project), counts_now(project).items())
    assert result.shortened and result.cutoff == newest[15][0]
    assert result.start >= newest[14][1].replace(second=0, microsecond=0) > timezone.now() - timedelta(minutes=2)
    assert result.window_minutes < charts.WINDOW_MINUTES
    per = charts.events_per_minute(scope_of(project), result.cutoff, result.start, result.window_minutes)
    assert sum(per) == Event.objects.filter(id__gt=result.cutoff, created_at__gte=result.start).count() <= 15
    # Every chart query is bounded by id > cutoff (the plan test above), and that range holds
    # exactly the newest 15; the one statement that finds the cutoff reads at most 17 rows (16,
    # and the one its row_number() looks ahead).
    assert Event.objects.filter(id__gt=result.cutoff).count() == 15
    window = [q["sql"] for q in ctx.captured_queries
              if f'"{EVENT_TABLE}"' in q["sql"] and not re.search(rf'"{EVENT_TABLE}"\."id" > \d+', q["sql"])]
    assert len(window) == 1, window
    for sql in window:
        assert all(n <= 17 for n in _rows_read(sql)), (sql, _rows_read(sql))
    page = mgr_client.get("/charts/").content.decode()
    assert "a busy log: the charts cover its newest 15 events" in page
    assert f"Last {result.window_minutes} minute" in page


def test_a_quiet_hour_keeps_the_whole_window(make_session, project, monkeypatch):
    monkeypatch.setattr(charts, "CHART_EVENTS_MAX", 500)
    make_session(run=True)
    result = charts.build(scope_of(project), counts_now(project).items())
    assert not result.shortened and result.window_minutes == charts.WINDOW_MINUTES and result.cutoff == 0


def test_a_window_holding_exactly_the_most_the_charts_read_is_not_shortened(make_session, project, monkeypatch):
    """The edge of the busy rule: CHART_EVENTS_MAX events inside the hour and the next one older
    than it. The window keeps its hour and the cutoff is that older event."""
    old = make_session(run=True)
    shift(120, events={"session_id": old.id})
    make_session(run=True)
    hour = (timezone.now() - timedelta(minutes=charts.WINDOW_MINUTES - 1)).replace(second=0, microsecond=0)
    inside = Event.objects.filter(created_at__gte=hour).count()
    monkeypatch.setattr(charts, "CHART_EVENTS_MAX", inside)
    result = charts.build(scope_of(project), counts_now(project).items())
    newest_older = Event.objects.filter(created_at__lt=hour).order_by("-id").values_list("id", flat=True).first()
    assert not result.shortened and result.window_minutes == charts.WINDOW_MINUTES
    assert result.cutoff == newest_older and Event.objects.filter(id__gt=result.cutoff).count() == inside
