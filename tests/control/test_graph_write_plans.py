"""A graph put and a task's writes stay flat in the thread's history and the project's blobs.

Each superstep of a long-lived graph leaves new channel versions (``control_graphblob`` rows) and
new blob artifacts behind. The statements of the next put or write must find what they name by
index probes on every column of the unique indexes, never by reading the thread's versions or
the project's blobs and filtering them: that cost grows with every superstep (a loop graph's
server time rose with its thread's length) and, on young tables without statistics, the planner
picked it (a join driven by the thread's index; the single-column ``project_id`` index of
artifacts, since dropped).

A thread with thousands of channel versions and a project with thousands of blobs are generated
set-based, in both states a deployment sees: never analysed (a young database) and analysed.
The real ``put_checkpoint`` and ``put_writes`` run; every statement they send that reads the
graph tables is run again under ``EXPLAIN (ANALYZE, FORMAT JSON)`` (in a savepoint rolled back)
and may touch only a handful of rows of the blob, artifact and write tables, planned both ways:
for its values (a custom plan) and, as the server runs these prepared statements
(``plan_cache_mode=force_generic_plan``, settings ``SERVER_SETTINGS``), generically, once per
connection for every value.
"""
from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
from django.db import connection, transaction

from novelforge_sessions.control import graphs
from novelforge_sessions.control.models import GraphBlob, GraphCheckpoint, GraphWrite
from novelforge_sessions.models import Artifact, ArtifactVersion
from tests.support.factories import caller_for

pytestmark = pytest.mark.django_db

VERSIONS = 2_000  # per channel, of the big thread
CHANNELS = ("messages", "step", "draft")
WATCHED = {GraphBlob._meta.db_table, Artifact._meta.db_table, ArtifactVersion._meta.db_table,
           GraphWrite._meta.db_table, GraphCheckpoint._meta.db_table}
#: A put names a few channels: a probe per channel and per blob, a few rows each.
MAX_ROWS = 40


def _walk(node: dict[str, Any]):
    yield node
    for child in node.get("Plans", []):
        yield from _walk(child)


def _numbered(sql: str, params: Any) -> tuple[str, list[Any]]:
    """``sql`` with psycopg's placeholders (``%(name)s`` or ``%s``) made ``$n``, and the values in
    that order: the text PostgreSQL prepares."""
    order: list[Any] = []
    if isinstance(params, dict):
        names: dict[str, int] = {}

        def number(m: re.Match[str]) -> str:
            if m.group(1) not in names:
                names[m.group(1)] = len(names) + 1
                order.append(params[m.group(1)])
            return f"${names[m.group(1)]}"

        text = re.sub(r"%\((\w+)\)s", number, sql)
    else:
        count = iter(range(1, len(params) + 1))
        text = re.sub(r"%s", lambda m: f"${next(count)}", sql)
        order = list(params)
    return text.replace("%%", "%"), order


def rows_touched(sql: str, params: Any, *, generic: bool = False) -> dict[str, int]:
    """Rows each watched table's scans returned or discarded, running ``sql`` (rolled back):
    planned for its values, or (``generic``) prepared and run on its generic plan."""
    with transaction.atomic():
        with connection.cursor() as cur:
            if generic:
                text, values = _numbered(sql, params)
                cur.execute("SHOW plan_cache_mode")
                assert cur.fetchone()[0] == "force_generic_plan"  # as every connection starts
                cur.execute("PREPARE nf_plan_probe AS " + text)
                cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE nf_plan_probe("
                            + ", ".join(["%s"] * len(values)) + ")", values)
            else:
                cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
            raw = cur.fetchone()[0]
        transaction.set_rollback(True)
    if generic:
        with connection.cursor() as cur:
            cur.execute("DEALLOCATE nf_plan_probe")
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    touched: dict[str, int] = {}
    for node in _walk(plan):
        table = node.get("Relation Name")
        if table in WATCHED and "Scan" in node.get("Node Type", ""):
            touched[table] = touched.get(table, 0) + node.get("Actual Loops", 1) * (
                node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0))
    return touched


class GraphStatements:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def __call__(self, execute, sql, params, many, context):
        if not many and any(t in sql for t in (GraphBlob._meta.db_table, GraphWrite._meta.db_table, "FOR UPDATE")):
            probed = params
            if isinstance(params, dict) and "g_cp" in params:
                # The checkpoint's statement, which inserts the graph row too: probed with another
                # graph checkpoint id, as the one it wrote is taken when the probe runs it again.
                probed = {**params, "g_cp": params["g_cp"] + "-probe"}
            self.seen.append((sql, probed))
        return execute(sql, params, many, context)


def _fp(i: int) -> str:
    return "sha256:" + f"{i:064x}"


@pytest.fixture(params=["young", "analysed"])
def long_thread(request, project):
    """A thread whose session ran thousands of supersteps, in a project holding thousands of blobs."""
    boss = caller_for(project)
    graphs.put_checkpoint(
        boss, thread_id="long", checkpoint_ns="", checkpoint_id="0000", parent_checkpoint_id=None,
        checkpoint={"v": 1, "id": "0000", "ts": "2026-12-01T00:00:00+00:00",
                    "channel_versions": {ch: 1 for ch in CHANNELS}, "versions_seen": {}},
        metadata={"step": 0}, open_spec=graphs.ThreadSpec(),
        blobs=[graphs.ChannelBlob(ch, 1, value=graphs.Blob("json", "e30=")) for ch in CHANNELS],
    )
    thread = GraphBlob.objects.get(channel="step").thread
    n = VERSIONS * len(CHANNELS)
    with connection.cursor() as cur:
        # The project's blobs (artifact + version 1 each), then the thread's versions naming them.
        cur.execute(f"""
            WITH a AS (
                INSERT INTO {Artifact._meta.db_table} (project_id, name, kind, created_at)
                SELECT %s, 'blob:sha256:' || lpad(to_hex(g), 64, '0'), 'graph-blob', now()
                  FROM generate_series(1, %s) g RETURNING id, name)
            INSERT INTO {ArtifactVersion._meta.db_table} (artifact_id, number, content, fingerprint, created_by, created_at)
            SELECT id, 1, '{{}}', substr(name, 6), 'gen', now() FROM a""", [project.id, n])
        cur.execute(f"""
            UPDATE {Artifact._meta.db_table} a SET current_version_id = v.id
              FROM {ArtifactVersion._meta.db_table} v WHERE v.artifact_id = a.id AND a.current_version_id IS NULL""")
        cur.execute(f"""
            INSERT INTO {GraphBlob._meta.db_table} (thread_id, checkpoint_ns, channel, version, fingerprint)
            SELECT %s, '', (ARRAY{list(CHANNELS)!r})[1 + (g %% {len(CHANNELS)})], (2 + g / {len(CHANNELS)})::text,
                   'sha256:' || lpad(to_hex(g + 1), 64, '0')
              FROM generate_series(0, %s - 1) g""", [thread.id, n])
        if request.param == "analysed":
            for table in WATCHED:
                cur.execute(f"ANALYZE {table}")
    return boss, thread, n


def _probe(fn) -> list[dict[str, int]]:
    statements = GraphStatements()
    with connection.execute_wrapper(statements):
        fn()
    assert statements.seen
    return [rows_touched(sql, params, generic=generic) for sql, params in statements.seen
            for generic in (False, True)]


def test_a_put_probes_only_what_it_names(long_thread):
    boss, thread, n = long_thread
    last = 1 + VERSIONS  # every channel's newest generated version
    # The put brings a new value for one channel and names the other two at stored versions.
    versions = {"messages": last, "step": last + 1, "draft": last}
    touched = _probe(lambda: graphs.put_checkpoint(
        boss, thread_id="long", checkpoint_ns="", checkpoint_id="0001", parent_checkpoint_id="0000",
        checkpoint={"v": 1, "id": "0001", "ts": "2026-12-01T00:00:01+00:00", "channel_versions": versions,
                    "versions_seen": {}},
        metadata={"step": 1}, open_spec=graphs.ThreadSpec(),
        blobs=[graphs.ChannelBlob("step", last + 1, value=graphs.Blob("json", "MQ=="))],
    ))
    stored = GraphCheckpoint.objects.get(checkpoint_id="0001").document["blobs"]
    assert set(stored) == set(CHANNELS)  # the stored channels were found, so the probes ran
    assert max(max(t.values(), default=0) for t in touched) <= MAX_ROWS, touched


def test_a_tasks_writes_probe_only_what_they_name(long_thread):
    boss, thread, n = long_thread
    # Values named by fingerprint (blobs the project holds) and one inline.
    writes = [graphs.WriteSpec(0, "step", fingerprint=_fp(n)), graphs.WriteSpec(1, "draft", fingerprint=_fp(7)),
              graphs.WriteSpec(2, "messages", value=graphs.Blob("json", "Mg=="))]
    touched = _probe(lambda: graphs.put_writes(
        boss, thread_id="long", checkpoint_ns="", checkpoint_id="0000", task_id="task-1", task_path="", writes=writes))
    assert GraphWrite.objects.filter(task_id="task-1").count() == 3
    assert max(max(t.values(), default=0) for t in touched) <= MAX_ROWS, touched


def test_the_graph_statements_are_planned_once_per_connection(project):
    """The prepared statements of a put and of a task's writes run on generic plans: planned once
    on the connection, never again for each execution's values (PostgreSQL, left to choose,
    planned the resolve and write statements again every time)."""
    boss = caller_for(project)
    for step in range(8):
        cp = f"{step:04d}"
        graphs.put_writes(boss, thread_id="t", checkpoint_ns="", checkpoint_id=cp, task_id=f"task-{step}", task_path="",
                          writes=[graphs.WriteSpec(0, "step", value=graphs.Blob("json", "MQ=="))],
                          open_spec=graphs.ThreadSpec())
        graphs.put_checkpoint(
            boss, thread_id="t", checkpoint_ns="", checkpoint_id=cp, parent_checkpoint_id=f"{step - 1:04d}" if step else None,
            checkpoint={"v": 1, "id": cp, "ts": "2026-12-01T00:00:00+00:00", "channel_versions": {"step": step + 1},
                        "versions_seen": {}},
            metadata={"step": step}, open_spec=graphs.ThreadSpec(),
            blobs=[graphs.ChannelBlob("step", step + 1, value=graphs.Blob("json", base64.b64encode(str(step).encode()).decode()))],
        )
    assert GraphCheckpoint.objects.filter(thread__thread_id="t").count() == 8
    with connection.cursor() as cur:
        cur.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
                    " WHERE statement LIKE %s OR statement LIKE %s",
                    [f"%{GraphBlob._meta.db_table}%", f"%{GraphWrite._meta.db_table}%"])
        prepared = cur.fetchall()
    assert len(prepared) >= 2  # the resolve and the writes statements at least
    assert all(custom == 0 and generic >= 8 for _, generic, custom in prepared), \
        [(text[:60], generic, custom) for text, generic, custom in prepared]
