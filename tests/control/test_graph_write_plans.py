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
and may touch only a handful of rows of the blob, artifact and write tables.
"""
from __future__ import annotations

import json
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


def rows_touched(sql: str, params: Any) -> dict[str, int]:
    """Rows each watched table's scans returned or discarded, running ``sql`` (rolled back)."""
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
            raw = cur.fetchone()[0]
        transaction.set_rollback(True)
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
            self.seen.append((sql, params))
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
    return [rows_touched(sql, params) for sql, params in statements.seen]


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
