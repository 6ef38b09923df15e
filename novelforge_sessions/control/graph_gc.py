"""Garbage collection of graph state: the blobs nothing cites, and the old checkpoints of graph
sessions at rest (docs/agents.md#langgraph-checkpointer, docs/deployment.md#graph-state-garbage-collection).

A graph's state blobs (``control/graphs.py``: artifacts of the reserved kind ``graph-blob``,
one immutable version, named ``blob:<fingerprint>``) are stored once per project and cited by
fingerprint, so deleting a thread (``delete_thread``), forgetting its session, or dropping old
checkpoints removes only the citations. A **pass** then removes the blobs no row cites:

* **Only the graph's own blobs.** An artifact of kind ``graph-blob`` whose one version is its
  current version and whose name is ``blob:`` and that version's fingerprint. The artifacts API
  refuses that kind (and a second version of such an artifact), so a user's artifact is never
  one; nor is a blob younger than the grace (``GRAPH_GC_GRACE_SECONDS``: an upload in chunks
  waiting for the put that will name it).
* **Nothing cites it** (``_UNCITED``): no checkpoint's artifact refs, no run's frozen inputs, no
  handoff's inputs (by artifact id, through their partial GIN indexes, in any project), no review
  gate's candidate, no write intent, no graph pending write (by version), no thread's channel
  version (``GraphBlob``, by fingerprint, in the blob's project).
* **Safe against writers.** Each batch is its own transaction: it locks its candidates ``FOR
  UPDATE SKIP LOCKED`` (a writer that resolved a blob holds it ``FOR KEY SHARE`` until its
  citation commits: skipped; a graph put or task's writes in its statement, any other citation
  through ``actions.artifacts.HOLD_BLOBS_SQL``), then deletes, in a second statement and so a
  snapshot taken after the locks, only those that nothing cites. A writer that comes to a blob
  after it was locked waits, then finds it gone: stored again when it carries the value, ``409
  graph_blob_missing`` when it named it by fingerprint (the saver sends it again), ``422
  unknown_artifact_version`` when it cited it as an artifact ref.
* **Bounded.** A pass removes at most ``GRAPH_GC_MAX_PER_PASS`` blobs, examining them in id
  order ``GRAPH_GC_BATCH`` at a time from where the previous pass stopped (``Cursor``; the end
  wraps to the start), so each pass costs about the same however many blobs the database holds.

**Retention** (``GRAPH_RETENTION_DAYS`` > 0): a graph session at rest (``AT_REST``, no live
runtime) unchanged for that many days keeps its latest graph checkpoint per namespace (and the
session's latest checkpoint, and any a run resumed from); its other graph checkpoints (with
their bounded checkpoints), the pending writes of checkpoints no longer kept, and the channel
versions no kept checkpoint maps are removed, one session per transaction under its lock. Their
blobs go with the next passes. 0 (the default) keeps every checkpoint.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from novelforge_sessions import events
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.control.models import GraphBlob, GraphCheckpoint, GraphThread, GraphWrite, Handoff, WriteIntent
from novelforge_sessions.models import (
    GRAPH_BLOB_KIND, Artifact, ArtifactVersion, Checkpoint, Run, RuntimeAttachment, Session,
)

log = logging.getLogger("novelforge.graph_gc")

BLOB_PREFIX = "blob:"
#: Sessions whose graph state retention may thin: nothing runs or waits in them.
AT_REST = tuple(s.value for s in (rt.SessionStatus.IDLE, rt.SessionStatus.COMPLETED, rt.SessionStatus.FAILED,
                                  rt.SessionStatus.TERMINATED, rt.SessionStatus.STALE))

_A, _AV = Artifact._meta.db_table, ArtifactVersion._meta.db_table
_CP, _RUN, _S = Checkpoint._meta.db_table, Run._meta.db_table, Session._meta.db_table
_H, _WI = Handoff._meta.db_table, WriteIntent._meta.db_table
_GT, _GC, _GB, _GW = (GraphThread._meta.db_table, GraphCheckpoint._meta.db_table, GraphBlob._meta.db_table,
                      GraphWrite._meta.db_table)
# The review gates by their reverse name (the control plane imports nothing from reviews).
_GATE = ArtifactVersion._meta.get_field("review_gates").related_model._meta


def _cites(table: str, column: str) -> str:
    # NOT (… = '[]'): the condition of the table's partial GIN index, as Django spells it
    # (models.CITES_ARTIFACTS, run_cites_inputs, control.models.CITES_INPUTS), so the probe uses it.
    return (f"SELECT 1 FROM {table} x WHERE NOT (x.{column} = '[]'::jsonb)"
            f" AND x.{column} @> jsonb_build_array(jsonb_build_object('artifact_id', a.id))")


#: A graph blob: artifact ``a`` of the reserved kind, its one version ``v`` current, named by it.
_IS_BLOB = f"""a.kind = '{GRAPH_BLOB_KIND}' AND v.id = a.current_version_id AND v.artifact_id = a.id AND v.number = 1
   AND a.name = '{BLOB_PREFIX}' || v.fingerprint
   AND NOT EXISTS (SELECT 1 FROM {_AV} o WHERE o.artifact_id = a.id AND o.id <> v.id)"""
#: Nothing cites blob ``a`` (its version ``v``): every reference the models hold, each an index probe.
_UNCITED = f"""NOT EXISTS ({_cites(_CP, "artifacts")})
   AND NOT EXISTS ({_cites(_RUN, "frozen_inputs")})
   AND NOT EXISTS ({_cites(_H, Handoff._meta.get_field("inputs").column)})
   AND NOT EXISTS (SELECT 1 FROM {_GATE.db_table} g WHERE g.{_GATE.get_field("candidate").column} = v.id)
   AND NOT EXISTS (SELECT 1 FROM {_WI} i WHERE i.artifact_id = a.id)
   AND NOT EXISTS (SELECT 1 FROM {_GW} w WHERE w.value_id = v.id)
   AND NOT EXISTS (SELECT 1 FROM {_GB} b JOIN {_GT} t ON t.id = b.thread_id
                    WHERE b.fingerprint = v.fingerprint AND t.project_id = a.project_id)"""

#: The next blobs in id order after the cursor (the batch examined), plain read.
_WINDOW_SQL = f"""SELECT a.id FROM {_A} a WHERE a.kind = '{GRAPH_BLOB_KIND}' AND a.id > %(after)s
 ORDER BY a.id LIMIT %(batch)s"""
#: Of the window, the blobs old enough and uncited as this snapshot sees them, locked; skipped
#: when a writer holds one (it is citing it).
_LOCK_SQL = f"""SELECT a.id FROM {_A} a JOIN {_AV} v ON v.id = a.current_version_id
 WHERE a.id = ANY(%(ids)s) AND a.created_at <= %(before)s AND {_IS_BLOB} AND {_UNCITED}
 ORDER BY a.id LIMIT %(limit)s
 FOR UPDATE OF a SKIP LOCKED"""
#: Run after the locks, so in a snapshot that sees every citation committed before them: the
#: locked blobs nothing cites, deleted with their version (both foreign keys between the two
#: tables are checked at commit).
_DELETE_SQL = f"""
WITH gone AS MATERIALIZED (
    SELECT a.id FROM {_A} a JOIN {_AV} v ON v.id = a.current_version_id
     WHERE a.id = ANY(%(ids)s) AND {_IS_BLOB} AND {_UNCITED}
), versions AS (
    DELETE FROM {_AV} v USING gone g WHERE v.artifact_id = g.id RETURNING v.id
), artifacts AS (
    DELETE FROM {_A} a USING gone g WHERE a.id = g.id RETURNING a.id
)
SELECT array(SELECT id FROM artifacts ORDER BY id), (SELECT count(*) FROM versions)
"""


@dataclass
class Cursor:
    """Where the next pass goes on: the last blob id examined, and the last session retention
    looked at (0: from the start). Kept by the loop between passes; a new process starts over."""

    blob_after: int = 0
    session_after: int = 0


@dataclass(frozen=True)
class Collected:
    examined: int
    removed: list[int] = field(default_factory=list)


def collect_blobs(cursor: Cursor, *, limit: int | None = None, batch: int | None = None,
                  grace_seconds: int | None = None, now: datetime | None = None) -> Collected:
    """One pass: remove at most ``limit`` unreferenced graph blobs (``GRAPH_GC_MAX_PER_PASS``),
    examined ``batch`` at a time (``GRAPH_GC_BATCH``), each batch its own transaction, from
    ``cursor.blob_after`` on; older than ``grace_seconds`` (``GRAPH_GC_GRACE_SECONDS``) at ``now``.
    Moves the cursor past what it examined (back to 0 at the end). Returns what it removed."""
    limit = settings.GRAPH_GC_MAX_PER_PASS if limit is None else limit
    batch = settings.GRAPH_GC_BATCH if batch is None else batch
    grace = settings.GRAPH_GC_GRACE_SECONDS if grace_seconds is None else grace_seconds
    before = (now or timezone.now()) - timedelta(seconds=grace)
    removed: list[int] = []
    examined = 0
    while len(removed) < limit:
        with transaction.atomic(), connection.cursor() as db:
            db.execute(_WINDOW_SQL, {"after": cursor.blob_after, "batch": batch})
            window = [row[0] for row in db.fetchall()]
            if not window:
                cursor.blob_after = 0  # the end: the next pass starts over
                break
            room = limit - len(removed)
            db.execute(_LOCK_SQL, {"ids": window, "before": before, "limit": room})
            locked = [row[0] for row in db.fetchall()]
            if locked:
                db.execute(_DELETE_SQL, {"ids": locked})
                gone, _ = db.fetchone()
                removed.extend(gone)
        # A full batch of removals may have left candidates in the window: go on after the last one locked.
        cursor.blob_after = locked[-1] if len(locked) == room and locked[-1] < window[-1] else window[-1]
        examined += len([i for i in window if i <= cursor.blob_after])
        if len(window) < batch and cursor.blob_after == window[-1]:
            cursor.blob_after = 0  # the end: the next pass starts over
            break
    return Collected(examined, removed)


# ---- retention -------------------------------------------------------------------------------------
#: Graph sessions at rest, unchanged since the cutoff, after the cursor, whose thread has more than
#: one checkpoint in a namespace: what retention may thin.
_RETAINED_SQL = f"""
SELECT s.id FROM {_S} s JOIN {_GT} t ON t.session_id = s.id
 WHERE s.id > %(after)s AND s.status = ANY(%(at_rest)s) AND s.updated_at <= %(cutoff)s
   AND EXISTS (SELECT 1 FROM {_GC} c WHERE c.thread_id = t.id GROUP BY c.checkpoint_ns HAVING count(*) > 1)
 ORDER BY s.id LIMIT %(limit)s
"""
#: A thread's graph checkpoints but the latest of each namespace, the session's latest checkpoint
#: and those a run resumed from: removed with their bounded checkpoints.
_THIN_CHECKPOINTS_SQL = f"""
WITH kept AS (
    SELECT DISTINCT ON (c.checkpoint_ns) c.id FROM {_GC} c WHERE c.thread_id = %(thread)s
     ORDER BY c.checkpoint_ns, c.checkpoint_id DESC, c.id DESC
), doomed AS MATERIALIZED (
    SELECT c.id, c.record_id FROM {_GC} c
     WHERE c.thread_id = %(thread)s AND c.id NOT IN (SELECT k.id FROM kept k)
       AND c.record_id <> (SELECT max(r.id) FROM {_CP} r WHERE r.session_id = %(session)s)
       AND NOT EXISTS (SELECT 1 FROM {_RUN} u WHERE u.resumed_from_id = c.record_id)
), graphs AS (
    DELETE FROM {_GC} c USING doomed d WHERE c.id = d.id RETURNING c.id
), records AS (
    DELETE FROM {_CP} r USING doomed d WHERE r.id = d.record_id RETURNING r.id
)
SELECT (SELECT count(*) FROM graphs), (SELECT count(*) FROM records)
"""
#: Pending writes keyed to no checkpoint the thread keeps.
_THIN_WRITES_SQL = f"""
DELETE FROM {_GW} w WHERE w.thread_id = %(thread)s AND NOT EXISTS (
    SELECT 1 FROM {_GC} c WHERE c.thread_id = w.thread_id AND c.checkpoint_ns = w.checkpoint_ns
       AND c.checkpoint_id = w.checkpoint_id)
"""
#: Channel versions whose blob no kept checkpoint of the namespace maps that channel to.
_THIN_VERSIONS_SQL = f"""
DELETE FROM {_GB} b WHERE b.thread_id = %(thread)s AND NOT EXISTS (
    SELECT 1 FROM {_GC} c WHERE c.thread_id = b.thread_id AND c.checkpoint_ns = b.checkpoint_ns
       AND c.document -> 'blobs' @> jsonb_build_object(b.channel, b.fingerprint))
"""


@dataclass(frozen=True)
class Thinned:
    sessions: int = 0
    checkpoints: int = 0
    writes: int = 0
    versions: int = 0


def apply_retention(cursor: Cursor, *, days: int | None = None, limit: int | None = None,
                    now: datetime | None = None) -> Thinned:
    """Thin the graph state of at most ``limit`` sessions (``GRAPH_RETENTION_SESSIONS_PER_PASS``)
    at rest and unchanged for ``days`` (``GRAPH_RETENTION_DAYS``; 0: nothing), from
    ``cursor.session_after`` on: each in its own transaction, under the session's lock, its state
    and age checked again there (a resume that came first wins)."""
    days = settings.GRAPH_RETENTION_DAYS if days is None else days
    limit = settings.GRAPH_RETENTION_SESSIONS_PER_PASS if limit is None else limit
    if days <= 0:
        return Thinned()
    now = now or timezone.now()
    cutoff = now - timedelta(days=days)
    with connection.cursor() as db:
        db.execute(_RETAINED_SQL, {"after": cursor.session_after, "at_rest": list(AT_REST), "cutoff": cutoff,
                                   "limit": limit})
        session_ids = [row[0] for row in db.fetchall()]
    cursor.session_after = session_ids[-1] if len(session_ids) == limit else 0
    sessions = checkpoints = writes = versions = 0
    for session_id in session_ids:
        with transaction.atomic(), connection.cursor() as db:
            events.order_lock(session_id)  # the session lock, as every writer of the session takes it
            session = Session.objects.select_for_update().filter(id=session_id).first()
            if (session is None or session.status not in AT_REST or session.updated_at > cutoff
                    or RuntimeAttachment.objects.live(now).filter(session_id=session_id).exists()):
                continue
            thread = GraphThread.objects.filter(session_id=session_id).values_list("id", flat=True).first()
            if thread is None:
                continue
            params = {"thread": thread, "session": session_id}
            db.execute(_THIN_CHECKPOINTS_SQL, params)
            dropped, _ = db.fetchone()
            db.execute(_THIN_WRITES_SQL, params)
            writes += db.rowcount
            db.execute(_THIN_VERSIONS_SQL, params)
            versions += db.rowcount
        sessions += 1
        checkpoints += dropped
    return Thinned(sessions, checkpoints, writes, versions)


@dataclass(frozen=True)
class PassResult:
    retention: Thinned
    collected: Collected

    def line(self) -> str:
        r = self.retention
        return (f"graph gc: blobs_removed={len(self.collected.removed)} blobs_examined={self.collected.examined} "
                f"retention_sessions={r.sessions} checkpoints_removed={r.checkpoints} writes_removed={r.writes} "
                f"channel_versions_removed={r.versions}")


def run_pass(cursor: Cursor, *, now: datetime | None = None) -> PassResult:
    """Retention, then collection (so the blobs retention uncited may go in the same pass), with
    the settings; one log line of counts."""
    result = PassResult(apply_retention(cursor, now=now), collect_blobs(cursor, now=now))
    log.info(result.line())
    return result
