"""The pages' reads of handoffs, checkpoints and review assignments stay flat in those tables.

The same method as ``test_event_query_plans``: rows are generated set-based inside the test's
transaction and ANALYZEd, the real pages are requested, every statement they send that reads one
of these tables is run again under ``EXPLAIN (ANALYZE, FORMAT JSON)``, and the executor's row
counts must stay under ``MAX_ROWS_TOUCHED`` per table per statement, with no sequential scan.

The shape: the writer session holds 30 000 handoffs (1 050 waiting for a worker, 100 conflicted,
the rest bound), 20 000 checkpoints of its run and 36 000 finished review gates; of 40 000 review
assignments, its reviewer holds 12 000: 1 000 waiting on a pending gate, 11 000 submitted.

One read is bounded by what it counts rather than by the cap: the queue's count of what waits
joins each of the reviewer's assigned slots to its gate's state, and the planner, which cannot
know that nearly all of them wait on pending gates, reads all the reviewer's assigned slots
(their backlog, not the table) rather than walking its index to the cap. A page reads at most a capped count
(``COUNT_CAP + 1`` rows of each table it joins), a page of rows, and the session's waiting
handoffs for the chart of them. A plan that sorts all of a session's handoffs or checkpoints, or
all of a reviewer's assignments, to show the first page or count them, reads thousands more.
"""
from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client

from novelforge_sessions.control.models import Handoff, HandoffState
from novelforge_sessions.counting import COUNT_CAP
from novelforge_sessions.dashboard.presenters import OPEN_CONFLICTS_SHOWN
from novelforge_sessions.models import Checkpoint, Run, Session
from reviews.models import ReviewAssignment, ReviewGate, ReviewPacket
from reviews.templatetags.review_panels import PANEL_GATES
from tests.reviews.factories import make_world
from tests.support.factories import make_project
from tests.support.plans import Reads, analysed_plan, rows_touched

pytestmark = pytest.mark.django_db

HANDOFFS = Handoff._meta.db_table
CHECKPOINTS = Checkpoint._meta.db_table
ASSIGNMENTS = ReviewAssignment._meta.db_table
PACKETS = ReviewPacket._meta.db_table
GATES = ReviewGate._meta.db_table
TABLES = (HANDOFFS, CHECKPOINTS, ASSIGNMENTS, PACKETS, GATES)
ANALYZED = (*TABLES, Session._meta.db_table)

SESSION_HANDOFFS = 30_000
SESSION_CHECKPOINTS = 20_000
REVIEW_GATES = 40_000  # copies of one gate, its packet and its assignment; 3 in 10 are alice's
WAITING_EVERY = 40  # 1 in 40 (1 000, all alice's) still pending and assigned
#: Above a capped count (up to ``COUNT_CAP + 1`` rows of each table it joins, several times that
#: where the rows it walks are filtered on the way: a third of the assignments are the reviewer's),
#: the chart's 1 050 waiting handoffs and the reviewer's 1 000 waiting slots; below the 11 000
#: submitted slots, the 20 000 checkpoints, the 30 000 handoffs and the 36 000 gates that a full
#: read of one session or reviewer would touch.
MAX_ROWS_TOUCHED = 5_000


def _generate_handoffs(session, run) -> None:
    states = {f"h_{s.value}": s.value for s in HandoffState}
    with connection.cursor() as cur:
        cur.execute(
            f"""
            INSERT INTO {HANDOFFS} (project_id, session_id, run_id, logical_id, inputs, params, result_schema,
                job_fingerprint, required_capabilities, timeout_seconds, purpose, state, attempt, fencing_token,
                lease_holder, lease_expires_at, claimed_at, bound_at, conflict_resolution, created_by, created_at)
            SELECT %(project)s, %(session)s, %(run)s, 'plan-job-' || i, '[]', '{{}}', '{{}}',
                   'sha256:' || md5(i::text) || md5((i + 1)::text), '[]', 300, 'job', state,
                   CASE WHEN state = %(h_pending)s THEN 0 ELSE 1 END, CASE WHEN state = %(h_pending)s THEN 0 ELSE 1 END,
                   CASE WHEN state = %(h_claimed)s THEN 'worker-1' ELSE '' END,
                   CASE WHEN state = %(h_claimed)s THEN now() + interval '1 hour' END,
                   CASE WHEN state <> %(h_pending)s THEN at END,
                   CASE WHEN state IN (%(h_bound)s, %(h_conflicted)s) THEN at + interval '1 minute' END, '',
                   'plans', at
            FROM (SELECT i, now() - interval '1 day' + i * interval '1 millisecond' AS at,
                         CASE WHEN mod(i, 40) = 7 THEN %(h_pending)s WHEN mod(i, 100) = 11 THEN %(h_claimed)s
                              WHEN mod(i, 300) = 13 THEN %(h_conflicted)s ELSE %(h_bound)s END AS state
                  FROM generate_series(1, %(n)s) AS g(i)) AS rows
            """,
            {"project": session.project_id, "session": session.id, "run": run.id, "n": SESSION_HANDOFFS, **states},
        )


def _generate_checkpoints(session, run) -> None:
    with connection.cursor() as cur:
        cur.execute(
            f"""
            INSERT INTO {CHECKPOINTS} (session_id, run_id, seq, boundary, cursor, artifacts, authority, pending,
                approvals, resume_policy, schema_version, size_bytes, created_at)
            SELECT %s, %s, 1000 + i, 'context_freeze', jsonb_build_object('step', i), '[]', '{{}}', '{{}}', '[]',
                   'revalidate', 1, 16, now() - interval '1 day' + i * interval '1 millisecond'
            FROM generate_series(1, %s) AS g(i)
            """,
            [session.id, run.id, SESSION_CHECKPOINTS],
        )
        cur.execute(f"UPDATE {Run._meta.db_table} SET checkpoint_count = checkpoint_count + %s WHERE id = %s",
                    [SESSION_CHECKPOINTS, run.id])


def _columns(model, *, but: tuple[str, ...]) -> list[str]:
    return [f.column for f in model._meta.concrete_fields if f.column not in but]


def _clone_reviews(gate: ReviewGate) -> None:
    """``REVIEW_GATES`` copies of ``gate``, its packet and its assignment. Alice holds 3 in 10 of
    the assignments (the others belong to another reviewer), 1 in 40 of all still pending and
    assigned to her, her others submitted. A session waits on one gate at a time, so each
    pending copy is another session's (a copy of the writer's); the complete ones are the
    writer's own history. The gate and packet tables are grown well past the reviewer's rows:
    at the size of a long-lived project the planner joins by index, not by hashing the tables."""
    packet = ReviewPacket.objects.get(gate=gate)
    slot = ReviewAssignment.objects.get(packet=packet)
    waiting, mine = f"mod(i, {WAITING_EVERY}) = 0", "mod(i, 10) < 3"
    pending, complete = ReviewGate.State.PENDING.value, ReviewGate.State.COMPLETE.value
    assigned, submitted = ReviewAssignment.State.ASSIGNED.value, ReviewAssignment.State.SUBMITTED.value
    sessions = Session._meta.db_table
    with connection.cursor() as cur:
        cur.execute(f"SELECT max(id) FROM {sessions}")
        s0 = cur.fetchone()[0] + 10
        rest = _columns(Session, but=("id",))
        cur.execute(
            f"INSERT INTO {sessions} (id, {', '.join(rest)}) SELECT %(s0)s + i, {', '.join(rest)} "
            f"FROM {sessions}, generate_series(1, %(n)s) AS g(i) WHERE id = %(writer)s",
            {"s0": s0, "n": REVIEW_GATES // WAITING_EVERY, "writer": gate.session_id})
        cur.execute(f"SELECT max(id) FROM {GATES}")
        g0 = cur.fetchone()[0] + 10
        cur.execute(f"SELECT max(id) FROM {PACKETS}")
        p0 = cur.fetchone()[0] + 10
        cur.execute(f"SELECT max(id) FROM {ASSIGNMENTS}")
        a0 = cur.fetchone()[0] + 10
        n = REVIEW_GATES
        rest = _columns(ReviewGate, but=("id", "session_id", "state", "outcome", "completed_at", "bound_verdicts"))
        cur.execute(
            f"INSERT INTO {GATES} (id, session_id, state, outcome, completed_at, bound_verdicts, {', '.join(rest)}) "
            f"SELECT %(g0)s + i, CASE WHEN {waiting} THEN %(s0)s + i / {WAITING_EVERY} ELSE session_id END, "
            f"CASE WHEN {waiting} THEN %(pending)s ELSE %(complete)s END, "
            f"CASE WHEN {waiting} THEN '' ELSE 'pass' END, CASE WHEN {waiting} THEN NULL ELSE now() END, "
            f"CASE WHEN {waiting} THEN 0 ELSE required_verdicts END, {', '.join(rest)} "
            f"FROM {GATES}, generate_series(1, %(n)s) AS g(i) WHERE id = %(gate)s",
            {"g0": g0, "s0": s0, "n": n, "gate": gate.id, "pending": pending, "complete": complete})
        rest = _columns(ReviewPacket, but=("id", "gate_id"))
        cur.execute(
            f"INSERT INTO {PACKETS} (id, gate_id, {', '.join(rest)}) SELECT %(p0)s + i, %(g0)s + i, {', '.join(rest)} "
            f"FROM {PACKETS}, generate_series(1, %(n)s) AS g(i) WHERE id = %(packet)s",
            {"p0": p0, "g0": g0, "n": n, "packet": packet.id})
        rest = _columns(ReviewAssignment, but=("id", "packet_id", "reviewer", "reviewer_user_id", "state", "assigned_at",
                                               "submitted_at", "handoff_id"))
        cur.execute(
            f"INSERT INTO {ASSIGNMENTS} (id, packet_id, reviewer, reviewer_user_id, state, assigned_at, submitted_at, "
            f"{', '.join(rest)}) "
            f"SELECT %(a0)s + i, %(p0)s + i, CASE WHEN {mine} THEN reviewer ELSE 'user:0' END, "
            f"CASE WHEN {mine} THEN reviewer_user_id END, CASE WHEN {waiting} THEN %(assigned)s ELSE %(submitted)s END, "
            f"now() - interval '1 day' + i * interval '1 second', "
            f"CASE WHEN {waiting} THEN NULL ELSE now() - interval '1 day' + i * interval '2 seconds' END, {', '.join(rest)} "
            f"FROM {ASSIGNMENTS}, generate_series(1, %(n)s) AS g(i) WHERE id = %(slot)s",
            {"a0": a0, "p0": p0, "n": n, "slot": slot.id, "assigned": assigned, "submitted": submitted})
        for table in (sessions, GATES, PACKETS, ASSIGNMENTS):
            cur.execute(f"SELECT setval(pg_get_serial_sequence(%s, 'id'), (SELECT max(id) FROM {table}))", [table])


@pytest.fixture
def grown():
    project = make_project("page-plans")
    world = make_world(project)
    _generate_handoffs(world.writer, world.run)
    _generate_checkpoints(world.writer, world.run)
    _clone_reviews(world.gate(reviewers=["alice"]))
    with connection.cursor() as cur:
        for table in ANALYZED:
            cur.execute(f"ANALYZE {table}")
    return world


def problems_of(sql: str, params: Any) -> list[str]:
    touched, seq = rows_touched(analysed_plan(sql, params), TABLES)
    return [f"sequential scan of {t}" for t in sorted(seq)] + [
        f"touches {n} rows of {t} (more than {MAX_ROWS_TOUCHED})" for t, n in sorted(touched.items()) if n > MAX_ROWS_TOUCHED]


def check(label: str, client: Client, url: str) -> str:
    reads = Reads(TABLES)
    with connection.execute_wrapper(reads):
        resp = client.get(url)
    assert resp.status_code == 200, (label, resp.status_code)
    assert reads.statements, label
    bad = {sql[:200]: p for sql, params in reads.statements if (p := problems_of(sql, params))}
    assert not bad, f"{label}: {bad}"
    return resp.content.decode()


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_session_page_dashboard_and_queue_read_a_page_not_the_table(grown):
    world = grown
    mia, alice = _client(world.users["mia"]), _client(world.users["alice"])
    session_page = check("session page", mia, f"/sessions/{world.writer.id}/")
    check("session panels", mia, f"/sessions/{world.writer.id}/panels/")
    check("dashboard", mia, "/")
    queue = check("review queue", alice, "/reviews/")
    # The pages still say what the rows say: the capped counts passed their cap, and the panel,
    # the conflicts and the queue list what is there.
    open_states = [HandoffState.PENDING, HandoffState.CLAIMED, HandoffState.CONFLICTED]
    assert Handoff.objects.filter(session=world.writer, state__in=open_states).count() > COUNT_CAP
    assert f"{COUNT_CAP}+" in session_page
    conflicted = list(Handoff.objects.filter(session=world.writer, state=HandoffState.CONFLICTED)
                      .order_by("id").values_list("id", flat=True)[:OPEN_CONFLICTS_SHOWN])
    panel = session_page.split('id="conflicts"', 1)[-1] if 'id="conflicts"' in session_page else session_page
    assert all(f'data-handoff-id="{i}"' in panel for i in conflicted)
    assert f'data-gates-shown="{PANEL_GATES}"' in session_page  # "the newest 20 of 1000+ review gates"
    assert f"{COUNT_CAP}+" in queue


def test_the_check_itself_catches_a_full_read(grown):
    """The walker is not vacuous: the queue's list sorted in memory, and the open handoffs counted
    in id order over the primary key, as they were before their indexes, fail it."""
    reviewer = f"user:{grown.users['alice'].id}"
    sorted_in_memory = (
        f"SELECT a.id FROM {ASSIGNMENTS} a WHERE a.reviewer = %s AND a.state = %s "
        "ORDER BY a.created_at, a.id LIMIT 51")
    assert problems_of(sorted_in_memory, [reviewer, ReviewAssignment.State.SUBMITTED.value])
    assert any("touches" in p or "sequential" in p
               for p in problems_of(f"SELECT count(*) FROM {HANDOFFS} WHERE session_id + 0 = %s", [grown.writer.id]))
