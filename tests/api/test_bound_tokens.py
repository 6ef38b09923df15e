"""Session-bound tokens reach only what their session owns or was given (docs/model.md#access).

The matrix is one table, ``access.BOUND_TOKEN_MATRIX``; every API route is walked from the
OpenAPI schema with three tokens against the objects of a writer session W:

* a reviewer token bound to its own semantic_reviewer session R (``review,read``),
* a token bound to another writer session O with every permission but ``project``,
* an unbound token of the project (every permission).

A bound token gets, for W's ids, exactly what it gets for ids that exist nowhere (404 — or the
permission refusal, which does not depend on the id), lists leave W's objects out (no response
carries W's markers), and a refusal writes nothing. The unbound token reaches W's objects.
"""
from __future__ import annotations

import json
import re
from urllib.parse import urlencode
from dataclasses import dataclass
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from novelforge_sessions.access import BOUND_TOKEN_MATRIX, PROJECT_WIDE, Caller, Reach
from novelforge_sessions.actions import artifacts, runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.routers import api
from novelforge_sessions.lifecycles import IntentState
from novelforge_sessions.apikit.auth import caller_for_token
from novelforge_sessions.control import graphs
from novelforge_sessions.control.models import AuthorityChange, GraphThread, Handoff, WriteIntent
from novelforge_sessions.errors import NotFound
from novelforge_sessions.models import ApiToken, Artifact, Checkpoint, Event, Run, RuntimeAttachment, Session
from novelforge_sessions.lifecycles import DeliveryState
from novelforge_sessions.webhooks import endpoints as webhook_endpoints
from novelforge_sessions.webhooks.models import WebhookDelivery
from reviews import actions as review_actions
from tests.support.factories import Api
from tests.reviews.factories import RUBRIC, agent_reviewer, make_user, make_world
from tests.support.responses import ok, refused
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

MARK = "victim"  # in every string W's objects carry; never in what a bound token of R or O gets
MISSING = 9_000_000_001  # an id no row has
THREAD = "w-thread"  # W's graph thread
WRITER_PERMS = ["read", "write", "work", "approve", "review"]  # everything but `project`


@dataclass
class World:
    owner: Api
    writer: Api
    reviewer: Api
    other: Api
    ids: dict[str, int]
    job_fingerprint: str
    before_fingerprint: str


def _session(project, role: str, memory: str, caps: list[str], **meta: Any) -> Session:
    setup = Caller(label="test:setup", project_ids=frozenset({project.id}), permissions=frozenset({"write"}), project=project)
    return sessions.create_session(
        setup, sessions.NewSession(role=role, memory_policy=memory, task_mode="drafting", runtime_family="claude-code",
                                   provider_metadata=meta or None),
        runtime=RuntimeSpec(runtime_family="claude-code", capabilities=caps, lease_seconds=600),
    )


def _token(project, name: str, permissions: list[str], session: Session | None = None) -> str:
    return create_token(project, name=name, permissions=permissions, session=session)[1]


def build(project) -> World:
    owner = Api(_token(project, "owner", ALL_PERMISSIONS))
    w = _session(project, "writer", "session", ["draft", "victim-cap"], victim=True)
    w_raw = _token(project, "victim-writer", ["read", "write"], w)
    writer, wc = Api(w_raw), caller_for_token(w_raw)
    art = artifacts.create_artifact(wc, name="victim-chapter", kind="chapter", content="victim text, first draft")
    v2 = ok(writer.post(f"/artifacts/{art.id}/versions", {"content": "victim text, second draft"}), 201)
    run = runs.start_run(wc, w.id, cursor={"victim": "draft"})
    # W is a graph thread too (its id is no marker: refusals may echo the id they were given).
    GraphThread.objects.create(project=project, session=w, thread_id=THREAD)
    graphs.put_checkpoint(wc, thread_id=THREAD, checkpoint_ns="", checkpoint_id="cp-1", parent_checkpoint_id=None,
                          checkpoint={"v": 1, "channel_versions": {}}, metadata={"victim": True}, blobs=[], open_spec=None)
    cp = ok(writer.post(f"/runs/{run.id}/checkpoints", {"boundary": "user_wait", "cursor": {"victim": 1}}), 201)
    handoff = ok(writer.post(f"/runs/{run.id}/handoffs", {
        "logical_id": "victim-job", "params": {"victim": 1},
        "inputs": [{"artifact_id": art.id, "fingerprint": art.current_version.fingerprint}]}), 201)
    # A job handoff does not hold the run; a pending page gate does (it is opened last: nothing
    # continues the run past it).
    ok(writer.post(f"/sessions/{w.id}/transition", {"to": "running"}))
    make_user(project, "alice", "reviewer")
    gate = review_actions.open_gate(wc, w.id, review_actions.GateSpec(
        candidate_version_id=art.current_version_id, rubric=RUBRIC, route="page", reviewers=["alice"]))
    before = ok(writer.get("/write-intents/before-state", kind="artifact.make_current", artifact_id=art.id))
    intent = ok(writer.post("/write-intents", {
        "kind": "artifact.make_current", "idempotency_key": "victim-intent", "artifact_id": art.id,
        "params": {"version_id": v2["id"]}, "before_fingerprint": before["before_fingerprint"], "session_id": w.id}), 201)
    settle_before = ok(owner.get("/write-intents/before-state", kind="authority.settle"))["before_fingerprint"]
    settle = ok(owner.post("/write-intents", {
        "kind": "authority.settle", "idempotency_key": "settle-1", "before_fingerprint": settle_before,
        "params": {"artifacts": [{"artifact_id": art.id, "fingerprint": art.current_version.fingerprint}], "note": "settled"}}), 201)
    ok(owner.post(f"/write-intents/{settle['id']}/approve"))
    ok(owner.post(f"/write-intents/{settle['id']}/execute"))
    assert AuthorityChange.objects.count() == 1
    ok(owner.post(f"/write-intents/{intent['id']}/approve", {"note": "victim-note"}))

    r = _session(project, "semantic_reviewer", "none", ["review"])
    reviewer = Api(_token(project, "reviewer", ["review", "read"], r))
    o = _session(project, "writer", "session", ["draft"])
    other = Api(_token(project, "other-writer", WRITER_PERMS, o))
    ok(other.post(f"/sessions/{o.id}/runs", {"cursor": {"step": "x"}}), 201)
    # A webhook endpoint of the project with a failed delivery (webhooks are no bound token's: 403).
    endpoint, _secret = webhook_endpoints.create_endpoint(project, url="https://93.184.216.34/victim", event_types=["*"])
    event = Event.objects.filter(session_id=w.id).order_by("-id").first()
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint, event_id=event.id, event_type=event.type, webhook_id=f"msg_test{event.id}",
        state=DeliveryState.FAILED, next_attempt_at=timezone.now(), expires_at=timezone.now())
    ids = {
        "webhook_id": endpoint.id, "delivery_id": delivery.id,
        "session_id": w.id, "runtime_id": RuntimeAttachment.objects.get(session=w).id, "run_id": run.id,
        "checkpoint_id": cp["id"], "handoff_id": handoff["id"], "artifact_id": art.id, "version_id": v2["id"],
        "intent_id": intent["id"], "gate_id": gate.id, "packet_id": gate.packet.id,
    }
    return World(owner, writer, reviewer, other, ids, handoff["job_fingerprint"], before["before_fingerprint"])


# ---- the walk -------------------------------------------------------------------------------------------
def _body(method: str, path: str, ids: dict[str, int], world: World) -> Any:
    """A body the route accepts (valid by its schema), naming W's objects where it names any."""
    fp = "sha256:" + "0" * 64
    bodies: dict[str, Any] = {
        "POST /artifacts": {"name": "mine", "content": "mine"},
        "POST /artifacts/{artifact_id}/versions": {"content": "a third draft"},
        "POST /sessions": {"role": "writer", "memory_policy": "bounded", "task_mode": "drafting", "runtime_family": "claude-code"},
        "POST /sessions/{session_id}/transition": {"to": "awaiting_user"},
        "POST /sessions/{session_id}/close": {},
        "POST /sessions/{session_id}/abort": {"reason": "stop"},
        "POST /sessions/{session_id}/resume": {"runtime": {"runtime_family": "claude-code"}, "dry_run": True},
        "POST /sessions/{session_id}/transcript": {"role": "user", "content": "hello"},
        "POST /sessions/{session_id}/runtimes": {"runtime_family": "claude-code"},
        "POST /runtimes/{runtime_id}/heartbeat": {},
        "POST /sessions/{session_id}/runs": {"cursor": {"step": "again"}},
        "POST /runs/{run_id}/cursor": {"cursor": {"step": "next"}},
        "POST /runs/{run_id}/end": {"outcome": "completed"},
        "POST /runs/{run_id}/checkpoints": {"boundary": "user_wait", "cursor": {"a": 1}},
        "POST /runs/{run_id}/batch": {"items": [{"kind": "checkpoint", "checkpoint": {"boundary": "user_wait", "cursor": {"a": 1}}},
                                                {"kind": "cursor", "cursor": {"a": 2}}]},
        "POST /runs/{run_id}/handoffs": {"logical_id": "another-job"},
        "POST /handoffs/claim": {"worker": "w", "handoff_id": ids["handoff_id"]},
        "POST /handoffs/{handoff_id}/heartbeat": {"fencing_token": 1},
        "POST /handoffs/{handoff_id}/results": {"fencing_token": 1, "job_fingerprint": world.job_fingerprint, "result": {}},
        "POST /handoffs/{handoff_id}/cancel": {},
        "POST /handoffs/{handoff_id}/resolve-conflict": {"resolution": "keep"},
        "POST /write-intents": {"kind": "artifact.make_current", "idempotency_key": "another", "artifact_id": ids["artifact_id"],
                                "params": {"version_id": ids["version_id"]}, "before_fingerprint": world.before_fingerprint},
        "POST /write-intents/{intent_id}/approve": {"note": "ok"},
        "POST /write-intents/{intent_id}/reject": {"note": "no"},
        "POST /write-intents/{intent_id}/revoke-approval": {"note": "wait"},
        "POST /bindings/mark-stale": {"session_ids": [ids["session_id"]]},
        "POST /sessions/{session_id}/review-gates": {"candidate_version_id": ids["version_id"], "rubric": RUBRIC, "route": "agent"},
        "POST /review-packets/{packet_id}/heartbeat": {"fencing_token": 1},
        "POST /graph-threads/checkpoints": {"thread_id": THREAD, "checkpoint_id": "cp-2", "checkpoint": {"v": 1}},
        "POST /graph-threads/writes": {"thread_id": THREAD, "checkpoint_id": "cp-1", "task_id": "t",
                                       "writes": [{"idx": 0, "channel": "c", "value": {"serde": "json", "data": ""}}]},
        "POST /graph-threads/copy": {"source_thread_id": THREAD, "target_thread_id": "w-copy"},
        "POST /graph-threads/prune": {"thread_ids": [THREAD], "strategy": "delete"},
        "POST /graph-threads/delete-for-runs": {"run_ids": ["w-run"]},
        "POST /graph-blobs": {"fingerprint": "sha256:" + "0" * 64, "serde": "json", "index": 0, "count": 1, "data": ""},
        "POST /graph-blobs/missing": {"fingerprints": ["sha256:" + "0" * 64]},
        "POST /webhooks": {"url": "https://93.184.216.34/mine", "event_types": ["*"]},
        "POST /webhooks/{webhook_id}/active": {"active": False},
        "POST /review-packets/{packet_id}/verdicts": {"packet_fingerprint": fp, "artifact_fingerprint": fp, "decision": "pass",
                                                      "scores": {"clarity": 4, "pacing": 6}, "confidence": 0.5},
    }
    return bodies.get(f"{method} {path}")


def _query(path: str, ids: dict[str, int]) -> dict[str, Any]:
    return {
        "/events": {"session_id": ids["session_id"]},
        "/handoffs": {"session_id": ids["session_id"]},
        "/write-intents": {"session_id": ids["session_id"]},
        "/write-intents/before-state": {"kind": "artifact.make_current", "artifact_id": ids["artifact_id"]},
        "/routing/runtimes": {"capability": "victim-cap"},
        "/graph-threads": {"thread_id": THREAD},
        "/graph-threads/checkpoints": {"thread_id": THREAD},
    }.get(path, {})


def _operations() -> list[tuple[str, str]]:
    ops = []
    for path, item in api.get_openapi_schema()["paths"].items():
        for method in item:
            ops.append((method.upper(), path.removeprefix("/api/v1")))
    return ops


OPERATIONS = _operations()


def _call(api_client: Api, method: str, template: str, ids: dict[str, int], world: World):
    path = re.sub(r"\{(\w+)\}", lambda m: str(ids[m.group(1)]), template)
    body = _body(method, template, ids, world)
    if method == "GET":
        return api_client.get(path, **_query(template, ids))
    if method == "DELETE":
        query = _query(template, ids)
        return api_client.delete(path + ("?" + urlencode(query) if query else ""))
    return api_client.post(path, body)


def _foreign_ids(template: str, world: World) -> set[int] | None:
    """For a list route: ids of the objects no bound token of R or O may list."""
    ids = world.ids
    return {
        "/artifacts": {ids["artifact_id"]},
        "/sessions": {ids["session_id"]},
        "/handoffs": {ids["handoff_id"]},
        "/receipts": set(),
        "/write-intents": set(WriteIntent.objects.values_list("id", flat=True)),
        "/authority/changes": set(AuthorityChange.objects.values_list("id", flat=True)),
        "/bindings/invalidated": {ids["session_id"]},
        "/routing/runtimes": {ids["runtime_id"]},
        "/events": set(Event.objects.filter(session_id=ids["session_id"]).values_list("id", flat=True))
        | set(Event.objects.filter(session_id__isnull=True).values_list("id", flat=True)),
        "/review-packets": {ids["packet_id"]},
    }.get(template)


def test_the_walk_covers_every_route():
    """A new route must have a body here when it takes one: the walk stays complete."""
    schema = api.get_openapi_schema()["paths"]
    for method, path in OPERATIONS:
        if "requestBody" in schema["/api/v1" + path][method.lower()] and method == "POST":
            required = schema["/api/v1" + path][method.lower()]["requestBody"].get("required", False)
            if required:
                assert _body(method, path, {k: 1 for k in ("handoff_id", "artifact_id", "version_id", "session_id")},
                             World(*([None] * 4), {}, "", "")) is not None, (method, path)  # type: ignore[arg-type]


@pytest.mark.parametrize("who", ["reviewer", "other"])
@pytest.mark.parametrize(("method", "template"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_a_bound_token_reaches_nothing_of_another_session(project, who, method, template):
    world = build(project)
    token: Api = getattr(world, who)
    names_ids = bool(re.search(r"\{\w+\}", template)) or _body(method, template, world.ids, world) != _body(
        method, template, dict.fromkeys(world.ids, MISSING), world)
    before, events = snapshot(), Event.objects.count()
    theirs = _call(token, method, template, world.ids, world)
    assert theirs.status_code < 500, theirs.content
    assert MARK not in theirs.content.decode(), (who, method, template, theirs.content[:400])
    foreign = _foreign_ids(template, world)
    if theirs.status_code == 200 and foreign is not None:
        listed = theirs.json()
        listed = listed["items"] if isinstance(listed, dict) else listed
        assert not {item.get("id", item.get("packet_id", item.get("runtime_id", item.get("session_id")))) for item in listed} & foreign, (
            who, template, theirs.content)
    if theirs.status_code >= 400:
        assert snapshot() == before and Event.objects.count() == events, (who, method, template, theirs.content)
    if names_ids:
        nowhere = _call(token, method, template, dict.fromkeys(world.ids, MISSING), world)
        same = (theirs.status_code, theirs.json().get("error", {}).get("code") if theirs.status_code >= 400 else None)
        assert same == (nowhere.status_code, nowhere.json().get("error", {}).get("code") if nowhere.status_code >= 400 else None), (
            who, method, template, theirs.content, nowhere.content)
        if theirs.status_code < 400:  # only routes whose ids a bound token does not look up (claims: nothing claimable)
            assert (method, template) in {("POST", "/handoffs/claim"), ("POST", "/bindings/mark-stale")}, (method, template)


#: Routes where even the unbound project token meets a refusal that is not about reach: a page
#: reviewer's packet is no agent's; the packet routes need the token's own reviewer session.
UNBOUND_NOT_REACHING = {"/review-packets/{packet_id}", "/review-packets/{packet_id}/heartbeat",
                        "/review-packets/{packet_id}/verdicts"}


@pytest.mark.parametrize(("method", "template"), [op for op in OPERATIONS if re.search(r"\{\w+\}", op[1])],
                         ids=[f"{m} {p}" for m, p in OPERATIONS if re.search(r"\{\w+\}", p)])
def test_the_unbound_project_token_reaches_the_writers_objects(project, method, template):
    world = build(project)
    resp = _call(world.owner, method, template, world.ids, world)
    assert resp.status_code < 500, resp.content
    if template not in UNBOUND_NOT_REACHING:
        assert resp.status_code != 404, (method, template, resp.content)


# ---- the two scenarios of the finding ---------------------------------------------------------------------
def test_a_reviewer_token_reads_none_of_the_writers_project_objects(project):
    world = build(project)
    ids, reviewer = world.ids, world.reviewer
    for path in (f"/artifacts/{ids['artifact_id']}", f"/artifact-versions/{ids['version_id']}",
                 f"/write-intents/{ids['intent_id']}", f"/runtimes/{ids['runtime_id']}",
                 f"/sessions/{ids['session_id']}/runtimes"):
        resp = reviewer.get(path)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", (path, resp.content)
    assert ok(reviewer.get("/artifacts"))["items"] == []
    assert ok(reviewer.get("/write-intents"))["items"] == []
    assert ok(reviewer.get("/authority/changes"))["items"] == []
    assert ok(reviewer.get("/bindings/invalidated")) == []
    assert ok(reviewer.get("/routing/runtimes", capability="victim-cap")) == []
    assert ok(reviewer.get("/routing/runtimes", capability="draft")) == []
    # the unbound token sees them all
    assert len(ok(world.owner.get("/write-intents"))["items"]) == 2
    assert len(ok(world.owner.get("/authority/changes"))["items"]) == 1
    assert ok(world.owner.get(f"/artifact-versions/{ids['version_id']}"))["content"] == "victim text, second draft"


def test_a_writer_session_token_cannot_execute_another_sessions_approved_intent(project):
    world = build(project)
    intent_id = world.ids["intent_id"]
    assert WriteIntent.objects.get(id=intent_id).state == IntentState.APPROVED
    current = Artifact.objects.get(id=world.ids["artifact_id"]).current_version_id
    before, events = snapshot(), Event.objects.count()
    resp = world.other.post(f"/write-intents/{intent_id}/execute")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", resp.content
    for verb in ("approve", "reject", "revoke-approval"):
        resp = world.other.post(f"/write-intents/{intent_id}/{verb}", {"note": "x"})
        assert resp.status_code == 404, (verb, resp.content)
    # its idempotency key is taken, but the refusal does not name another session's intent
    art = ok(world.owner.get(f"/artifacts/{world.ids['artifact_id']}"))
    given = [{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}]
    o = Session.objects.get(tokens__name="other-writer")
    ok(world.other.post(f"/runs/{o.runs.get().id}/end", {"outcome": "completed"}))
    # an unbound token gives O the artifact (O cannot cite what it does not reach: 422, as missing)
    refused = world.other.post(f"/sessions/{o.id}/runs", {"frozen_inputs": given})
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "unknown_artifact_version", refused.content
    ok(world.owner.post(f"/sessions/{o.id}/runs", {"frozen_inputs": given}), 201)  # now O may see the artifact
    state = ok(world.other.get("/write-intents/before-state", kind="artifact.make_current", artifact_id=art["id"]))
    taken = world.other.post("/write-intents", {
        "kind": "artifact.make_current", "idempotency_key": "victim-intent", "artifact_id": art["id"],
        "params": {"version_id": world.ids["version_id"]}, "before_fingerprint": state["before_fingerprint"]})
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "idempotency_key_reused", taken.content
    assert "intent_id" not in taken.json()["error"]["details"]
    before, events = snapshot(), Event.objects.count()
    assert world.other.post(f"/write-intents/{intent_id}/execute").status_code == 404  # given the artifact, not the intent
    assert snapshot() == before and Event.objects.count() == events
    intent = WriteIntent.objects.get(id=intent_id)
    assert intent.state == IntentState.APPROVED and intent.executed_at is None
    assert Artifact.objects.get(id=world.ids["artifact_id"]).current_version_id == current
    # its own session's token executes it
    assert ok(world.writer.post(f"/write-intents/{intent_id}/execute"))["state"] == IntentState.EXECUTED


# ---- what a bound token does reach ------------------------------------------------------------------------
def test_a_bound_token_reaches_what_its_session_created_or_was_given(project):
    world = build(project)
    ids = world.ids
    assert [a["id"] for a in ok(world.writer.get("/artifacts"))["items"]] == [ids["artifact_id"]]
    assert [i["id"] for i in ok(world.writer.get("/write-intents"))["items"]] == [ids["intent_id"]]  # not the owner's settle
    assert ok(world.writer.get(f"/artifact-versions/{ids['version_id']}"))["content"] == "victim text, second draft"
    # a bound token proposes as its session when it names none: the intent is then its own
    art = ok(world.writer.get(f"/artifacts/{ids['artifact_id']}"))
    state = ok(world.writer.get("/write-intents/before-state", kind="artifact.make_current", artifact_id=art["id"]))
    mine = ok(world.writer.post("/write-intents", {
        "kind": "artifact.make_current", "idempotency_key": "mine", "artifact_id": art["id"],
        "params": {"version_id": ids["version_id"]}, "before_fingerprint": state["before_fingerprint"]}), 201)
    assert mine["session_id"] == Session.objects.get(tokens__name="victim-writer").id
    assert {i["id"] for i in ok(world.writer.get("/write-intents"))["items"]} == {ids["intent_id"], mine["id"]}
    # an artifact the owner made is given to O by O's run's frozen inputs
    given = ok(world.owner.post("/artifacts", {"name": "outline", "content": "the outline"}), 201)
    secret = ok(world.owner.post("/artifacts", {"name": "notes", "content": "the notes"}), 201)
    o = Session.objects.get(tokens__name="other-writer")
    ok(world.owner.post(f"/runs/{o.runs.get().id}/end", {"outcome": "completed"}))
    ok(world.owner.post(f"/sessions/{o.id}/runs", {
        "frozen_inputs": [{"artifact_id": given["id"], "fingerprint": given["current_fingerprint"]}]}), 201)
    assert [a["id"] for a in ok(world.other.get("/artifacts"))["items"]] == [given["id"]]
    assert world.other.get(f"/artifacts/{secret['id']}").status_code == 404
    assert ok(world.other.post(f"/artifacts/{given['id']}/versions", {"content": "outline v2"}), 201)["number"] == 2
    refused = world.other.post(f"/artifacts/{secret['id']}/versions", {"content": "mine now"})
    assert refused.status_code == 404 and Artifact.objects.get(id=secret["id"]).versions.count() == 1


def test_the_project_permission_widens_the_project_level_kinds_only(project):
    world = build(project)
    ids = world.ids
    o = Session.objects.get(tokens__name="other-writer")
    wide = Api(_token(project, "auditor", ["read", PROJECT_WIDE], o))
    assert ok(wide.get(f"/artifacts/{ids['artifact_id']}"))["name"] == "victim-chapter"
    assert ok(wide.get(f"/write-intents/{ids['intent_id']}"))["id"] == ids["intent_id"]
    assert len(ok(wide.get("/authority/changes"))["items"]) == 1
    # the session-level kinds stay its own session's
    for path in (f"/sessions/{ids['session_id']}", f"/runtimes/{ids['runtime_id']}", f"/runs/{ids['run_id']}",
                 f"/handoffs/{ids['handoff_id']}", f"/checkpoints/{ids['checkpoint_id']}"):
        assert wide.get(path).status_code == 404, path
    assert MARK not in wide.get("/events").content.decode()


def test_create_api_token_takes_the_project_permission(project):
    o = _session(project, "writer", "session", ["draft"])
    out = StringIO()
    call_command("create_api_token", project.slug, "--name", "wide", "--permissions", "read,project", "--session", str(o.id),
                 stdout=out)
    token = ApiToken.objects.get(name="wide")
    assert token.permissions == ["project", "read"] and token.session_id == o.id
    assert caller_for_token(out.getvalue().strip()).bound_for("artifact") is None


def test_the_matrix_names_every_kind_the_api_looks_up_and_the_api_page_shows_it():
    from pathlib import Path

    page = Path(__file__).resolve().parents[2].joinpath("docs", "api.md").read_text()
    section = page.split("\n## Session-bound tokens\n", 1)[1].split("\n## ", 1)[0]
    for kind, rule in BOUND_TOKEN_MATRIX.items():
        assert f"`{kind}`" in section, kind
        assert isinstance(rule.bound, Reach)
    assert "`project`" in section and "create_api_token" in section


# ---- citing is not a grant: a bound token cites only what it already reaches -----------------------------
def _other_run(world) -> int:
    return Session.objects.get(tokens__name="other-writer").runs.get(state="open").id


def test_frozen_inputs_name_an_artifact_only_with_its_versions_fingerprint(project):
    """An outside check: a run's frozen_inputs ``[{"artifact_id": N}]`` gave a bound token
    artifact N (cited artifacts are given ones) without anything proving it knew the version."""
    world = build(project)
    o = Session.objects.get(tokens__name="other-writer")
    ok(world.other.post(f"/runs/{_other_run(world)}/end", {"outcome": "completed"}))
    before, events = snapshot(), Event.objects.count()
    for frozen, code, field in [
        ([{"artifact_id": world.ids["artifact_id"]}], "validation_error", "frozen_inputs[0].fingerprint"),
        ([{"kind": "note"}, {"artifact_id": "7", "fingerprint": "sha256:" + "0" * 64}], "validation_error",
         "frozen_inputs[1].artifact_id"),
        ([{"artifact_id": world.ids["artifact_id"], "fingerprint": "sha256:" + "0" * 64}], "unknown_artifact_version", None),
    ]:
        resp = world.other.post(f"/sessions/{o.id}/runs", {"frozen_inputs": frozen})
        assert resp.status_code == 422 and resp.json()["error"]["code"] == code, resp.content
        assert resp.json()["error"]["details"].get("field") == field
        assert snapshot() == before and Event.objects.count() == events
    assert world.other.get(f"/artifacts/{world.ids['artifact_id']}").status_code == 404
    assert world.other.get(f"/artifact-versions/{world.ids['version_id']}").status_code == 404
    # free-form items stay free-form
    ok(world.other.post(f"/sessions/{o.id}/runs", {"frozen_inputs": [{"kind": "scratch", "text": "x"}]}), 201)
    assert world.other.get(f"/artifacts/{world.ids['artifact_id']}").status_code == 404


def test_a_bound_token_opens_a_gate_only_on_a_version_it_reaches(project):
    """An outside check: a review gate on another session's version (its id only) answered 201
    with the candidate's fingerprint, and gave the token that version's content."""
    world = build(project)
    o = Session.objects.get(tokens__name="other-writer")
    before, events = snapshot(), Event.objects.count()
    for version_id in (world.ids["version_id"], 10**9):  # another session's, and none: the same answer
        resp = world.other.post(f"/sessions/{o.id}/review-gates",
                                {"candidate_version_id": version_id, "rubric": RUBRIC, "route": "agent"})
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", resp.content
        assert snapshot() == before and Event.objects.count() == events
    assert world.other.get(f"/artifact-versions/{world.ids['version_id']}").status_code == 404
    mine = ok(world.other.post("/artifacts", {"name": "own", "content": "own text"}), 201)
    gate = ok(world.other.post(f"/sessions/{o.id}/review-gates", {
        "candidate_version_id": mine["current_version_id"], "rubric": RUBRIC, "route": "agent"}), 201)
    assert gate["candidate_fingerprint"] == mine["current_fingerprint"]


@pytest.mark.parametrize("path", ["checkpoints", "batch"])
def test_a_bound_token_cites_only_its_own_sessions_write_intents_in_approvals(project, path):
    """An outside check: a checkpoint's ``approvals`` ref to another session's intent was stored
    with that intent's state and before-state: a read of what GET /write-intents/{id} refuses."""
    world = build(project)
    run_id = _other_run(world)
    cp = {"boundary": "context_freeze", "cursor": {"step": 1}, "approvals": [{"write_intent_id": world.ids["intent_id"]}]}
    body = cp if path == "checkpoints" else {"items": [{"kind": "checkpoint", "checkpoint": cp}]}
    before, events = snapshot(), Event.objects.count()
    answers = []
    for intent_id in (world.ids["intent_id"], 10**9):  # another session's, and none: the same answer
        cp["approvals"] = [{"write_intent_id": intent_id}]
        resp = world.other.post(f"/runs/{run_id}/{path}", body)
        assert resp.status_code == 422, resp.content
        answers.append(resp.json()["error"]["code"])
        assert snapshot() == before and Event.objects.count() == events
    assert answers == ["validation_error", "validation_error"]
    assert world.other.get(f"/write-intents/{world.ids['intent_id']}").status_code == 404
    # its own session's intent resolves
    art = ok(world.other.post("/artifacts", {"name": "own", "content": "own text"}), 201)
    state = ok(world.other.get("/write-intents/before-state", kind="artifact.make_current", artifact_id=art["id"]))
    v2 = ok(world.other.post(f"/artifacts/{art['id']}/versions", {"content": "own v2"}), 201)
    mine = ok(world.other.post("/write-intents", {
        "kind": "artifact.make_current", "idempotency_key": "own", "artifact_id": art["id"],
        "params": {"version_id": v2["id"]}, "before_fingerprint": state["before_fingerprint"]}), 201)
    cp["approvals"] = [{"write_intent_id": mine["id"]}]
    ok(world.other.post(f"/runs/{run_id}/{path}", body), 201)


def test_a_blind_reviewer_cannot_cite_its_packets_fingerprint_into_a_grant(project):
    """An agent reviewer's packet carries the candidate's
    fingerprint, not its artifact id. Citing ``(id, fingerprint)`` for guessed ids in its own
    run's checkpoints (or frozen inputs, batch items, handoff inputs) answered 422 for a wrong id
    and 201 for the right one, and the citation then gave the reviewer the whole artifact: its
    private name and every version, earlier drafts included. A citation names only what the
    caller already reads: out of reach answers exactly as a missing id, and nothing is cited."""
    world = make_world(project)  # the writer's artifact: v1 an early private draft
    draft = world.version
    candidate = ok(world.writer_api.post(f"/artifacts/{draft.artifact_id}/versions", {"content": "The lamp turned."}), 201)
    world.gate(route="agent", candidate_version_id=candidate["id"], required_verdicts=1)
    r, reviewer = agent_reviewer(project, permissions=("read", "write", "review"))
    packet = ok(reviewer.post("/review-packets/claim"))["packet"]
    fp = packet["content"]["candidate"]["fingerprint"]
    assert fp == candidate["fingerprint"] and "artifact_id" not in json.dumps(packet)

    def cite(artifact_id: int) -> list[dict[str, Any]]:
        return [{"artifact_id": artifact_id, "fingerprint": fp}]

    def answers(artifact_id: int) -> list[dict[str, Any]]:
        """Every citing route, for one guessed artifact id: its status and error body."""
        sent = [reviewer.post(f"/sessions/{r.id}/runs", {"cursor": {"step": "review"}, "frozen_inputs": cite(artifact_id)})]
        if sent[0].status_code == 201:  # (before the fix) the citation landed: end that run, the asserts say why
            ok(reviewer.post(f"/runs/{sent[0].json()['id']}/end", {"outcome": "completed"}))
        run_id = ok(reviewer.post(f"/sessions/{r.id}/runs", {"cursor": {"step": "review"}}), 201)["id"]
        checkpoint = {"boundary": "context_freeze", "cursor": {"step": "review"}, "artifacts": cite(artifact_id)}
        sent += [
            reviewer.post(f"/runs/{run_id}/checkpoints", checkpoint),
            reviewer.post(f"/runs/{run_id}/batch", {"items": [{"kind": "checkpoint", "checkpoint": checkpoint}]}),
            reviewer.post(f"/runs/{run_id}/handoffs", {"logical_id": "peek", "inputs": cite(artifact_id)}),
        ]
        ok(reviewer.post(f"/runs/{run_id}/end", {"outcome": "completed"}))
        return [{"status": resp.status_code, **resp.json()} for resp in sent]

    def citations() -> tuple[int, ...]:
        """Rows and events a citation would write (runs are started and ended by the probes)."""
        return (Checkpoint.objects.count(), Handoff.objects.count(), Artifact.objects.count(),
                Event.objects.filter(type__in=["checkpoint.recorded", "handoff.created"]).count(),
                Run.objects.exclude(frozen_inputs=[]).count())

    before = citations()
    theirs, nowhere = answers(draft.artifact_id), answers(MISSING)
    for mine, missing in zip(theirs, nowhere):
        assert mine["status"] == 422 and mine["error"]["code"] == "unknown_artifact_version", mine
        # word for word the answer for an id no row has, but for the id the caller itself sent
        assert json.dumps(mine) == json.dumps(missing).replace(str(MISSING), str(draft.artifact_id)), (mine, missing)
    assert citations() == before
    assert ok(reviewer.get("/artifacts"))["items"] == []
    assert reviewer.get(f"/artifacts/{draft.artifact_id}").status_code == 404
    for version_id in (draft.id, candidate["id"]):
        assert reviewer.get(f"/artifact-versions/{version_id}").status_code == 404

    # It cites what it reaches: an artifact it wrote, and one an unbound token (an orchestrator)
    # gave its session by citing it, which the orchestrator can because it reaches everything.
    orchestrator = Api(_token(project, "orchestrator", ALL_PERMISSIONS))
    run_id = ok(reviewer.post(f"/sessions/{r.id}/runs", {"cursor": {"step": "review"}}), 201)["id"]
    ok(orchestrator.post(f"/runs/{run_id}/checkpoints", {"boundary": "context_freeze", "cursor": {"step": "given"},
                                                        "artifacts": cite(draft.artifact_id)}), 201)
    assert [a["id"] for a in ok(reviewer.get("/artifacts"))["items"]] == [draft.artifact_id]
    own = ok(reviewer.post("/artifacts", {"name": "notes", "content": "my notes"}), 201)
    for ref in ({"artifact_id": own["id"], "fingerprint": own["current_fingerprint"]}, *cite(draft.artifact_id)):
        ok(reviewer.post(f"/runs/{run_id}/checkpoints", {"boundary": "context_freeze", "cursor": {"step": 1},
                                                        "artifacts": [ref]}), 201)


def test_each_citation_gives_its_artifact_and_odd_refs_give_nothing(project):
    """The reach is one SQL subquery (``access.artifacts_given_to``) over every source the matrix
    names: versions written under the session's token, and the artifacts its runs' frozen inputs,
    its checkpoints, its handoffs' inputs and its review gates' candidates cite. A ref list that
    holds odd JSON (hand-written rows) gives nothing and breaks nothing."""
    world = build(project)
    o = Session.objects.get(tokens__name="other-writer")
    made = {k: ok(world.owner.post("/artifacts", {"name": f"given-{k}", "content": k}), 201)
            for k in ("run", "checkpoint", "handoff", "gate", "none")}

    def ref(key: str) -> dict[str, Any]:
        return {"artifact_id": made[key]["id"], "fingerprint": made[key]["current_fingerprint"]}

    ok(world.owner.post(f"/runs/{_other_run(world)}/end", {"outcome": "completed"}))
    run_id = ok(world.owner.post(f"/sessions/{o.id}/runs", {"frozen_inputs": [{"kind": "note"}, ref("run")]}), 201)["id"]
    cp = ok(world.owner.post(f"/runs/{run_id}/checkpoints", {"boundary": "context_freeze", "cursor": {"a": 1},
                                                             "artifacts": [ref("checkpoint")]}), 201)
    ok(world.owner.post(f"/sessions/{o.id}/review-gates", {"candidate_version_id": made["gate"]["current_version_id"],
                                                          "rubric": RUBRIC, "route": "agent"}), 201)
    ok(world.owner.post(f"/runs/{run_id}/handoffs", {"logical_id": "given-job", "inputs": [ref("handoff")]}), 201)
    mine = ok(world.other.post("/artifacts", {"name": "own", "content": "own"}), 201)
    expected = {mine["id"], *(made[k]["id"] for k in ("run", "checkpoint", "handoff", "gate"))}
    everything = [mine, *made.values()]

    def reads_by_name() -> set[int]:
        """What the lookups that name their rows (``access.given_among``: a read by id, by
        version id, a citation) reach: the same as the list (``access.artifacts_given_to``)."""
        found = {a["id"] for a in everything if world.other.get(f"/artifacts/{a['id']}").status_code == 200}
        by_version = {a["id"] for a in everything
                      if world.other.get(f"/artifact-versions/{a['current_version_id']}").status_code == 200}
        assert by_version == found
        return found

    assert {a["id"] for a in ok(world.other.get("/artifacts"))["items"]} == expected == reads_by_name()
    Checkpoint.objects.filter(id=cp["id"]).update(artifacts=[
        {"artifact_id": str(made["none"]["id"])}, {"artifact_id": made["none"]["id"] + 0.5}, made["none"]["id"], None,
        {"artifact_id": [made["none"]["id"]]}, {"artifact_id": 10**30}, {"artifact_id": -1}, ref("checkpoint")])
    assert {a["id"] for a in ok(world.other.get("/artifacts"))["items"]} == expected == reads_by_name()
    assert world.other.get(f"/artifacts/{made['none']['id']}").status_code == 404
    assert world.other.get(f"/artifacts/{2**63}").status_code == 404  # beyond bigint: no row, no error


# ---- a bound token creates no session -------------------------
NEW_SESSION = {"role": "writer", "memory_policy": "bounded", "task_mode": "drafting", "runtime_family": "cli",
               "runtime": {"runtime_family": "cli", "capabilities": ["review", "victim-cap"], "lease_seconds": 3600}}
OPEN = {"role": "semantic_reviewer", "memory_policy": "none", "task_mode": "drafting", "capabilities": ["review"]}


def bound_writers(project) -> dict[str, Api]:
    """Tokens bound to R (with ``write`` now) and to O (with and without ``project``)."""
    r = Session.objects.get(tokens__name="reviewer")
    o = Session.objects.get(tokens__name="other-writer")
    return {
        "reviewer": Api(_token(project, "reviewer-writes", ["read", "write", "review"], r)),
        "other": Api(_token(project, "other-again", WRITER_PERMS, o)),
        "other + project": Api(_token(project, "other-wide", [*WRITER_PERMS, PROJECT_WIDE], o)),
    }


def test_a_bound_token_creates_no_session(project):
    world = build(project)
    for who, token in bound_writers(project).items():
        before, events = snapshot(), Event.objects.count()
        err = refused(token.post("/sessions", NEW_SESSION), 403, "forbidden")
        assert "bound to a session" in err["message"], who
        assert snapshot() == before and Event.objects.count() == events, who
    # the unbound project token creates sessions, with their first runtime
    made = ok(world.owner.post("/sessions", NEW_SESSION), 201)
    assert made["runtime_id"] and Session.objects.filter(id=made["id"]).exists()


@pytest.mark.parametrize("route", ["/graph-threads/checkpoints", "/graph-threads/writes"])
def test_a_bound_token_opens_no_graph_thread_whether_the_id_is_unused_or_taken(project, route):
    """Opening a thread opens a session: refused alike for an unused id and for W's thread (it
    was 404 for the one and a 500 for the other), nothing written."""
    world = build(project)
    body = {"checkpoint_id": "cp-9", "checkpoint": {"v": 1}, "open": OPEN} if route.endswith("checkpoints") else {
        "checkpoint_id": "cp-1", "task_id": "t", "open": OPEN,
        "writes": [{"idx": 0, "channel": "c", "value": {"serde": "json", "data": ""}}]}
    for who, token in bound_writers(project).items():
        answers = []
        for thread in ("never-used", THREAD):
            before, events = snapshot(), Event.objects.count()
            answers.append(refused(token.post(route, {**body, "thread_id": thread}), 403, "forbidden")["message"])
            assert snapshot() == before and Event.objects.count() == events, (who, thread)
        assert answers[0] == answers[1], who
    # W's own token still writes to its own thread with an open spec (it opens nothing)
    if route.endswith("writes"):
        assert ok(world.writer.post(route, {**body, "thread_id": THREAD}))["stored"] == 1
    # the unbound token opens a new thread
    assert world.owner.post(route, {**body, "thread_id": "a-new-thread"}).status_code in (200, 201)
    assert GraphThread.objects.filter(thread_id="a-new-thread").exists()


def test_a_thread_id_taken_out_of_reach_answers_as_a_missing_thread(project, monkeypatch):
    """Defence in depth: when opening loses the thread id to a thread the caller cannot see, the
    answer is a missing thread (404), never the unique-constraint error (a 500)."""
    build(project)
    owner = Caller(label="test:owner", project_ids=frozenset({project.id}), permissions=frozenset(ALL_PERMISSIONS),
                   project=project)
    monkeypatch.setattr(graphs, "find_thread", lambda caller, thread_id: None)  # the thread is out of its reach
    before, events = snapshot(), Event.objects.count()
    with pytest.raises(NotFound):
        graphs.open_thread(owner, THREAD, graphs.ThreadSpec())
    assert snapshot() == before and Event.objects.count() == events


# ---- a bound token learns nothing of other sessions from refusals and reports --------------------
def _other(world: World, project) -> tuple[Session, Any]:
    o = Session.objects.get(tokens__name="other-writer")
    return o, caller_for_token(_token(project, "other-caller", WRITER_PERMS, o))


def test_naming_reviewer_sessions_gets_one_refusal_for_every_session_that_is_not_an_eligible_reviewer(project, other_project):
    world = build(project)
    o, oc = _other(world, project)
    mine = artifacts.create_artifact(oc, name="o-chapter", kind="chapter", content="o's text")
    memory = _session(project, "semantic_reviewer", "session", ["review"])
    retired = _session(project, "semantic_reviewer", "none", ["review"])
    boss = Caller(label="test:boss", project_ids=frozenset({project.id}), permissions=frozenset(ALL_PERMISSIONS), project=project)
    runs.start_run(boss, retired.id)
    sessions.transition_session(boss, retired.id, "terminated")
    elsewhere = _session(other_project, "semantic_reviewer", "none", ["review"])
    r = Session.objects.get(tokens__name="reviewer")

    def gate(reviewer_id: int):
        return world.other.post(f"/sessions/{o.id}/review-gates", {
            "candidate_version_id": mine.current_version_id, "rubric": RUBRIC, "route": "agent",
            "reviewer_session_ids": [reviewer_id]})

    answers = set()
    for sid in (MISSING, world.ids["session_id"], memory.id, retired.id, elsewhere.id):
        before, events = snapshot(), Event.objects.count()
        err = refused(gate(sid), 422, "validation_error")
        answers.add((err["message"], tuple(sorted(err["details"].items()))))
        assert snapshot() == before and Event.objects.count() == events, sid
    assert answers == {(next(iter(answers))[0], (("field", "reviewer_session_ids[0]"),))}
    # its own session is within its reach, and named as such
    refused(gate(o.id), 403, "independence_violation")
    # an eligible reviewer session is assigned
    made = ok(gate(r.id), 201)
    assert [a["reviewer"] for a in made["assignments"]] == [f"session:{r.id}"]


def test_resume_reports_other_sessions_runtimes_as_a_count(project):
    world = build(project)
    o, _ = _other(world, project)
    run_id = o.runs.get(state="open").id
    job = ok(world.other.post(f"/runs/{run_id}/handoffs", {"logical_id": "o-job", "required_capabilities": ["victim-cap"]}), 201)
    ok(world.other.post(f"/sessions/{o.id}/close", {}))
    body = {"runtime": {"runtime_family": "claude-code"}, "dry_run": True}
    resp = world.other.post(f"/sessions/{o.id}/resume", body)
    caps = next(s for s in ok(resp)["steps"] if s["step"] == "capabilities")
    assert caps["ok"] and caps["data"]["served"] == {job["logical_id"]: {"live_runtimes": 1, "runtime_ids": []}}
    assert ok(world.other.get("/routing/runtimes", capability="victim-cap")) == []  # the same reach
    # the unbound project token reaches W's runtime
    caps = next(s for s in ok(world.owner.post(f"/sessions/{o.id}/resume", body))["steps"] if s["step"] == "capabilities")
    assert caps["data"]["served"] == {job["logical_id"]: {"live_runtimes": 1, "runtime_ids": [world.ids["runtime_id"]]}}


def test_a_page_gates_routing_counts_other_sessions_reviewers_without_naming_them(project):
    world = build(project)
    o, oc = _other(world, project)
    r = Session.objects.get(tokens__name="reviewer")  # live, declares `review`: an agent that could have taken it
    mine = artifacts.create_artifact(oc, name="o-chapter", kind="chapter", content="o's text")
    made = ok(world.other.post(f"/sessions/{o.id}/review-gates", {
        "candidate_version_id": mine.current_version_id, "rubric": RUBRIC, "route": "page", "reviewers": ["alice"]}), 201)
    assert made["routing"] == {"live_agent_reviewers": [], "live_agent_reviewer_count": 1}
    assert ok(world.other.get(f"/review-gates/{made['id']}"))["routing"] == made["routing"]
    listed = ok(world.other.get(f"/sessions/{o.id}/review-gates"))["items"]
    assert [g["routing"] for g in listed] == [made["routing"]]
    assert ok(world.owner.get(f"/review-gates/{made['id']}"))["routing"] == {
        "live_agent_reviewers": [{"session_id": r.id, "runtime_family": "claude-code"}], "live_agent_reviewer_count": 1}
