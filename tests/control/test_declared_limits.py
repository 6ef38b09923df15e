"""Body and query limits the server enforces are refused as the schema declares them: a
typed 422 ``validation_error`` naming the field as the caller sent it, and
nothing written. The declared values themselves: tests/api/test_schema_limits.py."""
from __future__ import annotations

import pytest
from django.conf import settings

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.control import bindings, graphs, handoffs
from novelforge_sessions.control.models import Handoff, ResultDelivery
from novelforge_sessions.models import Checkpoint, Event, TranscriptEntry
from tests.support.factories import SESSION
from tests.control.conftest import claim, make_artifact
from tests.support.responses import ok, refused
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

FP = "sha256:" + "0" * 64


def test_mark_stale_names_at_most_its_limit(owner, new_session):
    s = new_session(attach=False)
    before = Event.objects.count()
    err = refused(owner.post("/bindings/mark-stale", {"session_ids": list(range(1, bindings.MAX_MARK_STALE + 2))}),
                  422, "validation_error")
    assert err["details"]["field"] == "session_ids"
    assert Event.objects.count() == before
    assert owner.get(f"/sessions/{s['id']}").json()["status"] == "created"


@pytest.mark.parametrize(("body", "field"), [
    ({"inputs": [{"artifact_id": 1, "fingerprint": FP}] * (handoffs.MAX_INPUTS + 1)}, "inputs"),
    ({"required_capabilities": [f"c{i}" for i in range(rt.MAX_CAPABILITIES + 1)]}, "required_capabilities"),
    # duplicates count as sent, as the schema's maxItems counts them
    ({"required_capabilities": ["same"] * (rt.MAX_CAPABILITIES + 1)}, "required_capabilities"),
    ({"required_capabilities": ["Bad Cap"]}, "required_capabilities"),
])
def test_handoff_lists_are_bounded_and_named(owner, running, body, field):
    err = refused(owner.post(f"/runs/{running['run']['id']}/handoffs", {"logical_id": "job-1", **body}),
                  422, "validation_error")
    assert err["details"]["field"] == field
    assert not Handoff.objects.exists()
    assert owner.get(f"/sessions/{running['id']}").json()["status"] == "running"


def test_a_handoff_at_the_limits_is_accepted(owner, running):
    art = make_artifact(owner)
    ref = {"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}
    caps = [f"c{i}" for i in range(rt.MAX_CAPABILITIES)]
    made = ok(owner.post(f"/runs/{running['run']['id']}/handoffs",
                         {"logical_id": "job-1", "inputs": [ref] * handoffs.MAX_INPUTS, "required_capabilities": caps}), 201)
    assert made["required_capabilities"] == sorted(caps)


@pytest.mark.parametrize(("params", "field"), [
    ({"capability": "Bad Cap"}, "capability"),
    ({"capability": [f"c{i}" for i in range(rt.MAX_CAPABILITIES + 1)]}, "capability"),
])
def test_routing_refusals_name_the_query_parameter(owner, params, field):
    err = refused(owner.get("/routing/runtimes", **params), 422, "validation_error")
    assert err["details"]["field"] == field


def test_transcript_entry_over_its_bytes_is_refused(owner, new_session):
    s = new_session()
    too_long = "é" * (settings.TRANSCRIPT_ENTRY_MAX_BYTES // 2 + 1)  # under maxLength in characters, over in bytes
    err = refused(owner.post(f"/sessions/{s['id']}/transcript", {"role": "user", "content": too_long}),
                  422, "validation_error")
    assert err["details"]["field"] == "content"
    err = refused(owner.post(f"/sessions/{s['id']}/transcript",
                             {"role": "user", "content": "a" * (settings.TRANSCRIPT_ENTRY_MAX_BYTES + 1)}),
                  422, "validation_error")
    assert err["details"]["field"] == "content"
    assert not TranscriptEntry.objects.exists()


@pytest.mark.parametrize(("body", "field"), [
    ({"artifacts": [{"artifact_id": 1, "fingerprint": "sha256:nothex"}]}, "artifacts[0].fingerprint"),
    ({"resume_policy": ""}, "resume_policy"),
    ({"resume_policy": "Not A Name"}, "resume_policy"),
])
def test_checkpoint_fields_are_refused_as_declared(owner, running, body, field):
    err = refused(owner.post(f"/runs/{running['run']['id']}/checkpoints",
                             {"boundary": "context_freeze", "cursor": {"step": "s"}, **body}), 422, "validation_error")
    assert err["details"]["field"] == field
    assert not Checkpoint.objects.exists()


def test_a_malformed_result_hash_is_a_validation_error_and_logs_nothing(owner, worker, frozen):
    held = claim(worker, ["continuity"])
    for bad in ("nothex", "sha256:" + "G" * 64, FP + "\n"):
        err = refused(worker.post(f"/handoffs/{held['id']}/results", {
            "fencing_token": held["fencing_token"], "job_fingerprint": held["job_fingerprint"],
            "result": {"verdict": "ok"}, "result_hash": bad,
        }), 422, "validation_error")
        assert err["details"]["field"] == "result_hash"
    assert not ResultDelivery.objects.exists()
    assert Handoff.objects.get(id=held["id"]).state == "claimed"
    # A well-formed hash of another result is still the documented mismatch.
    refused(worker.post(f"/handoffs/{held['id']}/results", {
        "fencing_token": held["fencing_token"], "job_fingerprint": held["job_fingerprint"],
        "result": {"verdict": "ok"}, "result_hash": FP,
    }), 422, "result_hash_mismatch")


# ---- byte bounds (x-max-bytes), enforced as declared ---------------------------
def fill(container: dict | list, measure, limit: int) -> None:
    """Pad ``container`` (in place) with short strings until ``measure()`` is exactly ``limit``.
    Pieces of at most 1,000 characters: a checkpoint refuses longer single strings as prose."""
    i = 0
    while measure() < limit:
        if isinstance(container, list):
            container.append("")
        else:
            container[f"p{i}"] = ""
        grow = limit - measure()
        if grow < 0:  # the new piece's own overhead overshoots: lengthen the one before instead
            container.pop() if isinstance(container, list) else container.pop(f"p{i}")
            last = len(container) - 1 if isinstance(container, list) else f"p{i - 1}"
            container[last] += "x" * (limit - measure())
            break
        if isinstance(container, list):
            container[-1] = "x" * min(grow, 1000)
        else:
            container[f"p{i}"] = "x" * min(grow, 1000)
        i += 1
    assert measure() == limit


def sized(limit: int, base: dict | None = None) -> dict:
    value = dict(base or {})
    fill(value, lambda: rt.json_size(value), limit)
    return value


def sized_list(limit: int) -> list:
    value: list = []
    fill(value, lambda: rt.json_size(value), limit)
    return value


def sized_checkpoint(limit: int) -> dict:
    body = {"boundary": "context_freeze", "cursor": {"step": "s"}}
    fill(body["cursor"], lambda: rt.json_size(body), limit)
    return body


def _case_session(owner, new_session, limit):
    return "SessionIn", "/sessions", {**SESSION, "provider_metadata": sized(limit)}, "provider_metadata"


def _case_runtime(owner, new_session, limit):
    s = new_session(attach=False)
    return "RuntimeIn", f"/sessions/{s['id']}/runtimes", {"runtime_family": "codex", "provider_metadata": sized(limit)}, \
        "provider_metadata"


def _case_attach(owner, new_session, limit):
    # The attach route's body: a runtime (``RuntimeIn``, also nested in a new session) with its key.
    _, path, body, field = _case_runtime(owner, new_session, limit)
    return "AttachIn", path, {**body, "idempotency_key": "attach-1"}, field


def _case_run_cursor(owner, new_session, limit):
    return "RunIn", f"/sessions/{new_session()['id']}/runs", {"cursor": sized(limit)}, "cursor"


def _case_run_frozen_inputs(owner, new_session, limit):
    return "RunIn", f"/sessions/{new_session()['id']}/runs", {"frozen_inputs": sized_list(limit)}, "frozen_inputs"


def _case_cursor(owner, new_session, limit):
    return "CursorIn", f"/runs/{new_session(run=True)['run']['id']}/cursor", {"cursor": sized(limit)}, "cursor"


def _case_batch_cursor(owner, new_session, limit):
    return "BatchIn", f"/runs/{new_session(run=True)['run']['id']}/batch", \
        {"items": [{"kind": "cursor", "cursor": sized(limit)}]}, "items[0].cursor"


def _case_checkpoint(owner, new_session, limit):
    return "CheckpointIn", f"/runs/{new_session(run=True)['run']['id']}/checkpoints", sized_checkpoint(limit), None


def _case_batch_checkpoint(owner, new_session, limit):
    return "BatchIn", f"/runs/{new_session(run=True)['run']['id']}/batch", \
        {"items": [{"kind": "checkpoint", "checkpoint": sized_checkpoint(limit)}]}, None


def _case_handoff_params(owner, new_session, limit):
    return "HandoffIn", f"/runs/{new_session(run=True)['run']['id']}/handoffs", \
        {"logical_id": "job-1", "params": sized(limit)}, "params"


def _case_handoff_result_schema(owner, new_session, limit):
    key = "k" * (limit - rt.json_size({"": "string"}))  # the short form: {result key: type}
    return "HandoffIn", f"/runs/{new_session(run=True)['run']['id']}/handoffs", \
        {"logical_id": "job-1", "result_schema": {key: "string"}}, "result_schema"


def _case_result(owner, new_session, limit):
    run = new_session(run=True)["run"]
    job = ok(owner.post(f"/runs/{run['id']}/handoffs", {"logical_id": "job-1", "result_schema": {"verdict": "string"}}),
             201)
    held = claim(owner)
    assert held["id"] == job["id"]
    verdict = "x" * (limit - rt.json_size({"verdict": ""}))
    return "ResultIn", f"/handoffs/{held['id']}/results", {
        "fencing_token": held["fencing_token"], "job_fingerprint": held["job_fingerprint"], "result": {"verdict": verdict},
    }, "result"


def _case_graph_metadata(owner, new_session, limit):
    return "GraphPutIn", "/graph-threads/checkpoints", {**GRAPH_PUT, "metadata": sized(limit)}, "metadata"


def _case_graph_checkpoint(owner, new_session, limit):
    return "GraphPutIn", "/graph-threads/checkpoints", \
        {**GRAPH_PUT, "checkpoint": sized(limit, {"v": 1, "channel_versions": {}})}, "checkpoint"


def _case_graph_values(owner, new_session, limit):
    # Strings of at most 256 characters (each value's own bound) filling exactly `limit` bytes.
    values: dict[str, str] = {}
    while rt.json_size({**values, f"c{len(values):03d}": "x" * 256}) <= limit:
        values[f"c{len(values):03d}"] = "x" * 256
    last = f"c{len(values):03d}"
    values[last] = ""
    values[last] = "x" * (limit - rt.json_size(values))
    assert rt.json_size(values) == limit and len(values[last]) <= 256
    return "GraphPutIn", "/graph-threads/checkpoints", {
        **GRAPH_PUT, "checkpoint": {"v": 1, "channel_versions": {channel: 1 for channel in values}}, "values": values,
    }, "values"


GRAPH_PUT = {"thread_id": "t-1", "checkpoint_id": "0001", "checkpoint": {"v": 1}, "open": {"task_mode": "drafting"}}
GRAPH_WRITES = {"thread_id": "t-1", "checkpoint_id": "0001", "task_id": "task-1",
                "writes": [{"idx": 0, "channel": "c", "scalar": 1}], "open": {"task_mode": "drafting"}}


def path_of(limit: int) -> str:
    """A thread id, namespace or task path of exactly ``limit`` bytes as UTF-8, in fewer characters
    (two bytes each): the byte bound, not the character one, is what refuses it."""
    return "é" * (limit // 2) + "x" * (limit % 2)


#: The graph write routes by their body's component: (path, a body they accept).
GRAPH_ROUTES = {"GraphPutIn": ("/graph-threads/checkpoints", GRAPH_PUT),
                "GraphWritesIn": ("/graph-threads/writes", GRAPH_WRITES)}


def _case_graph_path(component: str, field: str):
    def case(owner, new_session, limit):
        path, body = GRAPH_ROUTES[component]
        return component, path, {**body, field: path_of(limit)}, field
    return case


def _case_graph_carried_task_path(owner, new_session, limit):
    task = {"checkpoint_id": "0000", "task_id": "task-1", "task_path": path_of(limit),
            "writes": [{"idx": 0, "channel": "c", "scalar": 1}]}
    return "GraphPutIn", "/graph-threads/checkpoints", {**GRAPH_PUT, "writes": [task]}, "writes[0].task_path"


def _case_graph_copy(field: str):
    def case(owner, new_session, limit):
        source = path_of(limit) if field == "source_thread_id" else "t-1"
        if len(source.encode()) <= graphs.MAX_PATH_LENGTH:  # the source exists (an id over the bound names none)
            ok(owner.post("/graph-threads/checkpoints", {**GRAPH_PUT, "thread_id": source}), 201)
        body = {"source_thread_id": source, "target_thread_id": "t-2", field: path_of(limit)}
        return "GraphCopyIn", "/graph-threads/copy", body, field
    return case

#: x-max-bytes bound → how to send a value of exactly n bytes there (component, path, body, field named).
BYTE_CASES = {
    "SessionIn.provider_metadata": _case_session,
    "RuntimeIn.provider_metadata": _case_runtime,
    "AttachIn.provider_metadata": _case_attach,
    "RunIn.cursor": _case_run_cursor,
    "RunIn.frozen_inputs": _case_run_frozen_inputs,
    "CursorIn.cursor": _case_cursor,
    "BatchCursorItem.cursor": _case_batch_cursor,
    "CheckpointIn": _case_checkpoint,
    "BatchCheckpointIn": _case_batch_checkpoint,
    "HandoffIn.params": _case_handoff_params,
    "HandoffIn.result_schema": _case_handoff_result_schema,
    "ResultIn.result": _case_result,
    "GraphPutIn.metadata": _case_graph_metadata,
    "GraphPutIn.checkpoint": _case_graph_checkpoint,
    "GraphPutIn.values": _case_graph_values,
    "GraphPutIn.thread_id": _case_graph_path("GraphPutIn", "thread_id"),
    "GraphPutIn.checkpoint_ns": _case_graph_path("GraphPutIn", "checkpoint_ns"),
    "GraphTaskWritesIn.task_path": _case_graph_carried_task_path,
    "GraphWritesIn.thread_id": _case_graph_path("GraphWritesIn", "thread_id"),
    "GraphWritesIn.checkpoint_ns": _case_graph_path("GraphWritesIn", "checkpoint_ns"),
    "GraphWritesIn.task_path": _case_graph_path("GraphWritesIn", "task_path"),
    "GraphCopyIn.source_thread_id": _case_graph_copy("source_thread_id"),
    "GraphCopyIn.target_thread_id": _case_graph_copy("target_thread_id"),
}
#: Bounds proven elsewhere, each at and over its limit.
BYTE_BOUNDS_TESTED_ELSEWHERE = {
    "TranscriptIn.content": "test_transcript_entry_over_its_bytes_is_refused (above)",
    "EvidenceIn.content": "tests/reviews/test_declared_limits.py",
    "WriteIntentIn.params": "test_write_intent_params_over_their_bytes_are_refused (below: no exact fill is schema-valid)",
}


def test_every_declared_byte_bound_is_proven_here_or_elsewhere():
    from tests.api.declared import byte_bounds

    assert {where for where, _ in byte_bounds()} == set(BYTE_CASES) | set(BYTE_BOUNDS_TESTED_ELSEWHERE)


@pytest.mark.parametrize("where", sorted(BYTE_CASES))
@pytest.mark.parametrize("over", [0, 1], ids=["at", "over"])
def test_a_value_is_accepted_at_its_declared_byte_bound_and_refused_one_byte_over(owner, new_session, where, over):
    """Each bound the schema declares as ``x-max-bytes`` is exactly the one enforced: a value of
    that many bytes is declared valid and accepted, one byte more is declared invalid and refused
    (422 naming the field the caller sent; the run's error named ``run``, no body field), writing
    nothing."""
    from tests.api.declared import byte_bounds, declared_valid

    limit = dict(byte_bounds())[where]
    component, path, body, field = BYTE_CASES[where](owner, new_session, limit + over)
    assert declared_valid(component, body) is (over == 0)
    before = snapshot()
    resp = owner.post(path, body)
    if not over:
        assert resp.status_code in (200, 201), resp.content
        return
    assert resp.status_code == 422, resp.content
    error = resp.json()["error"]
    # a checkpoint is bounded as a whole (its own code, no field); every other bound names its field
    assert error["code"] == ("checkpoint_not_bounded" if field is None else "validation_error"), error
    assert error["details"].get("field") == field, error
    assert error["details"].get("limit", limit) == limit
    assert snapshot() == before


def test_write_intent_params_over_their_bytes_are_refused(owner):
    """authority.settle takes up to 200 artifact refs, more than its params' byte bound holds."""
    from novelforge_sessions.control import intents
    from novelforge_sessions.control.models import WriteIntent
    from tests.api.declared import declared_valid

    art = make_artifact(owner)
    before_state = ok(owner.get("/write-intents/before-state", kind="authority.settle"))
    ref = {"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}
    body = {"kind": "authority.settle", "idempotency_key": "k-1", "before_fingerprint": before_state["before_fingerprint"],
            "params": {"artifacts": [ref] * 200}}
    assert rt.json_size(body["params"]) > intents.MAX_PARAMS_BYTES
    assert not declared_valid("WriteIntentIn", body)
    err = refused(owner.post("/write-intents", body), 422, "validation_error")
    assert err["details"]["field"] == "params"
    assert not WriteIntent.objects.exists()
    fits = {**body, "params": {"artifacts": [ref] * 10}}
    assert declared_valid("WriteIntentIn", fits)
    assert owner.post("/write-intents", fits).status_code == 201


@pytest.mark.parametrize(("name", "message"), [("   ", "blank"), (" \n\t", "blank")])
def test_an_artifact_name_is_refused_as_declared_and_in_plain_words(owner, name, message):
    """A whitespace-only name (3 characters, declared `minLength: 1`) was refused
    as "name must be 1–200 characters". It is declared invalid (not blank) and says so."""
    from novelforge_sessions.models import Artifact
    from tests.api.declared import declared_valid

    body = {"name": name, "content": "text"}
    assert not declared_valid("ArtifactIn", body)
    err = refused(owner.post("/artifacts", body), 422, "validation_error")
    assert err["details"]["field"] == "name" and message in err["message"], err
    assert not Artifact.objects.exists()
