"""A session-bound token's citation check stays flat in the session's checkpoints (reading every
ref list of the session on every checkpoint POST that cites a version would grow with them).

The lookups that name their rows — a citation (``require_versions``), a read by artifact or
version id — check each named artifact with index probes (``access.given_among``): the
checkpoints and handoffs that cite it come from their partial GIN indexes, never from a walk
of the session's rows. A session with tens of thousands of checkpoints, a few citing the
artifact and one the very last, is generated set-based and ANALYZEd; every statement the
lookups send is run again under ``EXPLAIN (ANALYZE, FORMAT JSON)`` and must not touch more than
a handful of checkpoint rows, whether the citation is given (the last checkpoint's, a gate's) or
refused.
"""
from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection

from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.actions.artifacts import create_artifact, require_versions
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.apikit.auth import caller_for_token
from novelforge_sessions.errors import UnknownArtifactVersion
from novelforge_sessions.models import Artifact, ArtifactVersion, Checkpoint, Run
from tests.support.factories import caller_for

pytestmark = pytest.mark.django_db

CHECKPOINTS = 20_000
CHECKPOINTS_TABLE = Checkpoint._meta.db_table
#: What a probe may read of the checkpoint table: the few rows that cite the artifact.
MAX_CHECKPOINT_ROWS = 50


def _walk(node: dict[str, Any]):
    yield node
    for child in node.get("Plans", []):
        yield from _walk(child)


def checkpoint_rows_touched(sql: str, params: Any) -> int:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        raw = cur.fetchone()[0]
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    touched = 0
    for node in _walk(plan):
        if node.get("Relation Name") == CHECKPOINTS_TABLE or node.get("Index Name", "").startswith("checkpoint"):
            touched += node.get("Actual Loops", 1) * (
                node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0))
    return touched


class Statements:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def __call__(self, execute, sql, params, many, context):
        if not many and sql.lstrip().upper().startswith(("SELECT", "WITH")):
            self.seen.append((sql, params))
        return execute(sql, params, many, context)


@pytest.fixture
def big_session(project):
    boss = caller_for(project)
    session = sessions.create_session(
        boss, sessions.NewSession(role="writer", memory_policy="none", task_mode="draft", runtime_family="chat"),
        runtime=RuntimeSpec(runtime_family="chat", capabilities=["draft"], lease_seconds=600),
    )
    cited, other, refused = (create_artifact(boss, name=n, kind="document", content=n) for n in ("cited", "other", "refused"))
    runs.start_run(boss, session.id, cursor={"step": 1})
    run = Run.objects.get(session=session)
    with connection.cursor() as cur:
        # Most checkpoints cite nothing, every 100th cites `other`, 3 early ones and the last cite `cited`.
        cur.execute(
            f"""INSERT INTO {CHECKPOINTS_TABLE} (session_id, run_id, seq, boundary, cursor, artifacts, authority, pending,
                       approvals, resume_policy, schema_version, size_bytes, created_at)
                SELECT %s, %s, 100 + g, 'context_freeze', '{{}}'::jsonb,
                       CASE WHEN g IN (7, 8, 9, %s) THEN jsonb_build_array(jsonb_build_object('artifact_id', %s::bigint, 'fingerprint', 'f'))
                            WHEN g %% 100 = 0 THEN jsonb_build_array(jsonb_build_object('artifact_id', %s::bigint, 'fingerprint', 'f'))
                            ELSE '[]'::jsonb END,
                       '{{}}'::jsonb, '{{}}'::jsonb, '[]'::jsonb, 'revalidate', 1, 10, now()
                  FROM generate_series(1, %s) AS g""",
            [session.id, run.id, CHECKPOINTS, cited.id, other.id, CHECKPOINTS],
        )
        cur.execute(f"ANALYZE {CHECKPOINTS_TABLE}")
    _, raw = create_token(project, name="bound", permissions=["read", "write"], session=session)
    return caller_for_token(raw), cited, refused


def _probe(fn) -> tuple[Any, list[int]]:
    statements = Statements()
    with connection.execute_wrapper(statements):
        try:
            result = fn()
        except UnknownArtifactVersion as refusal:
            result = refusal
    assert statements.seen
    return result, [checkpoint_rows_touched(sql, params) for sql, params in statements.seen]


def test_a_bound_tokens_citation_reads_only_the_checkpoints_that_cite_it(big_session):
    who, cited, refused = big_session
    given = cited.current_version
    result, touched = _probe(lambda: require_versions(who, who.project.id, [(given.artifact_id, given.fingerprint)], what="x"))
    assert result == {(given.artifact_id, given.fingerprint): given.id}
    assert max(touched) <= MAX_CHECKPOINT_ROWS, touched
    # refused (cited by none of the 20,000): the same probes, nothing read in order
    outside = refused.current_version
    result, touched = _probe(lambda: require_versions(who, who.project.id, [(outside.artifact_id, outside.fingerprint)], what="x"))
    assert isinstance(result, UnknownArtifactVersion)
    assert result.details["missing"] == [{"artifact_id": outside.artifact_id, "fingerprint": outside.fingerprint}]
    assert max(touched) <= MAX_CHECKPOINT_ROWS, touched


def test_reads_by_id_take_the_same_probes(big_session):
    who, cited, refused = big_session
    for artifact, found in ((cited, True), (refused, False)):
        rows, touched = _probe(lambda: list(who.scope("artifact", Artifact.objects.filter(id=artifact.id), artifacts=[artifact.id])))
        assert [a.id for a in rows] == ([artifact.id] if found else [])
        assert max(touched) <= MAX_CHECKPOINT_ROWS, touched
        version = artifact.current_version
        rows, touched = _probe(lambda: list(who.scope("artifact_version", ArtifactVersion.objects.filter(id=version.id),
                                                      versions=[version.id])))
        assert [v.id for v in rows] == ([version.id] if found else [])
        assert max(touched) <= MAX_CHECKPOINT_ROWS, touched
    # the list form reads the session's whole reach, by design (a list needs it), and agrees
    listed = set(who.scope("artifact", Artifact.objects.filter(project_id=who.project.id)).values_list("id", flat=True))
    assert cited.id in listed and refused.id not in listed
