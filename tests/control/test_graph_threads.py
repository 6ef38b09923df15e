"""Graph threads (``/graph-threads…``): the LangGraph checkpointer's server side.

A thread is a session, a graph checkpoint a bounded checkpoint citing content-addressed blob
artifacts; refusals are typed and write nothing; the first puts of one thread race to one session.
"""
from __future__ import annotations

import base64
import threading
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from novelforge_sessions.control import graphs
from novelforge_sessions.control.checkpoints import Beside, record_checkpoint
from novelforge_sessions.control.models import GraphBlobChunk, GraphCheckpoint, GraphThread, GraphWrite
from novelforge_sessions.errors import RunNotOpen
from novelforge_sessions.models import Artifact, Checkpoint, Run, Session
from tests.support.factories import Api, caller_for
from tests.control.conftest import token_api
from tests.support.races import oks, race
from tests.support.responses import assert_refused, ok, refused
from tests.support.servers import database_url
from tests.support.snapshots import snapshot
from tests.support.waits import wait_until

pytestmark = pytest.mark.django_db


def blob(text: str) -> dict[str, str]:
    return {"serde": "json", "data": base64.b64encode(text.encode()).decode()}


def put_body(thread: str = "t-1", cp: str = "0001", parent: str | None = None, *, versions: dict[str, int] | None = None,
             blobs: dict[str, str] | None = None, open_: bool = True, **extra: Any) -> dict[str, Any]:
    versions = versions if versions is not None else {k: 1 for k in (blobs or {})}
    body: dict[str, Any] = {
        "thread_id": thread, "checkpoint_id": cp, "parent_checkpoint_id": parent,
        "checkpoint": {"v": 1, "id": cp, "ts": "2026-12-01T00:00:00+00:00", "channel_versions": versions,
                       "versions_seen": {}},
        "metadata": {"source": "loop", "step": 0},
        "blobs": [{"channel": ch, "version": versions[ch], "value": blob(v)} for ch, v in (blobs or {}).items()],
        **extra,
    }
    if open_:
        body["open"] = {"task_mode": "drafting"}
    return body


def get(api: Api, **params: Any) -> list[dict[str, Any]]:
    return ok(api.get("/graph-threads/checkpoints", **params))["items"]


def test_the_first_put_opens_a_session_and_records_a_bounded_checkpoint_citing_blob_artifacts(writer):
    out = ok(writer.post("/graph-threads/checkpoints", put_body(blobs={"messages": "a long chat", "draft": "text"})), 201)
    session = Session.objects.get(id=out["session_id"])
    assert session.status == "running" and session.task_mode == "drafting"
    assert session.provider_metadata == {"graph_thread_id": "t-1"}
    assert out["runtime_id"] == session.runtimes.get().id
    record = Checkpoint.objects.get(id=out["record_id"])
    assert record.run_id == out["run_id"] and record.boundary == "context_freeze"
    assert record.cursor == {"graph": {"checkpoint_ns": "", "checkpoint_id": "0001", "step": 0}}
    blobs = Artifact.objects.filter(kind="graph-blob")
    assert blobs.count() == 2 and all(a.name == "blob:" + a.current_version.fingerprint for a in blobs)
    assert sorted(r["fingerprint"] for r in record.artifacts) == sorted(a.current_version.fingerprint for a in blobs)
    assert "a long chat" not in str(record.cursor) + str(GraphCheckpoint.objects.get().document)
    [item] = get(writer, thread_id="t-1")
    assert base64.b64decode(item["blobs"]["messages"]["data"]).decode() == "a long chat"
    assert item["session_id"] == session.id and item["parent_checkpoint_id"] is None


def test_unchanged_channels_are_found_at_their_versions_and_equal_content_is_stored_once(writer):
    ok(writer.post("/graph-threads/checkpoints", put_body(blobs={"a": "v1", "b": "same"})), 201)
    ok(writer.post("/graph-threads/checkpoints", put_body("t-1", "0002", "0001", versions={"a": 2, "b": 1},
                                                          blobs={"a": "v2"})), 201)
    ok(writer.post("/graph-threads/checkpoints", put_body("t-2", "0001", blobs={"b": "same"})), 201)
    newest, oldest = get(writer, thread_id="t-1")
    assert {k: base64.b64decode(v["data"]).decode() for k, v in newest["blobs"].items()} == {"a": "v2", "b": "same"}
    assert {k: base64.b64decode(v["data"]).decode() for k, v in oldest["blobs"].items()} == {"a": "v1", "b": "same"}
    assert newest["parent_checkpoint_id"] == "0001"
    assert Artifact.objects.filter(kind="graph-blob").count() == 3  # v1, v2, same: once for both threads


def test_a_retried_put_returns_the_first_and_a_different_one_under_the_same_id_is_a_conflict(writer):
    first = ok(writer.post("/graph-threads/checkpoints", put_body(blobs={"a": "x"})), 201)
    again = ok(writer.post("/graph-threads/checkpoints", put_body(blobs={"a": "x"})), 200)
    assert again["record_id"] == first["record_id"] and again["created"] is False
    before = snapshot()
    err = refused(writer.post("/graph-threads/checkpoints", put_body(blobs={"a": "y"})), 409, "graph_checkpoint_conflict")
    assert err["details"]["checkpoint_id"] == "0001"
    assert snapshot() == before


@pytest.mark.parametrize(("change", "field"), [
    ({"checkpoint": {"channel_values": {"a": 1}}}, "checkpoint.channel_values"),
    ({"blobs": [{"channel": "a", "version": 1, "value": {"serde": "json", "data": "not base64!"}}]}, "blobs[0].data"),
    ({"blobs": [{"channel": "a", "version": True, "value": blob("x")}]}, "blobs.0.version"),
    ({"metadata": {"big": "x" * 20_000}}, "metadata"),
    ({"checkpoint_id": ""}, "checkpoint_id"),
])
def test_invalid_puts_are_422_naming_the_field_and_write_nothing(writer, change, field):
    before = snapshot()
    err = refused(writer.post("/graph-threads/checkpoints", {**put_body(), **change}), 422, "validation_error")
    assert field in str(err["details"]) or field in err["message"], err
    assert snapshot() == before


def test_the_longest_ids_namespaces_channels_and_versions_in_four_byte_characters_are_stored_and_read_back(writer):
    """Every unique key of the graph's rows holds its longest values (a namespace of
    ``MAX_PATH_LENGTH`` bytes, a channel of 200 characters of four bytes each, the longest
    version and ids) within what a PostgreSQL index entry holds: stored, and read back as sent."""
    wide = "\U0001F600"  # four bytes as UTF-8
    thread, ns = wide * (graphs.MAX_PATH_LENGTH // 4), wide * (graphs.MAX_PATH_LENGTH // 4)
    channel, version = wide * graphs.MAX_NAME_LENGTH, "v" * graphs.MAX_VERSION_LENGTH
    cp, task = wide * graphs.MAX_ID_LENGTH, wide * graphs.MAX_ID_LENGTH
    body = put_body(thread, cp, versions={channel: version}, checkpoint_ns=ns)
    body["blobs"] = [{"channel": channel, "version": version, "value": blob("a value")}]
    body["writes"] = [{"checkpoint_id": cp, "task_id": task, "task_path": ns,
                       "writes": [{"idx": 0, "channel": channel, "value": blob("a write")}]}]
    ok(writer.post("/graph-threads/checkpoints", body), 201)
    [item] = get(writer, thread_id=thread, checkpoint_ns=ns)
    assert item["checkpoint_id"] == cp and list(item["checkpoint"]["channel_versions"]) == [channel]
    [write] = item["pending_writes"]
    assert (write["task_id"], write["task_path"], write["channel"]) == (task, ns, channel)


def test_small_scalars_put_inline_live_in_the_checkpoint_with_no_blob_version_row_or_ref(writer):
    from novelforge_sessions.control.models import GraphBlob

    scalars = {"step": 2**53, "done": False, "note": "é" * 256, "empty": None, "neg": -(2**53)}
    versions = {**{ch: 1 for ch in scalars}, "messages": 1}
    ok(writer.post("/graph-threads/checkpoints", put_body(versions=versions, blobs={"messages": "a long chat"},
                                                          values=scalars)), 201)
    [item] = get(writer, thread_id="t-1")
    assert item["checkpoint"]["channel_values"] == scalars
    assert set(item["blobs"]) == {"messages"}
    assert list(GraphBlob.objects.values_list("channel", flat=True)) == ["messages"]
    record = Checkpoint.objects.get(id=item["record_id"])
    assert [r["fingerprint"] for r in record.artifacts] == [item["blobs"]["messages"]["fingerprint"]]
    # the next put sends the unchanged scalars again and changes one; the blob is found at its version
    ok(writer.post("/graph-threads/checkpoints", put_body("t-1", "0002", "0001", versions={**versions, "step": 2},
                                                          values={**scalars, "step": 3})), 201)
    newest, _ = get(writer, thread_id="t-1")
    assert newest["checkpoint"]["channel_values"] == {**scalars, "step": 3}
    assert base64.b64decode(newest["blobs"]["messages"]["data"]).decode() == "a long chat"
    assert Checkpoint.objects.get(id=newest["record_id"]).artifacts == record.artifacts
    # a retry of the same put is the same checkpoint; other values under its id are a conflict
    ok(writer.post("/graph-threads/checkpoints", put_body("t-1", "0002", "0001", versions={**versions, "step": 2},
                                                          values={**scalars, "step": 3})), 200)
    refused(writer.post("/graph-threads/checkpoints", put_body("t-1", "0002", "0001", versions={**versions, "step": 2},
                                                               values={**scalars, "step": 4})), 409,
            "graph_checkpoint_conflict")


@pytest.mark.parametrize(("values", "blobs", "field"), [
    ({"a": 1.5}, {}, "values.a"),
    ({"a": [1]}, {}, "values.a"),
    ({"a": {"b": 1}}, {}, "values.a"),
    ({"a": 2**53 + 1}, {}, "values.a"),
    ({"a": "x" * 257}, {}, "values.a"),
    ({"a": 1, "unversioned": 1}, {}, "values.unversioned"),
    ({"a": 1}, {"a": "as a blob too"}, "values.a"),
    ({"Messages": "hi"}, {}, "values.Messages"),
])
def test_a_value_put_inline_that_is_not_a_small_scalar_of_a_versioned_channel_is_422_and_writes_nothing(
        writer, values, blobs, field):
    before = snapshot()
    err = refused(writer.post("/graph-threads/checkpoints", put_body(versions={"a": 1, "Messages": 1}, blobs=blobs,
                                                                     values=values)),
                  422, "validation_error")
    assert field in str(err["details"]) or field in err["message"], err
    assert snapshot() == before


def test_inline_values_are_checked_by_the_action_as_the_schema_declares_them(project):
    """The action's own checks (a caller past the API schema) refuse as the schema does."""
    from novelforge_sessions.errors import ValidationFailed

    who = caller_for(project)
    for values, field in (({"a": 1.0}, "values.a"), ({"a": True, "b": 1}, "values.b"), ({"a": "x" * 257}, "values.a")):
        with pytest.raises(ValidationFailed) as refusal:
            graphs.put_checkpoint(who, thread_id="t-1", checkpoint_ns="", checkpoint_id="0001",
                                  parent_checkpoint_id=None, checkpoint={"v": 1, "channel_versions": {"a": 1}},
                                  metadata={}, blobs=[], open_spec=graphs.ThreadSpec(), values=values)
        assert refusal.value.details["field"] == field
    assert not GraphCheckpoint.objects.exists() and not Session.objects.exists()


def test_an_unknown_thread_without_open_is_404_and_a_reader_is_403(writer, reader):
    before = snapshot()
    refused(writer.post("/graph-threads/checkpoints", put_body(open_=False)), 404, "not_found")
    refused(reader.post("/graph-threads/checkpoints", put_body()), 403, "forbidden")
    assert snapshot() == before


def test_a_session_without_an_open_run_refuses_the_put_until_resumed(writer):
    out = ok(writer.post("/graph-threads/checkpoints", put_body()), 201)
    ok(writer.post(f"/sessions/{out['session_id']}/close", {}))
    assert_refused(lambda: writer.post("/graph-threads/checkpoints", put_body(cp="0002", parent="0001")),
                   409, "no_open_run")
    report = ok(writer.post(f"/sessions/{out['session_id']}/resume", {"runtime": {"runtime_family": "langgraph"}}))
    assert report["ok"] and report["checkpoint_id"] == out["record_id"]
    second = ok(writer.post("/graph-threads/checkpoints", put_body(cp="0002", parent="0001")), 201)
    assert second["run_id"] == report["run_id"] != out["run_id"]


def test_a_put_after_the_thread_s_lease_ran_out_is_refused_and_stores_nothing(writer):
    """A graph checkpoint is the run's checkpoint: once the thread's runtime lease ran out (no
    reconciler pass yet), the put is ``no_live_runtime`` and neither the blobs nor the checkpoint land."""
    from tests.sessions.test_liveness import expire

    out = ok(writer.post("/graph-threads/checkpoints", put_body(blobs={"draft": "text"})), 201)
    expire(out["session_id"])
    before = snapshot()
    err = refused(writer.post("/graph-threads/checkpoints",
                              put_body(cp="0002", parent="0001", versions={"draft": 2}, blobs={"draft": "new text"})),
                  409, "no_live_runtime")
    assert err["details"] == {"session_id": out["session_id"], "status": "running"}
    assert snapshot() == before


def test_writes_are_stored_once_per_task_and_index_and_special_channels_keep_the_latest(writer):
    ok(writer.post("/graph-threads/checkpoints", put_body()), 201)
    body = {"thread_id": "t-1", "checkpoint_id": "0001", "task_id": "task-a",
            "writes": [{"idx": 0, "channel": "ch", "value": blob("one")}, {"idx": -3, "channel": "__interrupt__",
                                                                          "value": blob("first")}]}
    assert ok(writer.post("/graph-threads/writes", body))["stored"] == 2
    body["writes"][1]["value"] = blob("second")
    assert ok(writer.post("/graph-threads/writes", body))["stored"] == 1  # the special one, updated
    [item] = get(writer, thread_id="t-1")
    assert [(w["channel"], base64.b64decode(w["data"]).decode()) for w in item["pending_writes"]] == [
        ("__interrupt__", "second"), ("ch", "one")]
    refused(writer.post("/graph-threads/writes", {**body, "thread_id": "nope"}), 404, "not_found")


def test_writes_may_arrive_before_their_checkpoint_lands(writer):
    ok(writer.post("/graph-threads/checkpoints", put_body()), 201)
    early = {"thread_id": "t-1", "checkpoint_id": "0002", "task_id": "task-b",
             "writes": [{"idx": 0, "channel": "ch", "value": blob("early")}]}
    assert ok(writer.post("/graph-threads/writes", early))["stored"] == 1
    assert get(writer, thread_id="t-1", checkpoint_id="0002") == []
    ok(writer.post("/graph-threads/checkpoints", put_body(cp="0002", parent="0001")), 201)
    [item] = get(writer, thread_id="t-1", checkpoint_id="0002")
    assert [base64.b64decode(w["data"]).decode() for w in item["pending_writes"]] == ["early"]
    [first] = get(writer, thread_id="t-1", checkpoint_id="0001")
    assert first["pending_writes"] == []


def test_small_scalar_writes_live_in_their_rows_with_no_blob_and_come_back_as_written(writer):
    """A write whose value is a small JSON scalar keeps it in its own row (``scalar``): no blob
    artifact, no version to cite; ``null`` written is ``null`` read, told apart from a blob by
    its missing fingerprint. A special channel's latest value replaces a blob by a scalar and back."""
    ok(writer.post("/graph-threads/checkpoints", put_body()), 201)
    scalars = [None, True, False, 0, 2**53, -(2**53), "é" * 256, ""]
    body = {"thread_id": "t-1", "checkpoint_id": "0001", "task_id": "task-a",
            "writes": [*({"idx": i, "channel": f"c{i}", "scalar": v} for i, v in enumerate(scalars)),
                       {"idx": len(scalars), "channel": "doc", "value": blob("a blob")},
                       {"idx": -3, "channel": "__interrupt__", "value": blob("first")}]}
    assert ok(writer.post("/graph-threads/writes", body))["stored"] == len(scalars) + 2
    assert Artifact.objects.filter(kind="graph-blob").count() == 2  # "a blob" and "first" only
    rows = GraphWrite.objects.filter(task_id="task-a", idx__gte=0, idx__lt=len(scalars))
    assert rows.count() == len(scalars) and not rows.filter(value__isnull=False).exists()
    [item] = get(writer, thread_id="t-1")
    written = {w["channel"]: w for w in item["pending_writes"]}
    for i, v in enumerate(scalars):
        w = written[f"c{i}"]
        assert (w["fingerprint"], w["serde"], w["data"], w["scalar"]) == (None, None, None, v)
        assert type(w["scalar"]) is type(v)
    assert base64.b64decode(written["doc"]["data"]).decode() == "a blob" and written["doc"]["scalar"] is None
    # the special channel's latest value: a scalar now, then a blob again
    body["writes"][-1] = {"idx": -3, "channel": "__interrupt__", "scalar": "second"}
    assert ok(writer.post("/graph-threads/writes", body))["stored"] == 1
    [item] = get(writer, thread_id="t-1")
    assert [(w["fingerprint"], w["scalar"]) for w in item["pending_writes"] if w["idx"] == -3] == [(None, "second")]
    body["writes"][-1] = {"idx": -3, "channel": "__interrupt__", "value": blob("third")}
    assert ok(writer.post("/graph-threads/writes", body))["stored"] == 1
    [item] = get(writer, thread_id="t-1")
    [special] = [w for w in item["pending_writes"] if w["idx"] == -3]
    assert base64.b64decode(special["data"]).decode() == "third" and special["scalar"] is None
    # a put carrying a task's scalar writes stores them the same way, in its transaction
    carried = put_body(cp="0002", parent="0001", writes=[{"checkpoint_id": "0001", "task_id": "task-b",
                                                          "writes": [{"idx": 0, "channel": "step", "scalar": 7}]}])
    ok(writer.post("/graph-threads/checkpoints", carried), 201)
    [row] = GraphWrite.objects.filter(task_id="task-b")
    assert (row.value_id, row.scalar) == (None, "7")
    # a copy of the thread holds the same writes, read back the same
    ok(writer.post("/graph-threads/copy", {"source_thread_id": "t-1", "target_thread_id": "t-copy"}), 201)
    assert [i["pending_writes"] for i in get(writer, thread_id="t-copy")] == [
        i["pending_writes"] for i in get(writer, thread_id="t-1")]
    assert GraphWrite.objects.filter(thread__thread_id="t-copy", value=None).count() == len(scalars) + 1


@pytest.mark.parametrize(("write", "field"), [
    ({"scalar": 1, "value": blob("both")}, "writes[0]"),
    ({"scalar": None, "fingerprint": "sha256:" + "0" * 64}, "writes[0]"),
    ({"scalar": 1.5}, "writes.0.scalar"),
    ({"scalar": [1]}, "writes.0.scalar"),
    ({"scalar": 2**53 + 1}, "writes.0.scalar"),
    ({"scalar": "x" * 257}, "writes.0.scalar"),
    ({"scalar": "hi", "channel": "Messages"}, "writes[0].scalar"),
])
def test_a_scalar_write_that_is_not_a_small_scalar_or_not_alone_is_422_and_writes_nothing(writer, write, field):
    ok(writer.post("/graph-threads/checkpoints", put_body()), 201)
    before = snapshot()
    body = {"thread_id": "t-1", "checkpoint_id": "0001", "task_id": "t", "writes": [{"idx": 0, "channel": "ch", **write}]}
    err = refused(writer.post("/graph-threads/writes", body), 422, "validation_error")
    assert field in str(err["details"]) or field in err["message"], err
    assert snapshot() == before


def test_scalar_writes_are_checked_by_the_action_as_the_schema_declares_them(project):
    """The action's own checks (a caller past the API schema) refuse as the schema does."""
    from novelforge_sessions.errors import ValidationFailed

    who = caller_for(project)
    for write, field in ((graphs.WriteSpec(0, "a", scalar=graphs.Scalar(1.0)), "writes[0].scalar"),
                         (graphs.WriteSpec(0, "a", scalar=graphs.Scalar("x" * 257)), "writes[0].scalar"),
                         (graphs.WriteSpec(0, "a", scalar=graphs.Scalar("a\x00b")), "writes[0].scalar"),
                         (graphs.WriteSpec(0, "history", scalar=graphs.Scalar(1)), "writes[0].scalar"),
                         (graphs.WriteSpec(0, "a", value=graphs.Blob("json", "MQ=="), scalar=graphs.Scalar(1)),
                          "writes[0]")):
        with pytest.raises(ValidationFailed) as refusal:
            graphs.put_writes(who, thread_id="t-1", checkpoint_ns="", checkpoint_id="0001", task_id="t", task_path="",
                              writes=[write], open_spec=graphs.ThreadSpec())
        assert refusal.value.details["field"] == field
    assert not GraphWrite.objects.exists() and not Session.objects.exists()


def test_the_database_keeps_a_write_a_blob_or_a_scalar_never_both_nor_neither(writer):
    ok(writer.post("/graph-threads/checkpoints", put_body()), 201)
    ok(writer.post("/graph-threads/writes", {"thread_id": "t-1", "checkpoint_id": "0001", "task_id": "t",
                                             "writes": [{"idx": 0, "channel": "a", "value": blob("v")},
                                                        {"idx": 1, "channel": "b", "scalar": 1}]}))
    from django.db import IntegrityError, transaction

    for change in ({"scalar": "1"}, {"value": None}):  # the blob write given a scalar too; then neither
        with pytest.raises(IntegrityError, match="graph_write_blob_or_scalar"), transaction.atomic():
            GraphWrite.objects.filter(idx=0).update(**change)
    with pytest.raises(IntegrityError, match="graph_write_blob_or_scalar"), transaction.atomic():
        GraphWrite.objects.filter(idx=1).update(scalar=None)
    assert GraphWrite.objects.filter(idx=0, value__isnull=False, scalar=None).exists()
    assert GraphWrite.objects.filter(idx=1, value=None, scalar="1").exists()
    with connection.cursor() as cursor:  # added NOT VALID by its migration (writes go on), then validated
        cursor.execute("SELECT convalidated FROM pg_constraint WHERE conname = 'graph_write_blob_or_scalar'")
        assert cursor.fetchall() == [(True,)]


def test_list_filters_by_namespace_metadata_before_and_limit(writer):
    for i, (ns, source) in enumerate([("", "input"), ("", "loop"), ("child:1", "loop"), ("", "loop")]):
        body = put_body(cp=f"000{i}")
        body["checkpoint_ns"], body["metadata"] = ns, {"source": source, "step": i}
        ok(writer.post("/graph-threads/checkpoints", body), 201)
    assert [i["checkpoint_id"] for i in get(writer, thread_id="t-1", checkpoint_ns="")] == ["0003", "0001", "0000"]
    assert [i["checkpoint_id"] for i in get(writer, thread_id="t-1")] == ["0003", "0002", "0001", "0000"]
    loop = get(writer, thread_id="t-1", checkpoint_ns="", metadata='{"source": "loop"}')
    assert [i["checkpoint_id"] for i in loop] == ["0003", "0001"]
    assert [i["checkpoint_id"] for i in get(writer, thread_id="t-1", before="0003", limit=1)] == ["0002"]
    refused(writer.get("/graph-threads/checkpoints", thread_id="t-1", metadata="[1]"), 422, "validation_error")


def test_another_projects_token_sees_nothing_of_the_thread(writer, outsider):
    ok(writer.post("/graph-threads/checkpoints", put_body()), 201)
    assert get(outsider, thread_id="t-1") == []
    refused(outsider.get("/graph-threads", thread_id="t-1"), 404, "not_found")
    assert ok(outsider.delete("/graph-threads?thread_id=t-1")) == {"deleted": False, "session_id": None}
    assert GraphThread.objects.count() == 1


def test_delete_closes_the_runtime_and_forgets_the_session(writer):
    out = ok(writer.post("/graph-threads/checkpoints", put_body(blobs={"a": "x"})), 201)
    ok(writer.post("/graph-threads/writes", {"thread_id": "t-1", "checkpoint_id": "0001", "task_id": "t",
                                             "writes": [{"idx": 0, "channel": "c", "value": blob("w")}]}))
    assert ok(writer.delete("/graph-threads?thread_id=t-1")) == {"deleted": True, "session_id": out["session_id"]}
    assert not Session.objects.filter(id=out["session_id"]).exists()
    assert (GraphThread.objects.count(), GraphCheckpoint.objects.count(), GraphWrite.objects.count(),
            Checkpoint.objects.count()) == (0, 0, 0, 0)
    assert Artifact.objects.filter(kind="graph-blob").count() == 2  # blobs are project artifacts and stay
    assert get(writer, thread_id="t-1") == []
    assert ok(writer.delete("/graph-threads?thread_id=t-1"))["deleted"] is False


@pytest.mark.django_db(transaction=True)
def test_eight_threads_racing_to_open_one_graph_thread_make_one_session(project):
    api_token = token_api(project, "writer", ["read", "write"]).token

    def first_put(i: int) -> int:
        resp = Api(api_token).post("/graph-threads/checkpoints", put_body("shared", f"000{i}"))
        assert resp.status_code == 201, resp.content
        return resp.json()["session_id"]

    results = oks(race(first_put, 8))
    assert len(results) == 8 and len(set(results)) == 1
    assert Session.objects.count() == 1 and GraphThread.objects.count() == 1
    assert GraphCheckpoint.objects.count() == 8 and Run.objects.count() == 1


def test_query_strings_postgresql_cannot_hold_are_422_not_500(writer):
    for params in ({"thread_id": "a\x00b"}, {"checkpoint_id": "x\x00"}, {"before": "\x00"}):
        refused(writer.get("/graph-threads/checkpoints", **params), 422, "validation_error")
    refused(writer.get("/graph-threads", thread_id="a\x00"), 422, "validation_error")
    refused(writer.delete("/graph-threads?thread_id=a%00"), 422, "validation_error")


def test_a_write_index_beyond_a_database_integer_is_422(writer):
    ok(writer.post("/graph-threads/checkpoints", put_body()), 201)
    before = snapshot()
    err = refused(writer.post("/graph-threads/writes", {
        "thread_id": "t-1", "checkpoint_id": "0001", "task_id": "t",
        "writes": [{"idx": 2**40, "channel": "c", "value": blob("w")}]}), 422, "validation_error")
    assert "idx" in str(err)
    assert snapshot() == before


def test_a_thread_s_bound_token_cites_a_blob_another_thread_stored_first(project, writer):
    """Blobs are stored once per project, so a value another thread stored first is a version
    written by that thread's token. A token bound to this thread's session still cites it: the
    refs are the thread's own state (other citations are resolved within the caller's reach)."""
    ok(writer.post("/graph-threads/checkpoints", put_body("t-1", blobs={"shared": "the same value"})), 201)
    shared = Artifact.objects.get(kind="graph-blob")
    mine = ok(writer.post("/graph-threads/checkpoints", put_body("t-2", blobs={"x": "x"})), 201)
    bound = token_api(project, "thread-2", ["read", "write"], mine["session_id"])
    assert bound.get(f"/artifacts/{shared.id}").status_code == 404  # not its session's until its thread cites it
    ok(bound.post("/graph-threads/checkpoints", put_body("t-2", "0002", "0001", versions={"x": 1, "shared": 1},
                                                         blobs={"shared": "the same value"}, open_=False)), 201)
    newest = get(bound, thread_id="t-2")[0]
    assert base64.b64decode(newest["blobs"]["shared"]["data"]).decode() == "the same value"
    assert Artifact.objects.filter(kind="graph-blob").count() == 2  # stored once


@pytest.mark.parametrize("version", [
    1, -(2**63), 2**63 - 1, 7.0, 2.5, -6.163970652757638e+131, 2**63, 10**30,
    "v" * 98, "v" * 99, "v" * 120, "00000000000000000000000000000002.0.5712389102", 'a"b', "a\\b", "é", "tab\there",
])
def test_a_channel_version_is_accepted_exactly_when_the_schema_declares_it_valid(writer, version):
    """Versions the schema allowed were refused as "over 100 characters" (a
    23-character number, after ``7.0``-style integral floats were widened to integers; a string
    of 120 characters). The schema now bounds both forms, and the server measures them as
    declared: accepted exactly when declared valid, the same in the blob and the checkpoint."""
    from tests.api.declared import declared_valid

    body = put_body(versions={"messages": version}, blobs={"messages": "hello"})
    valid = declared_valid("GraphPutIn", body)
    assert valid is (isinstance(version, (int, float)) and -(2**63) <= version < 2**63
                     or isinstance(version, str) and len(version) <= 98 and version.isascii()
                     and version.isprintable() and not {'"', "\\"} & set(version))
    before = snapshot()
    resp = writer.post("/graph-threads/checkpoints", body)
    if valid:
        assert resp.status_code == 201, resp.content
        [item] = get(writer, thread_id="t-1")
        assert item["checkpoint"]["channel_versions"] == {"messages": version}
        assert base64.b64decode(item["blobs"]["messages"]["data"]).decode() == "hello"  # found at its version
    else:
        err = refused(resp, 422, "validation_error")
        assert err["details"]["field"] in ("blobs[0].version", "checkpoint.channel_versions.messages"), err
        assert snapshot() == before


def test_checkpoint_channel_versions_are_declared_as_checked(writer):
    from tests.api.declared import declared_valid

    for versions in (None, [], "1"):
        body = put_body()
        body["checkpoint"]["channel_versions"] = versions
        assert not declared_valid("GraphPutIn", body)
        assert_refused(lambda: writer.post("/graph-threads/checkpoints", body), 422, "validation_error")


BAD_OPEN = {"task_mode": "drafting", "capabilities": ["", "NOT A NAME"], "lease_seconds": 1}


@pytest.mark.parametrize("route", ["checkpoints", "writes"])
def test_the_open_spec_is_checked_on_every_call_not_only_when_it_opens_the_thread(writer, route):
    """``open`` was validated only when it opened a thread; on an existing
    thread an invalid spec (capabilities that are no names) was accepted. It is declared invalid,
    and refused on every call, naming ``open.<field>``, before anything is written."""
    from tests.api.declared import declared_valid

    ok(writer.post("/graph-threads/checkpoints", put_body()), 201)
    if route == "checkpoints":
        component, body = "GraphPutIn", put_body(cp="0002", parent="0001")
    else:
        component, body = "GraphWritesIn", {"thread_id": "t-1", "checkpoint_id": "0001", "task_id": "t1",
                                            "writes": [{"idx": 0, "channel": "ch", "value": blob("w")}]}
    assert declared_valid(component, {**body, "open": {"task_mode": "drafting"}})
    for thread in ("t-1", "t-new"):  # an existing thread, and one the call would open
        bad = {**body, "thread_id": thread, "open": BAD_OPEN}
        assert not declared_valid(component, bad)
        before = snapshot()
        err = refused(writer.post(f"/graph-threads/{route}", bad), 422, "validation_error")
        assert err["details"]["field"] == "open.capabilities", err
        assert snapshot() == before
    for spec, field in (({"task_mode": "Not A Mode"}, "open.task_mode"),
                        ({"runtime_family": "x y"}, "open.runtime_family")):
        bad = {**body, "open": spec}
        assert not declared_valid(component, bad)
        err = refused(writer.post(f"/graph-threads/{route}", bad), 422, "validation_error")
        assert err["details"]["field"] == field, err
    stored = writer.post(f"/graph-threads/{route}", {**body, "open": {"task_mode": "drafting"}})
    assert stored.status_code in (200, 201), stored.content


def _queries_of(writer: Api, path: str, body: dict[str, Any], status: int) -> int:
    with CaptureQueriesContext(connection) as captured:
        ok(writer.post(path, body), status)
    return len(captured.captured_queries)


def test_a_put_and_a_write_run_the_same_statements_for_one_blob_and_for_twenty(writer):
    """Set-based: the graph routes write and resolve blobs with a fixed set of statements, not
    one round trip (or several) per blob; the count of 1 blob and of 20 is the same."""
    ok(writer.post("/graph-threads/checkpoints", put_body(blobs={"seed": "x"})), 201)
    counted = {}
    for n in (1, 20):
        values = {f"c{i}": f"value {i} of {n}" for i in range(n)}
        counted[("put", n)] = _queries_of(writer, "/graph-threads/checkpoints",
                                          put_body("t-1", f"put-{n}", "0001", blobs=values), 201)
        counted[("writes", n)] = _queries_of(writer, "/graph-threads/writes", {
            "thread_id": "t-1", "checkpoint_id": f"put-{n}", "task_id": "task",
            "writes": [{"idx": i, "channel": f"c{i}", "value": blob(f"write {i} of {n}")} for i in range(n)],
        }, 200)
    assert counted[("put", 1)] == counted[("put", 20)], counted
    assert counted[("writes", 1)] == counted[("writes", 20)], counted
    # A put to a thread that exists, by a token this process recalls (apikit/auth.py: no lookup
    # of its own, checked in the lock statement): one transaction of the session lock (the
    # thread found by it), the new blobs, the resolve (with the retry check and the open run),
    # the checkpoint with its graph row (one statement). A task's writes: one statement, its own
    # transaction (the thread's lock, the token, the new blobs, the writes).
    assert counted[("put", 1)] == 2 + 4, counted
    assert counted[("writes", 1)] == 1, counted
    # every value landed: 1 + 20 channel blobs, 1 + 20 writes, each content once
    assert GraphWrite.objects.count() == 21
    assert Artifact.objects.filter(kind="graph-blob").count() == 1 + 2 * 21
    [newest] = get(writer, thread_id="t-1", checkpoint_id="put-20")
    assert len(newest["blobs"]) == 20 and len(newest["pending_writes"]) == 20
    assert base64.b64decode(newest["blobs"]["c19"]["data"]).decode() == "value 19 of 20"


def test_every_statement_of_a_put_and_of_a_write_is_short_enough_for_psycopg_to_keep_its_parsing(writer):
    """psycopg parses a statement's text again on every execution when it is longer than
    ``commit.PARSE_CACHED_BYTES`` (it takes such texts for generated ones): every statement a put
    carrying writes, and a task's writes sent alone, run (blobs and scalars alike) fits."""
    from novelforge_sessions import commit

    seen: list[str] = []

    def spy(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    ok(writer.post("/graph-threads/checkpoints", put_body(blobs={"seed": "x"})), 201)
    writes = [{"idx": 0, "channel": "doc", "value": blob("a blob")}, {"idx": 1, "channel": "step", "scalar": 2}]
    with connection.execute_wrapper(spy):
        ok(writer.post("/graph-threads/checkpoints", put_body(
            "t-1", "0002", "0001", versions={"seed": 1, "doc": 2}, blobs={"doc": "new"},
            writes=[{"checkpoint_id": "0001", "task_id": "a", "writes": writes}])), 201)
        ok(writer.post("/graph-threads/writes", {"thread_id": "t-1", "checkpoint_id": "0002", "task_id": "b",
                                                 "writes": writes}))
    assert any("INSERT INTO control_graphwrite" in sql for sql in seen), seen
    assert [len(sql.encode()) for sql in seen if len(sql.encode()) > commit.PARSE_CACHED_BYTES] == []


# ---- blobs by fingerprint, and uploaded in chunks --------------------------------------------------------
def fingerprint_of(serde: str, data: str) -> str:
    return graphs.Blob(serde=serde, data=data).fingerprint()


def chunked(text: str, pieces: int) -> tuple[str, list[str]]:
    """The fingerprint of ``text`` as a json blob, and its base64 split into whole-quantum chunks."""
    data = base64.b64encode(text.encode()).decode()
    size = -(-len(data) // pieces // 4) * 4
    return fingerprint_of("json", data), [data[i:i + size] for i in range(0, len(data), size)]


def upload(api: Api, fp: str, chunks: list[str], serde: str = "json") -> list[dict[str, Any]]:
    return [ok(api.post("/graph-blobs", {"fingerprint": fp, "serde": serde, "index": i, "count": len(chunks),
                                         "data": c})) for i, c in enumerate(chunks)]


def test_a_blob_uploaded_in_chunks_is_stored_on_its_last_chunk_and_named_by_fingerprint(writer):
    text = "a long turn of the chat. " * 4000
    fp, chunks = chunked(text, 3)
    assert len(chunks) == 3
    assert ok(writer.post("/graph-blobs/missing", {"fingerprints": [fp]}))["missing"] == [fp]
    answers = upload(writer, fp, chunks)
    assert [(a["complete"], a["received"]) for a in answers] == [(False, 1), (False, 2), (True, 3)]
    assert not GraphBlobChunk.objects.exists()  # staged chunks go with the blob they made
    version = Artifact.objects.get(name="blob:" + fp).current_version
    assert version.fingerprint == fp and version.content == graphs.blob_content("json", "".join(chunks))
    assert ok(writer.post("/graph-blobs/missing", {"fingerprints": [fp, fingerprint_of("json", "")]}))["missing"] == [
        fingerprint_of("json", "")]
    # A chunk of a blob the project holds is accepted and ignored: uploads are safe to repeat.
    again = {"fingerprint": fp, "serde": "json", "index": 1, "count": 3, "data": chunks[1]}
    assert ok(writer.post("/graph-blobs", again)) == {"fingerprint": fp, "complete": True, "received": 3}
    assert not GraphBlobChunk.objects.exists()
    body = put_body(versions={"messages": 1})
    body["blobs"] = [{"channel": "messages", "version": 1, "fingerprint": fp}]
    ok(writer.post("/graph-threads/checkpoints", body), 201)
    ok(writer.post("/graph-threads/writes", {"thread_id": "t-1", "checkpoint_id": "0001", "task_id": "t",
                                             "writes": [{"idx": 0, "channel": "messages", "fingerprint": fp}]}), 200)
    [item] = get(writer, thread_id="t-1")
    assert base64.b64decode(item["blobs"]["messages"]["data"]).decode() == text
    assert base64.b64decode(item["pending_writes"][0]["data"]).decode() == text
    record = Checkpoint.objects.get(id=item["record_id"])
    assert [(r["artifact_id"], r["fingerprint"]) for r in record.artifacts] == [(version.artifact_id, fp)]
    assert Artifact.objects.filter(kind="graph-blob").count() == 1


@pytest.mark.parametrize("spoil", ["other content", "serde differs", "count differs", "not base64 once joined"])
def test_chunks_that_do_not_make_their_fingerprint_are_refused_and_nothing_is_kept(writer, spoil):
    fp, chunks = chunked("the real content " * 100, 2)
    sent = [{"fingerprint": fp, "serde": "json", "index": i, "count": 2, "data": c} for i, c in enumerate(chunks)]
    if spoil == "other content":
        sent[1]["data"] = base64.b64encode(b"something else").decode()
    elif spoil == "serde differs":
        sent[1]["serde"] = "msgpack"
    elif spoil == "count differs":
        sent[0]["count"] = 3
    else:
        sent[0]["data"] = "QQ=="  # valid alone, but padding in the middle of the joined text
    before = snapshot()
    assert ok(writer.post("/graph-blobs", sent[0]))["complete"] is False
    err = refused(writer.post("/graph-blobs", sent[1]), 422, "graph_blob_mismatch")
    assert err["details"]["fingerprint"] == fp
    assert snapshot() == before and not Artifact.objects.filter(name="blob:" + fp).exists()
    assert not GraphBlobChunk.objects.exists()  # a fresh upload starts clean
    assert [a["complete"] for a in upload(writer, fp, chunks)] == [False, True]  # …and then succeeds


@pytest.mark.parametrize(("chunk", "field"), [
    ({"index": 2, "count": 2}, "index"),
    ({"count": graphs.MAX_CHUNKS + 1}, "count"),
    ({"data": "abc"}, "data"),
    ({"data": "A" * (graphs.MAX_CHUNK_CHARS + 4)}, "data"),
    ({"fingerprint": "sha256:xyz"}, "fingerprint"),
])
def test_an_invalid_chunk_is_422_and_stages_nothing(writer, chunk, field):
    body = {"fingerprint": "sha256:" + "0" * 64, "serde": "json", "index": 0, "count": 2, "data": "QUJD", **chunk}
    err = refused(writer.post("/graph-blobs", body), 422, "validation_error")
    assert field in str(err)
    assert not GraphBlobChunk.objects.exists()


@pytest.mark.parametrize("route", ["checkpoints", "writes"])
def test_a_value_named_by_an_unknown_fingerprint_is_409_and_nothing_is_written(writer, route):
    ok(writer.post("/graph-threads/checkpoints", put_body(blobs={"a": "seed"})), 201)
    unknown = "sha256:" + "e" * 64
    if route == "checkpoints":
        body = put_body("t-1", "0002", "0001", versions={"a": 2, "b": 1}, blobs={"b": "a new inline value"})
        body["blobs"].append({"channel": "a", "version": 2, "fingerprint": unknown})
    else:
        body = {"thread_id": "t-1", "checkpoint_id": "0001", "task_id": "t",
                "writes": [{"idx": 0, "channel": "b", "value": blob("a new inline value")},
                           {"idx": 1, "channel": "a", "fingerprint": unknown}]}
    before = snapshot()
    err = refused(writer.post(f"/graph-threads/{route}", body), 409, "graph_blob_missing")
    assert err["details"]["missing"] == [unknown]
    assert snapshot() == before  # not even the inline value of the refused request


@pytest.mark.parametrize("entry", [{}, {"value": blob("v"), "fingerprint": "sha256:" + "0" * 64}])
def test_a_value_is_inline_or_by_fingerprint_never_both_nor_neither(writer, entry):
    body = put_body(versions={"a": 1})
    body["blobs"] = [{"channel": "a", "version": 1, **entry}]
    assert_refused(lambda: writer.post("/graph-threads/checkpoints", body), 422, "validation_error")


@pytest.mark.django_db(transaction=True)
def test_eight_writers_uploading_one_blob_s_chunks_at_once_store_it_once(project):
    """The chunks of one fingerprint are staged one writer at a time: whichever lands last sees
    all of them and stores the blob; every other answer is an incomplete or complete upload."""

    api_token = token_api(project, "writer", ["read", "write"]).token
    fp, chunks = chunked("eight pieces of one value " * 300, 8)
    assert len(chunks) == 8

    def send(i: int) -> dict[str, Any]:
        resp = Api(api_token).post("/graph-blobs", {"fingerprint": fp, "serde": "json", "index": i, "count": 8,
                                                    "data": chunks[i]})
        assert resp.status_code == 200, resp.content
        return resp.json()

    results = race(send, 8)
    assert all(kind == "ok" for kind, _ in results), results
    assert sum(out["complete"] for _, out in results) == 1
    assert sorted(out["received"] for _, out in results) == list(range(1, 9))
    assert Artifact.objects.filter(name="blob:" + fp).count() == 1 and not GraphBlobChunk.objects.exists()


def test_an_abandoned_upload_s_chunks_are_dropped_when_a_later_upload_starts(writer):
    from datetime import timedelta

    from django.utils import timezone

    abandoned, chunks = chunked("never finished " * 200, 2)
    ok(writer.post("/graph-blobs", {"fingerprint": abandoned, "serde": "json", "index": 0, "count": 2, "data": chunks[0]}))
    fresh = GraphBlobChunk.objects.get()
    GraphBlobChunk.objects.update(created_at=timezone.now() - timedelta(seconds=graphs.STALE_CHUNK_SECONDS + 60))
    other, pieces = chunked("another value " * 200, 2)
    ok(writer.post("/graph-blobs", {"fingerprint": other, "serde": "json", "index": 1, "count": 2, "data": pieces[1]}))
    assert GraphBlobChunk.objects.filter(id=fresh.id).exists()  # only the first chunk of an upload sweeps
    ok(writer.post("/graph-blobs", {"fingerprint": other, "serde": "json", "index": 0, "count": 2, "data": pieces[0]}))
    assert not GraphBlobChunk.objects.exists()  # the stale one swept, the new one stored as its blob
    assert Artifact.objects.filter(name="blob:" + other).exists()
    assert not Artifact.objects.filter(name="blob:" + abandoned).exists()


@pytest.mark.django_db(transaction=True)
def test_sixteen_concurrent_retries_of_one_put_store_one_checkpoint(project):

    api_token = token_api(project, "writer", ["read", "write"]).token
    opened = Api(api_token).post("/graph-threads/checkpoints", put_body("retried", "0001", blobs={"messages": "hi"}))
    assert opened.status_code == 201, opened.content
    body = put_body("retried", "0002", "0001", blobs={"messages": "hi there"}, versions={"messages": 2}, open_=False)

    def retry(_: int) -> tuple[int, int]:
        resp = Api(api_token).post("/graph-threads/checkpoints", body)
        return resp.status_code, resp.json()["record_id"]

    results = race(retry, 16)
    assert [kind for kind, _ in results] == ["ok"] * 16, results
    answers = [answer for _, answer in results]
    assert {status for status, _ in answers} <= {200, 201}, answers
    assert len({record for _, record in answers}) == 1, answers  # every retry answers the one record
    assert GraphCheckpoint.objects.filter(checkpoint_id="0002").count() == 1
    assert Checkpoint.objects.filter(id=answers[0][1]).exists()
    assert Checkpoint.objects.count() == 2 and Run.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_sixteen_concurrent_deliveries_of_one_tasks_writes_store_each_once_and_each_new_value_once(project):
    """A task's writes are one statement of their own (no transaction around them): sixteen
    deliveries at once, each bringing the same new values inline, store one row per (task, idx)
    and one blob per value; a delivery that found a value another had just stored sends its
    statement again instead of refusing it."""
    api_token = token_api(project, "writer", ["read", "write"]).token
    assert Api(api_token).post("/graph-threads/checkpoints", put_body("busy", "0001")).status_code == 201
    body = {"thread_id": "busy", "checkpoint_id": "0002", "task_id": "task", "writes": [
        {"idx": 0, "channel": "messages", "value": blob("a new message")},
        {"idx": 1, "channel": "draft", "value": blob("a new draft")},
        {"idx": -1, "channel": "__error__", "value": blob("the latest error")},
    ]}

    def deliver(_: int) -> int:
        resp = Api(api_token).post("/graph-threads/writes", body)
        assert resp.status_code == 200, resp.content
        return resp.json()["stored"]

    stored = oks(race(deliver, 16))
    assert sum(1 for n in stored if n >= 2) == 1, stored  # one delivery stored idx 0 and 1; the rest only the latest -1
    assert GraphWrite.objects.filter(checkpoint_id="0002").count() == 3
    assert Artifact.objects.filter(kind="graph-blob").count() == 3


@pytest.mark.django_db(transaction=True)
def test_a_thread_deleted_while_its_tasks_write_answers_each_write_stored_or_not_found_never_500(project):
    api_token = token_api(project, "writer", ["read", "write"]).token
    assert Api(api_token).post("/graph-threads/checkpoints", put_body("doomed", "0001")).status_code == 201

    def write(i: int) -> Any:
        resp = Api(api_token).post("/graph-threads/writes", {
            "thread_id": "doomed", "checkpoint_id": "0002", "task_id": f"task-{i}",
            "writes": [{"idx": 0, "channel": "c", "value": blob(f"value {i}")}]})
        assert resp.status_code in (200, 404), resp.content
        return resp.status_code

    def delete() -> Any:
        resp = Api(api_token).delete("/graph-threads?thread_id=doomed")
        assert resp.status_code == 200, resp.content
        return resp.json()["deleted"]

    results = oks(race([delete, *[lambda i=i: write(i) for i in range(11)]]))
    assert results[0] is True
    assert not GraphThread.objects.exists() and not GraphWrite.objects.exists()  # stored ones went with the thread


@pytest.mark.django_db(transaction=True)
def test_a_value_another_writer_commits_while_the_writes_wait_for_it_is_found_by_sending_them_again(project):
    """The writes' statement inserts a new inline value; another writer inserting the same value
    holds it uncommitted, so the statement waits, then skips it (ON CONFLICT) without seeing it
    (its snapshot is older): it stores nothing, and is sent again, which finds it. Stored once."""
    api_token = token_api(project, "writer", ["read", "write"]).token
    assert Api(api_token).post("/graph-threads/checkpoints", put_body("contended", "0001")).status_code == 201
    value = blob("the contended value")
    fp = graphs.Blob(**value).fingerprint()
    answer: dict[str, Any] = {}

    def deliver() -> None:
        try:
            answer["resp"] = Api(api_token).post("/graph-threads/writes", {
                "thread_id": "contended", "checkpoint_id": "0002", "task_id": "task",
                "writes": [{"idx": 0, "channel": "c", "value": value}]})
        finally:
            connection.close()

    with psycopg.connect(database_url(), autocommit=True) as admin, psycopg.connect(database_url()) as other:
        other.execute(graphs._INSERT_BLOBS_SQL, [[fp], [graphs.blob_content(**value)], project.id, "other"])
        writer = threading.Thread(target=deliver)
        writer.start()
        wait_until(lambda: admin.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchall(), "the writes to wait for the other writer's value", timeout=10, interval=0.02)
        other.commit()
        writer.join(timeout=30)
    assert answer["resp"].status_code == 200 and answer["resp"].json()["stored"] == 1, answer["resp"].content
    [stored] = GraphWrite.objects.filter(checkpoint_id="0002").select_related("value")
    assert stored.value.fingerprint == fp and stored.value.created_by == "other"
    assert Artifact.objects.filter(name="blob:" + fp).count() == 1


def test_a_put_carries_the_tasks_writes_before_it_in_its_own_transaction(writer):
    """One request per superstep: the put carries the task's writes (stored first, as the writes
    route stores them), and names by fingerprint the value they carry inline."""
    ok(writer.post("/graph-threads/checkpoints", put_body(blobs={"draft": "v1"})), 201)
    value = blob("v2")
    fp = graphs.Blob(**value).fingerprint()
    body = put_body("t-1", "0002", "0001", versions={"draft": 2}, open_=False)
    body["blobs"] = [{"channel": "draft", "version": 2, "fingerprint": fp}]
    body["writes"] = [{"checkpoint_id": "0001", "task_id": "task", "writes": [{"idx": 0, "channel": "draft", "value": value}]}]
    ok(writer.post("/graph-threads/checkpoints", body), 201)
    [stored] = GraphWrite.objects.filter(checkpoint_id="0001", task_id="task").select_related("value")
    assert stored.value.fingerprint == fp and Artifact.objects.filter(name="blob:" + fp).count() == 1
    [newest, parent] = get(writer, thread_id="t-1")
    assert base64.b64decode(newest["blobs"]["draft"]["data"]).decode() == "v2"
    assert [(w["task_id"], w["channel"]) for w in parent["pending_writes"]] == [("task", "draft")]
    ok(writer.post("/graph-threads/checkpoints", body), 200)  # a retry: stored once
    assert GraphWrite.objects.filter(checkpoint_id="0001").count() == 1


@pytest.mark.parametrize("spoil", ["refused put", "invalid write", "unknown fingerprint"])
def test_a_put_and_the_writes_it_carries_are_stored_together_or_not_at_all(writer, spoil):
    ok(writer.post("/graph-threads/checkpoints", put_body(blobs={"draft": "v1"})), 201)
    body = put_body("t-1", "0002", "0001", versions={"draft": 2}, blobs={"draft": "v2"}, open_=False)
    body["writes"] = [{"checkpoint_id": "0001", "task_id": "task", "writes": [{"idx": 0, "channel": "draft",
                                                                               "value": blob("v2")}]}]
    if spoil == "refused put":
        body["parent_checkpoint_id"] = "other"  # the id names another checkpoint already: a conflict
        body["checkpoint_id"] = "0001"
    elif spoil == "invalid write":
        body["writes"][0]["writes"][0]["channel"] = ""
    else:
        body["writes"][0]["writes"][0] = {"idx": 0, "channel": "draft", "fingerprint": "sha256:" + "0" * 64}
    before = snapshot()
    resp = writer.post("/graph-threads/checkpoints", body)
    expected = {"refused put": (409, "graph_checkpoint_conflict"), "invalid write": (422, "validation_error"),
                "unknown fingerprint": (409, "graph_blob_missing")}[spoil]
    assert (resp.status_code, resp.json()["error"]["code"]) == expected, resp.content
    if spoil == "invalid write":
        assert resp.json()["error"]["details"]["field"].startswith("writes.0.writes.0") or \
            resp.json()["error"]["details"]["field"].startswith("writes[0].writes[0]"), resp.content
    before.assert_unchanged()


# ---- copy, prune, delete for runs -------------------------------------------------------------------------
def texts(item: dict[str, Any]) -> dict[str, str]:
    return {ch: base64.b64decode(b["data"]).decode() for ch, b in item["blobs"].items()}


def history(api: Api, thread: str = "t-1") -> None:
    """A thread with two namespaces: root 0001 → 0002 → 0003 (``draft`` changes each time, ``notes``
    never), child:1 c001 → c002; a pending write on 0001 and on the latest 0003."""
    ok(api.post("/graph-threads/checkpoints", put_body(thread, "0001", blobs={"draft": "d1", "notes": "n"})), 201)
    ok(api.post("/graph-threads/checkpoints", put_body(thread, "0002", "0001", versions={"draft": 2, "notes": 1},
                                                       blobs={"draft": "d2"})), 201)
    for cp, parent, value in (("c001", None, "c1"), ("c002", "c001", "c2")):
        body = put_body(thread, cp, parent, versions={"child": int(cp[-1])}, blobs={"child": value})
        body["checkpoint_ns"] = "child:1"
        ok(api.post("/graph-threads/checkpoints", body), 201)
    ok(api.post("/graph-threads/checkpoints", put_body(thread, "0003", "0002", versions={"draft": 3, "notes": 1},
                                                       blobs={"draft": "d3"})), 201)
    for cp in ("0001", "0003"):
        ok(api.post("/graph-threads/writes", {"thread_id": thread, "checkpoint_id": cp, "task_id": f"task-{cp}",
                                              "writes": [{"idx": 0, "channel": "draft", "value": blob(f"w{cp}")}]}))


def graph_events(session_id: int, type_: str) -> list[dict[str, Any]]:
    from novelforge_sessions.models import Event

    return [e.payload for e in Event.objects.filter(session_id=session_id, type=type_).order_by("id")]


def test_a_copy_is_a_new_session_with_the_source_s_spec_whose_history_starts_from_the_copy(writer):
    history(writer)
    source = GraphThread.objects.get(thread_id="t-1")
    blobs_before = Artifact.objects.filter(kind="graph-blob").count()
    source_rows = sorted(GraphCheckpoint.objects.filter(thread=source).values_list(
        "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "metadata", "document"))
    out = ok(writer.post("/graph-threads/copy", {"source_thread_id": "t-1", "target_thread_id": "t-copy"}), 201)
    assert (out["checkpoints"], out["writes"], out["source_session_id"]) == (5, 2, source.session_id)
    copy = Session.objects.get(id=out["session_id"])
    origin = source.session
    assert copy.id != origin.id and copy.status == "running" and copy.provider_metadata == {"graph_thread_id": "t-copy"}
    assert (copy.role, copy.memory_policy, copy.task_mode, copy.runtime_family) == (
        origin.role, origin.memory_policy, origin.task_mode, origin.runtime_family)
    assert copy.runtimes.get().id == out["runtime_id"] and copy.runtimes.get().generation == 1
    [run] = Run.objects.filter(session=copy)
    assert run.id == out["run_id"] and run.seq == 1 and run.checkpoint_count == 5
    # every checkpoint of the source is a bounded checkpoint of the copy's run, in the order recorded
    records = list(Checkpoint.objects.filter(session=copy).order_by("id"))
    assert [r.seq for r in records] == [1, 2, 3, 4, 5] and {r.run_id for r in records} == {run.id}
    assert [r.cursor["graph"]["checkpoint_id"] for r in records] == ["0001", "0002", "c001", "c002", "0003"]
    assert run.cursor == records[-1].cursor
    assert sorted(GraphCheckpoint.objects.filter(thread__thread_id="t-copy").values_list(
        "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "metadata", "document")) == source_rows
    # …read back as the source's (values shared by fingerprint: no blob stored again)
    for ns in ("", "child:1"):
        assert [(i["checkpoint_id"], texts(i), [w["task_id"] for w in i["pending_writes"]])
                for i in get(writer, thread_id="t-copy", checkpoint_ns=ns)] == [
            (i["checkpoint_id"], texts(i), [w["task_id"] for w in i["pending_writes"]])
            for i in get(writer, thread_id="t-1", checkpoint_ns=ns)]
    assert Artifact.objects.filter(kind="graph-blob").count() == blobs_before
    assert graph_events(copy.id, "graph.thread_copied") == [{
        "thread_id": "t-copy", "source_thread_id": "t-1", "source_session_id": origin.id, "checkpoints": 5, "writes": 2}]
    # The copy goes on from its latest checkpoint: an unchanged channel is found at its copied version.
    nxt = ok(writer.post("/graph-threads/checkpoints", put_body("t-copy", "0004", "0003", versions={"draft": 4, "notes": 1},
                                                                blobs={"draft": "d4"}, open_=False)), 201)
    assert nxt["run_id"] == run.id and Checkpoint.objects.get(id=nxt["record_id"]).seq == 6
    assert texts(get(writer, thread_id="t-copy", checkpoint_ns="")[0]) == {"draft": "d4", "notes": "n"}
    assert [i["checkpoint_id"] for i in get(writer, thread_id="t-1", checkpoint_ns="")] == ["0003", "0002", "0001"]


def test_a_copy_refused_writes_nothing(project, writer, reader, outsider):
    history(writer)
    ok(writer.post("/graph-threads/checkpoints", put_body("t-2")), 201)
    own = token_api(project, "thread-1", ["read", "write"], GraphThread.objects.get(thread_id="t-1").session_id)
    other = token_api(project, "thread-2", ["read", "write"], GraphThread.objects.get(thread_id="t-2").session_id)
    before = snapshot()
    body = {"source_thread_id": "t-1", "target_thread_id": "t-new"}
    refused(writer.post("/graph-threads/copy", {**body, "target_thread_id": "t-2"}), 409, "graph_thread_exists")
    refused(outsider.post("/graph-threads/copy", body), 404, "not_found")  # another project's token
    refused(other.post("/graph-threads/copy", body), 404, "not_found")  # bound to another session
    refused(own.post("/graph-threads/copy", body), 403, "forbidden")  # bound: opens no session, not even a copy
    refused(reader.post("/graph-threads/copy", body), 403, "forbidden")
    refused(writer.post("/graph-threads/copy", {**body, "source_thread_id": "nope"}), 404, "not_found")
    before.assert_unchanged()


def test_prune_keep_latest_keeps_what_resume_needs_and_says_what_went(writer):
    history(writer)
    thread = GraphThread.objects.get(thread_id="t-1")
    session_id = thread.session_id
    latest = GraphCheckpoint.objects.get(thread=thread, checkpoint_id="0003")
    out = ok(writer.post("/graph-threads/prune", {"thread_ids": ["t-1", "not-a-thread"], "strategy": "keep_latest"}))
    # 0001, 0002 and c001 went; the write on 0001; draft's versions 1 and 2, child's version 1
    assert out == {"threads": [{"thread_id": "t-1", "session_id": session_id, "checkpoints": 3, "writes": 1,
                                "channel_versions": 3, "run_ids": []}]}
    assert [i["checkpoint_id"] for i in get(writer, thread_id="t-1", checkpoint_ns="")] == ["0003"]
    assert [i["checkpoint_id"] for i in get(writer, thread_id="t-1", checkpoint_ns="child:1")] == ["c002"]
    [item] = get(writer, thread_id="t-1", checkpoint_ns="")
    assert texts(item) == {"draft": "d3", "notes": "n"}  # notes, unchanged since 0001, still loads
    assert [base64.b64decode(w["data"]).decode() for w in item["pending_writes"]] == ["w0003"]
    assert sorted(Checkpoint.objects.filter(session_id=session_id).values_list("id", flat=True)) == sorted(
        GraphCheckpoint.objects.filter(thread=thread).values_list("record_id", flat=True))
    assert graph_events(session_id, "graph.pruned") == [{"thread_id": "t-1", "strategy": "keep_latest", "checkpoints": 3,
                                                         "writes": 1, "channel_versions": 3}]
    # The session resumes from the latest checkpoint, and the graph goes on from it.
    ok(writer.post(f"/sessions/{session_id}/close", {}))
    report = ok(writer.post(f"/sessions/{session_id}/resume", {"runtime": {"runtime_family": "langgraph"}}))
    assert report["ok"] and report["checkpoint_id"] == latest.record_id
    ok(writer.post("/graph-threads/checkpoints", put_body("t-1", "0004", "0003", versions={"draft": 4, "notes": 1},
                                                          blobs={"draft": "d4"}, open_=False)), 201)
    assert texts(get(writer, thread_id="t-1", checkpoint_ns="")[0]) == {"draft": "d4", "notes": "n"}
    # Pruned again: 0003's graph row goes, but its record stays, the run resumed from it.
    resumed = Run.objects.get(id=report["run_id"])
    assert ok(writer.post("/graph-threads/prune", {"thread_ids": ["t-1"]}))["threads"][0]["checkpoints"] == 1
    assert Checkpoint.objects.filter(id=latest.record_id).exists()
    resumed.refresh_from_db()
    assert resumed.resumed_from_id == latest.record_id
    # nothing more to prune: no event says otherwise
    assert ok(writer.post("/graph-threads/prune", {"thread_ids": ["t-1"]}))["threads"][0]["checkpoints"] == 0
    assert len(graph_events(session_id, "graph.pruned")) == 2


def test_prune_delete_removes_every_checkpoint_and_the_thread_starts_afresh(writer):
    history(writer)
    session_id = GraphThread.objects.get(thread_id="t-1").session_id
    out = ok(writer.post("/graph-threads/prune", {"thread_ids": ["t-1"], "strategy": "delete"}))
    # every checkpoint (5), write (2) and channel version (draft 1–3, notes 1, child 1–2)
    assert out == {"threads": [{"thread_id": "t-1", "session_id": session_id, "checkpoints": 5, "writes": 2,
                                "channel_versions": 6, "run_ids": []}]}
    assert get(writer, thread_id="t-1") == []
    assert not Checkpoint.objects.filter(session_id=session_id).exists() and not GraphWrite.objects.exists()
    assert Session.objects.get(id=session_id).status == "running"  # the session stays
    assert Artifact.objects.filter(kind="graph-blob").count() == 8  # blobs are project artifacts: 6 values, 2 writes
    ok(writer.post("/graph-threads/checkpoints", put_body("t-1", "0009", blobs={"draft": "again"}, open_=False)), 201)
    assert [i["checkpoint_id"] for i in get(writer, thread_id="t-1")] == ["0009"]
    refused(writer.post("/graph-threads/prune", {"thread_ids": ["t-1"], "strategy": "everything"}), 422,
            "validation_error")


def test_prune_and_delete_for_runs_by_another_project_or_a_bound_token_of_another_session_remove_nothing(
        project, writer, reader, outsider):
    history(writer)
    body = put_body("t-1", "r001", "0003", versions={"draft": 3, "notes": 1})
    body["metadata"] = {"source": "loop", "step": 9, "run_id": "run-a"}
    ok(writer.post("/graph-threads/checkpoints", body), 201)
    ok(writer.post("/graph-threads/checkpoints", put_body("t-2")), 201)
    other = token_api(project, "thread-2", ["read", "write"], GraphThread.objects.get(thread_id="t-2").session_id)
    before = snapshot()
    for api in (outsider, other):
        assert ok(api.post("/graph-threads/prune", {"thread_ids": ["t-1"], "strategy": "delete"})) == {"threads": []}
        assert ok(api.post("/graph-threads/delete-for-runs", {"run_ids": ["run-a"]})) == {"threads": []}
    refused(reader.post("/graph-threads/prune", {"thread_ids": ["t-1"]}), 403, "forbidden")
    refused(reader.post("/graph-threads/delete-for-runs", {"run_ids": ["run-a"]}), 403, "forbidden")
    before.assert_unchanged()
    # the thread's own bound token reaches it
    own = token_api(project, "thread-1", ["read", "write"], GraphThread.objects.get(thread_id="t-1").session_id)
    assert ok(own.post("/graph-threads/delete-for-runs", {"run_ids": ["run-a"]}))["threads"][0]["checkpoints"] == 1


def test_delete_for_runs_removes_the_runs_checkpoints_and_their_writes_in_every_thread(writer):
    for thread in ("t-1", "t-2"):
        for cp, parent, run in (("0001", None, "run-a"), ("0002", "0001", "run-b"), ("0003", "0002", "run-c")):
            body = put_body(thread, cp, parent, versions={"draft": int(cp[-1])}, blobs={"draft": f"{thread} {cp}"})
            body["metadata"] = {"source": "loop", "step": int(cp[-1]), "run_id": run}
            ok(writer.post("/graph-threads/checkpoints", body), 201)
            ok(writer.post("/graph-threads/writes", {"thread_id": thread, "checkpoint_id": cp, "task_id": "t",
                                                     "writes": [{"idx": 0, "channel": "c", "value": blob(cp)}]}))
    out = ok(writer.post("/graph-threads/delete-for-runs", {"run_ids": ["run-b", "run-c", "run-unknown"]}))
    assert [(t["thread_id"], t["checkpoints"], t["writes"], t["channel_versions"], t["run_ids"]) for t in out["threads"]] == [
        ("t-1", 2, 2, 2, ["run-b", "run-c"]), ("t-2", 2, 2, 2, ["run-b", "run-c"])]
    for thread in ("t-1", "t-2"):
        [item] = get(writer, thread_id=thread)
        assert item["checkpoint_id"] == "0001" and item["metadata"]["run_id"] == "run-a"
        assert texts(item) == {"draft": f"{thread} 0001"} and len(item["pending_writes"]) == 1
        session_id = GraphThread.objects.get(thread_id=thread).session_id
        assert graph_events(session_id, "graph.runs_deleted") == [{
            "thread_id": thread, "run_ids": ["run-b", "run-c"], "checkpoints": 2, "writes": 2, "channel_versions": 2}]
    assert GraphWrite.objects.count() == 2 and Checkpoint.objects.count() == 2
    assert ok(writer.post("/graph-threads/delete-for-runs", {"run_ids": []})) == {"threads": []}


@pytest.mark.django_db(transaction=True)
def test_prunes_racing_a_thread_s_puts_leave_its_latest_checkpoint_loadable(project):
    """Eight puts of one thread (a chain, each from the one before) race four keep_latest prunes:
    each answered, never a 500; the session lock orders them, so every prune sees whole puts, and
    the chain's last checkpoint survives whole (its record, its values)."""
    api_token = token_api(project, "writer", ["read", "write"]).token
    assert Api(api_token).post("/graph-threads/checkpoints", put_body("busy", "0000", blobs={"draft": "d0", "notes": "n"})
                               ).status_code == 201

    def put(i: int) -> int:
        resp = Api(api_token).post("/graph-threads/checkpoints", put_body(
            "busy", f"000{i}", f"000{i - 1}", versions={"draft": i + 1, "notes": 1}, blobs={"draft": f"d{i}"}, open_=False))
        assert resp.status_code == 201, resp.content
        return resp.status_code

    def prune(_: int) -> int:
        resp = Api(api_token).post("/graph-threads/prune", {"thread_ids": ["busy"]})
        assert resp.status_code == 200, resp.content
        return resp.json()["threads"][0]["checkpoints"]

    results = oks(race([*[lambda i=i: put(i) for i in range(1, 9)], *[lambda i=i: prune(i) for i in range(4)]]))
    assert len(results) == 12
    assert sum(results[8:]) + GraphCheckpoint.objects.count() == 9  # each checkpoint pruned once, or still here
    [latest] = get(Api(api_token), thread_id="busy")[:1]
    assert latest["checkpoint_id"] == "0008" and texts(latest) == {"draft": "d8", "notes": "n"}
    assert Checkpoint.objects.filter(id=latest["record_id"]).exists()


def test_a_row_beside_a_checkpoint_is_written_with_it_in_its_statement_and_never_without_it(writer, project):
    """A put's graph row rides in the bounded checkpoint's statement (``checkpoints.Beside``): it
    is written with the checkpoint, and a refusal the statement decides writes neither."""
    out = ok(writer.post("/graph-threads/checkpoints", put_body(blobs={"a": "v1"})), 201)
    boss = caller_for(project)
    thread = GraphThread.objects.get()

    def beside(cp: str) -> Beside:
        return Beside(graphs._GRAPH_ROW_BESIDE, {"g_thread": thread.id, "g_ns": "", "g_cp": cp, "g_parent": "0001",
                                                 "g_metadata": "{}", "g_document": "{}"})

    with CaptureQueriesContext(connection) as queries:
        record = record_checkpoint(boss, out["run_id"], {"boundary": "context_freeze", "cursor": {"step": 2}},
                                   beside=beside("0002"))
    assert len(queries) == 1  # the checkpoint and its graph row: one statement
    row = GraphCheckpoint.objects.get(checkpoint_id="0002")
    assert (record.beside_id, row.record_id, row.created_at) == (row.id, record.id, record.created_at)
    Run.objects.filter(id=out["run_id"]).update(state="completed")
    before = snapshot()
    with pytest.raises(RunNotOpen):
        record_checkpoint(boss, out["run_id"], {"boundary": "context_freeze", "cursor": {"step": 2}}, beside=beside("0003"))
    assert snapshot() == before
