"""Garbage collection of graph state (``control/graph_gc.py``): after ``delete_thread`` and
``forget`` the blobs nothing cites go, the ones anything cites stay; a pass is bounded; a pass
racing a put that names a blob by fingerprint never leaves a committed checkpoint citing a
removed blob, nor does a pass racing a plain citation (a checkpoint's refs, a batch's, a run's
frozen inputs, a handoff's inputs), in either order; retention thins sessions at rest.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from novelforge_sessions.actions import artifacts
from novelforge_sessions.control import batch, checkpoints, graph_gc, graphs
from novelforge_sessions.control.models import GraphBlob, GraphCheckpoint, GraphThread, GraphWrite, Handoff
from novelforge_sessions.metrics import GRAPH_BLOBS_COLLECTED
from novelforge_sessions.models import Artifact, ArtifactVersion, Checkpoint, Run, Session
from tests.control.conftest import make_artifact, token_api
from tests.control.test_graph_threads import blob, fingerprint_of, get, put_body
from tests.support.factories import Api, api_session
from tests.support.races import race
from tests.support.responses import ok, refused
from tests.support.snapshots import snapshot
from tests.support.waits import wait_until

pytestmark = pytest.mark.django_db


def blobs() -> set[str]:
    """The names of the graph blobs the database holds."""
    return set(Artifact.objects.filter(kind="graph-blob").values_list("name", flat=True))


def name(text: str) -> str:
    return "blob:" + fingerprint_of("json", blob(text)["data"])


def collect(**kw: Any) -> graph_gc.Collected:
    """A whole collection (no grace: every blob is old enough), from the start."""
    return graph_gc.collect_blobs(graph_gc.Cursor(), grace_seconds=kw.pop("grace_seconds", 0), **kw)


def dangling_refs() -> list[tuple[str, int, int]]:
    """(what, its id, artifact) where a checkpoint's refs, a run's frozen inputs or a handoff's
    inputs cite an artifact that is gone."""
    existing = set(Artifact.objects.values_list("id", flat=True))
    cited = [("checkpoint", c.id, r) for c in Checkpoint.objects.all() for r in c.artifacts]
    cited += [("run", r.id, i) for r in Run.objects.all() for i in r.frozen_inputs or [] if isinstance(i, dict)]
    cited += [("handoff", h.id, i) for h in Handoff.objects.all() for i in h.inputs]
    return [(what, row, ref["artifact_id"]) for what, row, ref in cited
            if "artifact_id" in ref and ref["artifact_id"] not in existing]


@dataclass
class Paused:
    """A pass paused with its candidates locked (``paused_pass``): set ``delete_now`` to let it
    go on; ``outcome`` holds its result once it ended."""

    delete_now: threading.Event = field(default_factory=threading.Event)
    outcome: list[graph_gc.Collected] = field(default_factory=list)
    pid: int | None = None

    def blocked(self) -> int:
        """How many statements wait for a lock the pass holds (a write waiting for a blob)."""
        with connection.cursor() as c:
            c.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [self.pid])
            return c.fetchone()[0]


@contextmanager
def paused_pass(monkeypatch: pytest.MonkeyPatch) -> Iterator[Paused]:
    """A whole pass in a thread that pauses with its candidates locked, before it deletes them;
    the block starts once it paused, and the pass is let go on and waited for after the block."""
    paused, locked = Paused(), threading.Event()
    real_delete = graph_gc._DELETE_SQL

    class Pausing:
        def __init__(self, cursor):
            self.cursor = cursor

        def execute(self, sql, params=None):
            if sql is real_delete:
                self.cursor.execute("SELECT pg_backend_pid()")
                paused.pid = self.cursor.fetchone()[0]
                locked.set()
                assert paused.delete_now.wait(30)
            return self.cursor.execute(sql, params)

        def __getattr__(self, attr):
            return getattr(self.cursor, attr)

        def __enter__(self):
            self.cursor.__enter__()
            return self

        def __exit__(self, *exc):
            return self.cursor.__exit__(*exc)

    def gc_pass() -> None:
        try:
            with monkeypatch.context() as m:
                m.setattr(graph_gc.connection, "cursor", lambda real=connection.cursor: Pausing(real()))
                paused.outcome.append(collect())
        finally:
            connection.close()

    collector = threading.Thread(target=gc_pass)
    collector.start()
    assert locked.wait(30)
    try:
        yield paused
    finally:
        paused.delete_now.set()
        collector.join(30)


def test_after_delete_thread_a_pass_removes_its_blobs_and_keeps_the_one_another_thread_shares(writer):
    ok(writer.post("/graph-threads/checkpoints", put_body("t-1", blobs={"a": "only t-1", "shared": "both"})), 201)
    ok(writer.post("/graph-threads/checkpoints", put_body("t-1", "0002", "0001", versions={"a": 2, "shared": 1},
                                                          blobs={"a": "t-1 again"})), 201)
    ok(writer.post("/graph-threads/writes", {"thread_id": "t-1", "checkpoint_id": "0002", "task_id": "t",
                                             "writes": [{"idx": 0, "channel": "c", "value": blob("a write")}]}))
    ok(writer.post("/graph-threads/checkpoints", put_body("t-2", blobs={"shared": "both", "b": "only t-2"})), 201)
    assert len(blobs()) == 5
    assert collect().removed == []  # everything is cited
    assert ok(writer.delete("/graph-threads?thread_id=t-1"))["deleted"] is True

    removed = collect().removed
    assert len(removed) == 3
    assert blobs() == {name("both"), name("only t-2")}
    assert ArtifactVersion.objects.filter(artifact__kind="graph-blob").count() == 2
    [item] = get(writer, thread_id="t-2")  # the other thread reads all of its state
    assert set(item["blobs"]) == {"shared", "b"}
    assert collect().removed == []  # nothing more to do


def test_after_forget_a_pass_removes_the_session_s_blobs(writer):
    out = ok(writer.post("/graph-threads/checkpoints", put_body("t-1", blobs={"a": "forgotten", "s": "kept"})), 201)
    ok(writer.post("/graph-threads/checkpoints", put_body("t-2", blobs={"s": "kept"})), 201)
    ok(writer.post(f"/sessions/{out['session_id']}/close", {"runtime_id": out["runtime_id"]}))
    assert writer.delete(f"/sessions/{out['session_id']}").status_code == 204
    assert collect().removed and blobs() == {name("kept")}
    assert (GraphThread.objects.count(), GraphCheckpoint.objects.count()) == (1, 1)


def test_a_blob_anything_else_cites_stays_and_user_artifacts_are_never_candidates(writer, project):
    out = ok(writer.post("/graph-threads/checkpoints", put_body("t-1", blobs={
        "cp": "cited by a checkpoint", "handoff": "a handoff's input", "inputs": "a run's frozen input",
        "gone": "nothing cites this"})), 201)
    held = {n: Artifact.objects.get(name=name(n)) for n in ("cited by a checkpoint", "a handoff's input",
                                                             "a run's frozen input")}

    def ref(text: str) -> list[dict[str, Any]]:
        a = held[text]
        return [{"artifact_id": a.id, "fingerprint": a.current_version.fingerprint}]

    # Another session, an orchestrator's, cites three of the thread's blobs in three ways.
    other = api_session(writer)
    run = ok(writer.post(f"/sessions/{other['id']}/runs", {"frozen_inputs": ref("a run's frozen input")}), 201)
    ok(writer.post(f"/runs/{run['id']}/checkpoints", {"boundary": "context_freeze", "cursor": {"step": 1},
                                                      "artifacts": ref("cited by a checkpoint")}), 201)
    ok(writer.post(f"/runs/{run['id']}/handoffs", {"logical_id": "job", "inputs": ref("a handoff's input")}), 201)
    user = make_artifact(writer, "notes", "a user's artifact, cited by nothing")
    ok(writer.post(f"/sessions/{out['session_id']}/close", {"runtime_id": out["runtime_id"]}))
    assert writer.delete(f"/sessions/{out['session_id']}").status_code == 204

    assert collect(grace_seconds=3600).removed == []  # younger than the grace: kept
    assert len(collect().removed) == 1
    assert blobs() == {name(t) for t in held}
    assert Artifact.objects.filter(id=user["id"]).exists()
    # The kind is reserved: no artifact made through the API is a blob.
    refused(writer.post("/artifacts", {"name": "blob:x", "kind": "graph-blob", "content": "c"}), 422, "validation_error")
    blob_id = held["cited by a checkpoint"].id
    refused(writer.post(f"/artifacts/{blob_id}/versions", {"content": "v2"}), 422, "validation_error")


def test_a_pass_is_bounded_and_the_next_pass_goes_on_where_it_stopped(writer):
    ok(writer.post("/graph-threads/checkpoints", put_body("t-1", blobs={f"c{i}": f"value {i}" for i in range(7)})), 201)
    ok(writer.delete("/graph-threads?thread_id=t-1"))
    cursor = graph_gc.Cursor()
    first = graph_gc.collect_blobs(cursor, limit=3, batch=2, grace_seconds=0)
    assert len(first.removed) == 3 and len(blobs()) == 4
    second = graph_gc.collect_blobs(cursor, limit=3, batch=2, grace_seconds=0)
    assert len(second.removed) == 3 and len(blobs()) == 1
    third = graph_gc.collect_blobs(cursor, limit=3, batch=2, grace_seconds=0)
    assert len(third.removed) == 1 and blobs() == set()
    assert not set(first.removed) & set(second.removed)


def test_the_reconciler_collects_in_each_pass_and_counts_what_it_removed(writer, settings, caplog):
    ok(writer.post("/graph-threads/checkpoints", put_body("t-1", blobs={"a": "x", "b": "y"})), 201)
    ok(writer.delete("/graph-threads?thread_id=t-1"))
    settings.GRAPH_GC_GRACE_SECONDS = 0
    before = GRAPH_BLOBS_COLLECTED._value.get()
    with caplog.at_level("INFO", logger="novelforge.graph_gc"):
        call_command("reconcile_runtimes", stdout=open("/dev/null", "w"))
    assert blobs() == set()
    assert GRAPH_BLOBS_COLLECTED._value.get() - before == 2
    assert any("graph gc: blobs_removed=2 " in r.getMessage() for r in caplog.records)
    call_command("collect_graph_garbage", stdout=open("/dev/null", "w"))  # one pass on its own: nothing left
    assert GRAPH_BLOBS_COLLECTED._value.get() - before == 2


@pytest.mark.django_db(transaction=True)
def test_a_pass_racing_puts_that_name_a_blob_by_fingerprint_never_strands_a_checkpoint(project):
    """Each round: a blob nothing cites (its thread deleted), then a pass and a put naming it by
    fingerprint released together. Either the put cited it first (201, the blob stays) or the pass
    removed it first (the put is 409 graph_blob_missing, nothing written); never a stored
    checkpoint citing a removed blob."""
    api_token = token_api(project, "writer", ["read", "write"]).token
    api = Api(api_token)
    ok(api.post("/graph-threads/checkpoints", put_body("keeper", blobs={"k": "keeps the thread open"})), 201)
    kept = cited = 0
    for i in range(16):
        text = f"round {i}"
        ok(api.post("/graph-threads/checkpoints", put_body(f"gone-{i}", blobs={"v": text})), 201)
        ok(api.delete(f"/graph-threads?thread_id=gone-{i}"))
        fp = name(text)[len("blob:"):]
        body = put_body("keeper", f"{i + 2:04d}", None, versions={"k": 1, "v": i + 1}, open_=False)
        body["blobs"] = [{"channel": "v", "version": i + 1, "fingerprint": fp}]

        def put() -> int:
            return Api(api_token).post("/graph-threads/checkpoints", body).status_code

        (k1, status), (k2, gc) = race([put, lambda: collect()])
        assert (k1, k2) == ("ok", "ok"), (k1, status, k2, gc)
        exists = Artifact.objects.filter(name="blob:" + fp).exists()
        if status == 201:
            assert exists and gc.removed == []
            cited += 1
        else:
            assert status == 409 and not exists and len(gc.removed) == 1
            kept += 1
        assert dangling_refs() == []
    assert cited + kept == 16
    assert GraphCheckpoint.objects.filter(thread__thread_id="keeper").count() == 1 + cited


@pytest.mark.django_db(transaction=True)
def test_a_put_holding_a_blob_makes_the_pass_skip_it_and_a_pass_holding_it_makes_the_put_store_it_again(
        project, monkeypatch, settings):
    """Both orders, forced: a put that resolved a blob holds it until its checkpoint commits (the
    pass skips it); a pass that locked a blob first removes it, and the put that waited for it
    stores its inline value again and cites the new one (in the same request: no recalled
    token's second answer hides a refusal)."""
    settings.TOKEN_RECALL_SECONDS = 0
    api_token = token_api(project, "writer", ["read", "write"]).token
    api = Api(api_token)
    ok(api.post("/graph-threads/checkpoints", put_body("keeper", blobs={"k": "open"})), 201)
    ok(api.post("/graph-threads/checkpoints", put_body("gone", blobs={"v": "contested"})), 201)
    ok(api.delete("/graph-threads?thread_id=gone"))
    body = put_body("keeper", "0002", "0001", versions={"k": 1, "v": 1}, blobs={"v": "contested"}, open_=False)
    body["blobs"] = [b for b in body["blobs"] if b["channel"] == "v"]

    # 1. The put resolves (and locks) the blob, then waits before its checkpoint: the pass skips it.
    resolved, go_on = threading.Event(), threading.Event()
    real = graphs.record_checkpoint

    def paused(*args, **kw):
        resolved.set()
        assert go_on.wait(30)
        return real(*args, **kw)

    monkeypatch.setattr(graphs, "record_checkpoint", paused)
    answers: list[int] = []
    putter = threading.Thread(target=lambda: (answers.append(Api(api_token).post("/graph-threads/checkpoints",
                                                                                 body).status_code),
                                              connection.close()))
    putter.start()
    assert resolved.wait(30)
    assert collect().removed == []  # locked by the put in flight: skipped
    go_on.set()
    putter.join(30)
    assert answers == [201]
    assert collect().removed == []  # now cited
    assert dangling_refs() == []
    monkeypatch.setattr(graphs, "record_checkpoint", real)

    # 2. The pass locks the blob first (it waits before deleting); the put blocks on the lock,
    # then finds the blob gone and stores its value again.
    ok(api.post("/graph-threads/checkpoints", put_body("gone-2", blobs={"w": "contested too"})), 201)
    ok(api.delete("/graph-threads?thread_id=gone-2"))
    old = Artifact.objects.get(name=name("contested too")).id
    body2 = put_body("keeper", "0003", "0002", versions={"k": 1, "v": 1, "w": 1}, blobs={"w": "contested too"},
                     open_=False)
    answers.clear()
    with paused_pass(monkeypatch) as paused:
        putter = threading.Thread(target=lambda: (answers.append(Api(api_token).post("/graph-threads/checkpoints",
                                                                                     body2).status_code),
                                                  connection.close()))
        putter.start()
        wait_until(lambda: paused.blocked() == 1, "the put waiting for the blob the pass locked", timeout=30)
        paused.delete_now.set()
    putter.join(30)
    assert [len(o.removed) for o in paused.outcome] == [1] and answers == [201]
    new = Artifact.objects.get(name=name("contested too")).id
    assert new != old
    assert dangling_refs() == []
    [latest, *_] = get(api, thread_id="keeper")
    assert set(latest["blobs"]) == {"k", "v", "w"}


def test_retention_keeps_the_latest_checkpoint_of_a_session_at_rest_and_the_pass_removes_the_rest(writer):
    out = ok(writer.post("/graph-threads/checkpoints", put_body("old", blobs={"a": "a1", "b": "same"})), 201)
    for step in (2, 3):
        ok(writer.post("/graph-threads/writes", {"thread_id": "old", "checkpoint_id": f"{step - 1:04d}",
                                                 "task_id": "t", "writes": [{"idx": 0, "channel": "a",
                                                                             "value": blob(f"write {step}")}]}))
        ok(writer.post("/graph-threads/checkpoints", put_body("old", f"{step:04d}", f"{step - 1:04d}",
                                                              versions={"a": step, "b": 1}, blobs={"a": f"a{step}"})),
           201)
    young = ok(writer.post("/graph-threads/checkpoints", put_body("young", blobs={"a": "y1"})), 201)
    ok(writer.post("/graph-threads/checkpoints", put_body("young", "0002", "0001", versions={"a": 2},
                                                          blobs={"a": "y2"})), 201)
    for o in (out, young):
        ok(writer.post(f"/sessions/{o['session_id']}/close", {"runtime_id": o["runtime_id"]}))
    Session.objects.filter(id=out["session_id"]).update(updated_at=timezone.now() - timedelta(days=8))
    Session.objects.filter(id=young["session_id"]).update(updated_at=timezone.now() - timedelta(days=6))
    assert graph_gc.apply_retention(graph_gc.Cursor(), days=0) == graph_gc.Thinned()  # 0: keep forever

    thinned = graph_gc.apply_retention(graph_gc.Cursor(), days=7)
    assert thinned == graph_gc.Thinned(sessions=1, checkpoints=2, writes=2, versions=2)
    assert list(GraphCheckpoint.objects.filter(thread__thread_id="old").values_list("checkpoint_id", flat=True)) == ["0003"]
    assert Checkpoint.objects.filter(session_id=out["session_id"]).count() == 1
    assert GraphWrite.objects.filter(thread__thread_id="old").count() == 0
    assert GraphBlob.objects.filter(thread__thread_id="old").count() == 2  # a@3, b@1
    assert GraphCheckpoint.objects.filter(thread__thread_id="young").count() == 2  # 6 days: not yet

    removed = collect().removed
    assert len(removed) == 4  # a1, a2 and the two writes' values
    assert name("a3") in blobs() and name("same") in blobs() and name("a1") not in blobs()
    [latest] = get(writer, thread_id="old")
    assert set(latest["blobs"]) == {"a", "b"}
    assert graph_gc.apply_retention(graph_gc.Cursor(), days=7) == graph_gc.Thinned()  # nothing more


def test_retention_leaves_a_session_that_was_resumed_or_is_running(writer):
    out = ok(writer.post("/graph-threads/checkpoints", put_body("live", blobs={"a": "1"})), 201)
    ok(writer.post("/graph-threads/checkpoints", put_body("live", "0002", "0001", versions={"a": 2}, blobs={"a": "2"})), 201)
    Session.objects.filter(id=out["session_id"]).update(updated_at=timezone.now() - timedelta(days=30))
    assert Session.objects.get(id=out["session_id"]).status == "running"
    assert graph_gc.apply_retention(graph_gc.Cursor(), days=1) == graph_gc.Thinned()
    assert GraphCheckpoint.objects.count() == 2


# ---- A plain citation of a graph blob (a checkpoint's refs, a batch's, a run's frozen inputs, a
# handoff's inputs) holds the blob as a graph put does: a pass between its resolution and its
# commit can no longer leave it citing a removed blob.

#: How each plain citation is written: (the path, its body) for the session ``s`` and its run ``r``.
CITES: dict[str, Any] = {
    "checkpoint": lambda s, r, ref: (f"/runs/{r}/checkpoints", {"boundary": "context_freeze", "cursor": {"step": 1},
                                                                 "artifacts": ref}),
    "keyed checkpoint": lambda s, r, ref: (f"/runs/{r}/checkpoints", {
        "boundary": "context_freeze", "cursor": {"step": 1}, "artifacts": ref, "idempotency_key": "cites-a-blob"}),
    "batch": lambda s, r, ref: (f"/runs/{r}/batch", {"items": [
        {"kind": "cursor", "cursor": {"step": 1}},
        {"kind": "checkpoint", "checkpoint": {"boundary": "context_freeze", "cursor": {"step": 2}, "artifacts": ref}}]}),
    "run": lambda s, r, ref: (f"/sessions/{s}/runs", {"frozen_inputs": ref}),
    "handoff": lambda s, r, ref: (f"/runs/{r}/handoffs", {"logical_id": "job", "inputs": ref}),
}
#: Where each resolves its refs before its write: the single statements resolve them, then hold
#: the blobs in the statement that writes; the ORM writes hold them in their transaction.
RESOLVED = {"checkpoint": (checkpoints, "artifact_refs"), "keyed checkpoint": (checkpoints, "artifact_refs"),
            "batch": (batch, "artifact_refs"), "run": (artifacts, "hold_blobs"), "handoff": (artifacts, "hold_blobs")}


def an_uncited_blob(api: Api) -> tuple[Artifact, list[dict[str, Any]]]:
    """A graph blob nothing cites any more (its thread deleted), and a ref to it."""
    ok(api.post("/graph-threads/checkpoints", put_body("gone", blobs={"v": "an old value"})), 201)
    ok(api.delete("/graph-threads?thread_id=gone"))
    blob_artifact = Artifact.objects.get(name=name("an old value"))
    return blob_artifact, [{"artifact_id": blob_artifact.id, "fingerprint": blob_artifact.current_version.fingerprint}]


def citing(api: Api, kind: str, ref: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """A session of its own for the citation ``kind`` (a run open but for the run's own), its path and body."""
    session = api_session(api, run=kind != "run")
    return CITES[kind](session["id"], session.get("run", {}).get("id"), ref)


def in_a_thread(work: Any) -> Any:
    """``work()`` run to its end in a thread of its own (its own connection and transaction)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: (out.append(work()), connection.close()))
    thread.start()
    thread.join(60)
    assert out, "the thread did not finish"
    return out[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", list(CITES))
def test_a_citation_of_a_blob_a_pass_removed_after_it_was_resolved_is_refused_and_writes_nothing(
        project, monkeypatch, kind):
    """Forced: the refs resolve (the blob is there), then a whole pass removes the blob (nothing
    cited it yet), then the write. Before, the write stored a citation of the removed blob; now
    it finds the blob gone where it holds it, and is refused as a ref that names nothing:
    ``422 unknown_artifact_version`` naming the ref, nothing written."""
    api = Api(token_api(project, "writer", ["read", "write"]).token)
    blob_artifact, ref = an_uncited_blob(api)
    path, body = citing(api, kind, ref)
    module, attr = RESOLVED[kind]
    real, passes = getattr(module, attr), []
    if module is artifacts:  # an ORM write: the pass between the refs' read and their hold
        def then_a_pass(blobs: list[int]) -> set[int]:
            passes.append(in_a_thread(collect))
            return real(blobs)
    else:  # a single statement: the pass between the refs' resolution and the statement holding them
        def then_a_pass(*args: Any, **kw: Any) -> Any:
            resolved = real(*args, **kw)
            passes.append(in_a_thread(collect))
            return resolved

    monkeypatch.setattr(module, attr, then_a_pass)
    before = snapshot(exclude=("Artifact", "ArtifactVersion"))
    err = refused(api.post(path, body), 422, "unknown_artifact_version", unchanged=before)
    assert err["details"]["missing"] == ref
    if kind == "batch":
        assert err["details"]["item"] == 1
    assert [p.removed for p in passes] == [[blob_artifact.id]]
    assert not Artifact.objects.filter(id=blob_artifact.id).exists()
    assert dangling_refs() == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", list(CITES))
def test_a_pass_that_locked_a_blob_first_makes_a_citation_wait_then_refuse(project, monkeypatch, kind):
    """Forced: a pass locks the blob and waits before it deletes; the write waits for that lock
    (where it holds the blob: in its statement, or in its transaction), then finds the blob gone:
    ``422 unknown_artifact_version``, nothing written. Before, the write did not wait and its
    citation was there when the pass deleted the blob."""
    api = Api(token_api(project, "writer", ["read", "write"]).token)
    blob_artifact, ref = an_uncited_blob(api)
    path, body = citing(api, kind, ref)
    before = snapshot(exclude=("Artifact", "ArtifactVersion"))
    with paused_pass(monkeypatch) as paused:
        answers: list[Any] = []
        writer = threading.Thread(target=lambda: (answers.append(Api(api.token).post(path, body)), connection.close()))
        writer.start()
        wait_until(lambda: paused.blocked() == 1, "the write waiting for the blob the pass locked", timeout=30)
        paused.delete_now.set()
        writer.join(30)
    assert [o.removed for o in paused.outcome] == [[blob_artifact.id]]
    err = refused(answers[0], 422, "unknown_artifact_version", unchanged=before)
    assert err["details"]["missing"] == ref
    assert dangling_refs() == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["run", "handoff"])
def test_a_citation_in_its_transaction_holds_the_blob_and_a_pass_skips_it(project, monkeypatch, kind):
    """Forced: the write has resolved and holds the blob, and waits before it commits; a pass
    skips the blob (before, it removed it: the citation was not committed yet, and then was,
    naming a removed blob). The write commits; the blob stays, cited."""
    api = Api(token_api(project, "writer", ["read", "write"]).token)
    blob_artifact, ref = an_uncited_blob(api)
    path, body = citing(api, kind, ref)
    held, go_on = threading.Event(), threading.Event()
    real = artifacts.hold_blobs

    def holding(blobs: list[int]) -> set[int]:
        out = real(blobs)
        held.set()
        assert go_on.wait(30)
        return out

    monkeypatch.setattr(artifacts, "hold_blobs", holding)
    answers: list[Any] = []
    writer = threading.Thread(target=lambda: (answers.append(Api(api.token).post(path, body)), connection.close()))
    writer.start()
    assert held.wait(30)
    assert collect().removed == []  # held by the write in flight: skipped
    go_on.set()
    writer.join(30)
    ok(answers[0], 201)
    assert collect().removed == []  # now cited
    assert Artifact.objects.filter(id=blob_artifact.id).exists() and dangling_refs() == []


@pytest.mark.django_db(transaction=True)
def test_holding_blobs_outside_a_transaction_is_refused_and_inside_one_finds_the_blobs_there(project):
    """``hold_blobs`` refuses to run where its lock would end with its own statement; in a
    transaction it answers the graph blobs still there (an artifact of another kind is never held)."""
    api = Api(token_api(project, "writer", ["read", "write"]).token)
    blob_artifact, _ref = an_uncited_blob(api)
    user = make_artifact(api, "notes", "a user's artifact")
    with pytest.raises(RuntimeError, match="outside a transaction"):
        artifacts.hold_blobs([blob_artifact.id])
    with transaction.atomic():
        assert artifacts.hold_blobs([blob_artifact.id, user["id"], 0]) == {blob_artifact.id}

