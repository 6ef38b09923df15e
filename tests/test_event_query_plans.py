"""Every event-table query of the pages and filters stays flat in the number of events.

A log of ~120 k events is generated set-based (``generate_series``) inside the test's
transaction and ANALYZEd, shaped like a long-lived project: one session with tens of thousands
of checkpoints and a handful of transitions, many ordinary sessions, a second project, and a
rare event type. Then the real pages and API filters are requested; every statement they send
that reads the event table is captured (an execute wrapper on the connection) and run again
under ``EXPLAIN (ANALYZE, FORMAT JSON)``. The plan is walked and must

* never scan the event table sequentially, and
* touch at most ``MAX_ROWS_TOUCHED`` event rows (rows returned times loops, plus the rows an
  index or filter discarded), whatever the table's size: a plan that reads all of a session's
  or a project's events and sorts or filters them (a ``GROUP BY max(id)``, a scan of the
  session's index filtered by type, an ``IN (…) ORDER BY id`` sort) fails here.

The second check is what makes "flat" testable without timing: the counts are the executor's,
not a clock's. The generated log is history (a day old): the pages' charts read the rows of their
own 60-minute window by design (bounded by time, not by the table's size; dashboard/charts.py).
"""
from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from novelforge_sessions import event_types as ev
from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.models import Event, Membership
from novelforge_sessions.session_runtime import SessionStatus as S
from tests.support.factories import make_project
from tests.dashboard.conftest import logged_in, make_user
from tests.support.plans import Reads, analysed_plan, rows_touched

pytestmark = pytest.mark.django_db

EVENTS = Event._meta.db_table
BIG_SESSION_CHECKPOINTS = 60_000
TRANSITIONS = 30
SESSIONS = 30
EVENTS_PER_SESSION = 1_000
OTHER_PROJECT_EVENTS = 25_000
RARE = ev.AUTHORITY_SETTLED.name
RARE_EVENTS = 5
#: Far below any table-sized read (the smallest generated group has 1 000 rows), far above
#: what a page reads (a page of 100, a feed of 25 per project, a 1-row probe per session).
MAX_ROWS_TOUCHED = 600


_generated = [0]


def _generate(project_id: int, session_id: int | None, type_: str, n: int, payload_sql: str = "'{}'::jsonb") -> None:
    # A day-old log: ids from the bottom of the id space, below every id a transaction draws
    # (its xid << 16, and xids start above 2), since one transaction draws at most 65536 ids.
    first = _generated[0]
    _generated[0] += n
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {EVENTS} (id, project_id, session_id, run_id, type, payload, actor, created_at) "
            f"SELECT %s + g.i, %s, %s, NULL, %s, {payload_sql}, 'bench', now() - interval '1 day' FROM generate_series(1, %s) AS g(i)",
            [first, project_id, session_id, type_, n],
        )


@pytest.fixture
def big_log(make_session_in):
    project = make_project("plans")
    other = make_project("plans-other")
    sessions = [make_session_in(project) for _ in range(SESSIONS)]
    big = sessions[0]
    for s in sessions[1:]:
        _generate(project.id, s.id, ev.TRANSCRIPT_APPENDED.name, EVENTS_PER_SESSION, "jsonb_build_object('seq', i, 'role', 'tool')")
    # The big session: checkpoints with a transition every 2 000 of them.
    _generate(project.id, big.id, ev.CHECKPOINT_RECORDED.name, BIG_SESSION_CHECKPOINTS // 2,
              "jsonb_build_object('checkpoint_id', i, 'seq', i, 'boundary', 'step', 'cursor', '{}'::jsonb)")
    run, idle = S.RUNNING.value, S.IDLE.value
    _generate(project.id, big.id, ev.SESSION_TRANSITIONED.name, TRANSITIONS,
              f"jsonb_build_object('from', CASE WHEN i %% 2 = 0 THEN '{idle}' ELSE '{run}' END, "
              f"'to', CASE WHEN i %% 2 = 0 THEN '{run}' ELSE '{idle}' END, 'reason', '', 'version', i)")
    _generate(project.id, big.id, ev.CHECKPOINT_RECORDED.name, BIG_SESSION_CHECKPOINTS // 2,
              "jsonb_build_object('checkpoint_id', i, 'seq', i, 'boundary', 'step', 'cursor', '{}'::jsonb)")
    _generate(project.id, None, RARE, RARE_EVENTS,
              "jsonb_build_object('before', '{}'::jsonb, 'after', '{}'::jsonb, 'intent_id', NULL)")
    other_session = make_session_in(other)
    _generate(other.id, other_session.id, ev.TRANSCRIPT_APPENDED.name, OTHER_PROJECT_EVENTS,
              "jsonb_build_object('seq', i, 'role', 'tool')")
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {EVENTS}")
        cur.execute(f"SELECT count(*) FROM {EVENTS}")
        total = cur.fetchone()[0]
    assert total > 100_000
    manager = make_user("plans-manager", project)
    Membership.objects.create(user=manager, project=other, role=Membership.Role.MANAGER)
    _, token = create_token(project, name="reader", permissions=["read"])
    _, bound = create_token(project, name="bound", permissions=["read"], session=big)
    return {"project": project, "other": other, "big": big, "small": sessions[1], "manager": manager,
            "token": token, "bound": bound}


@pytest.fixture
def make_session_in():
    from novelforge_sessions.actions.sessions import NewSession, create_session
    from tests.support.factories import SESSION, caller_for

    return lambda project: create_session(caller_for(project), NewSession(**SESSION))


def event_plan_problems(sql: str, params: Any) -> list[str]:
    touched, seq = rows_touched(analysed_plan(sql, params), [EVENTS])
    problems = ["sequential scan of the event table"] if seq else []
    if touched[EVENTS] > MAX_ROWS_TOUCHED:
        problems.append(f"touches {touched[EVENTS]} event rows (more than {MAX_ROWS_TOUCHED})")
    return problems


def _reads_of(fetch) -> list[tuple[str, Any]]:
    reads = Reads([EVENTS])
    with connection.execute_wrapper(reads):
        resp = fetch()
    assert resp.status_code == 200, (resp.status_code, resp.content[:300])
    return reads.statements


def _check(label: str, fetch) -> int:
    statements = _reads_of(fetch)
    bad = {}
    for sql, params in statements:
        problems = event_plan_problems(sql, params)
        if problems:
            bad[sql[:160]] = problems
    assert not bad, f"{label}: {json.dumps(bad, indent=1)}"
    return len(statements)


def _api(token: str, **params: Any):
    return lambda: Client().get("/api/v1/events", params, HTTP_AUTHORIZATION=f"Bearer {token}")


API_FILTERS = [
    {},
    {"type": RARE},
    {"type": ev.CHECKPOINT_RECORDED.name},
    {"session_id": "big"},
    {"session_id": "big", "type": ev.SESSION_TRANSITIONED.name},
    {"session_id": "small", "type": ev.SESSION_TRANSITIONED.name},
    {"after": "middle"},
    {"after": "middle", "type": RARE},
]


def test_pages_and_filters_read_events_without_a_scan_and_flat(big_log):
    """One generated log (built once: ~3 s) for every page and filter."""
    from novelforge_sessions.dashboard.presenters import transition_path

    client = logged_in(big_log["manager"])
    p, big, small = big_log["project"], big_log["big"], big_log["small"]
    # The overview of both projects (a feed over two projects, last event of each listed session).
    assert _check("/", lambda: client.get("/")) >= 3
    assert _check("/?project=", lambda: client.get("/", {"project": p.id})) >= 3
    # The session page of the session with 60 000 checkpoints: feed, transition path.
    assert _check("session page (big)", lambda: client.get(f"/sessions/{big.id}/")) >= 3
    assert _check("session panels (big)", lambda: client.get(f"/sessions/{big.id}/panels/")) >= 1
    assert _check("session page (small)", lambda: client.get(f"/sessions/{small.id}/")) >= 3
    assert _check("session row", lambda: client.get(f"/sessions/{big.id}/row/")) >= 1
    # The project page's authority history (a rare type).
    assert _check("project page", lambda: client.get(f"/projects/{p.id}/")) >= 1

    # The index-driven path is the real one: all 30 transitions, in order, among 60 000 checkpoints.
    path = transition_path(big.id)
    assert len(path) == TRANSITIONS
    assert path[0] == (S.RUNNING.value, S.IDLE.value) and path[1] == (S.IDLE.value, S.RUNNING.value)

    middle = Event.objects.filter(project=p).order_by("id").values_list("id", flat=True)[40_000]
    for filters in API_FILTERS:
        params = dict(filters)
        if "session_id" in params:
            params["session_id"] = big_log[params["session_id"]].id
        if params.get("after") == "middle":
            params["after"] = middle
        assert _check(f"GET /events {params}", _api(big_log["token"], **params)) == 1
        items = _api(big_log["token"], **params)().json()["items"]
        ids = [e["id"] for e in items]
        assert ids == sorted(ids) and all(i > params.get("after", 0) for i in ids)
        if params.get("type") == RARE:
            assert [e["type"] for e in items] == [RARE] * RARE_EVENTS, params
        elif params.get("type") == ev.SESSION_TRANSITIONED.name:
            assert len(items) == (TRANSITIONS if params["session_id"] == big.id else 0), params
        else:
            assert len(items) == 100, params
            assert all(e["session_id"] == params["session_id"] for e in items if "session_id" in params)

    # A session-bound token: scoped to its session, read from that session's index.
    assert _check("bound token", _api(big_log["bound"])) == 1
    assert _check("bound token, type", _api(big_log["bound"], type=ev.SESSION_TRANSITIONED.name)) == 1
    items = _api(big_log["bound"], type=ev.SESSION_TRANSITIONED.name)().json()["items"]
    assert len(items) == TRANSITIONS and {e["session_id"] for e in items} == {big.id}


def test_the_check_itself_catches_a_full_read():
    """The plan walker is not vacuous: the old "last event per session" aggregate fails it."""
    project = make_project("plans-self")
    _generate(project.id, 1, ev.TRANSCRIPT_APPENDED.name, 20_000)
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {EVENTS}")
    problems = event_plan_problems(
        f"SELECT max(id) FROM {EVENTS} WHERE session_id IN (1, 2) GROUP BY session_id", None)
    assert problems and "touches" in problems[-1]
    problems = event_plan_problems(f"SELECT * FROM {EVENTS} WHERE payload->>'seq' = '7'", None)
    assert "sequential scan of the event table" in problems
