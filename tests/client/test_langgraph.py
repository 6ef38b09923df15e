"""The LangGraph checkpointer against a live server (real daphne + PostgreSQL).

LangGraph's own conformance suite (``langgraph-checkpoint-conformance``) must report all eight
capabilities detected and passed (the five base ones, and copy_thread, prune, delete_for_runs); a graph with ``interrupt()`` pauses as a review gate, a reviewer binds
a verdict through the API, and the graph resumes through the session's resume revalidation.
"""
from __future__ import annotations

import asyncio
import enum
import json
import operator
import os

from datetime import timedelta
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from django.utils import timezone
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, BASE_CAPABILITIES, EXTENDED_CAPABILITIES
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from django.conf import settings
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command, Send, interrupt

from novelforge_client.errors import Conflict, GraphCheckpointConflict
from novelforge_client.langgraph import NovelForgeSaver, ThreadSpec, review_gate
from novelforge_sessions.control.models import GraphCheckpoint, GraphWrite, GraphThread
from novelforge_sessions.models import Artifact, Checkpoint, Run, RuntimeAttachment, Session
from reviews.models import ReviewGate
from tests.support.servers import DaphneServer
from tests.support.waits import wait_until
from tests.reviews.factories import CHAPTER, RUBRIC, agent_reviewer, agent_verdict

pytestmark = pytest.mark.django_db(transaction=True)



def test_langgraph_conformance_reports_all_eight_capabilities_passed(graph_server, graph_token):
    @checkpointer_test(name="NovelForgeSaver")
    async def novelforge_saver():
        saver = NovelForgeSaver(url=graph_server.url, token=graph_token)
        yield saver
        await saver.aclose()

    failures: list[str] = []

    def on_result(capability: str, test: str, passed: bool, error: str | None) -> None:
        if not passed:
            failures.append(f"{capability}/{test}:\n{error}")

    report = asyncio.run(validate(novelforge_saver, progress=ProgressCallbacks(on_test_result=on_result)))
    assert failures == []
    assert ALL_CAPABILITIES == BASE_CAPABILITIES | EXTENDED_CAPABILITIES and len(ALL_CAPABILITIES) == 8
    for capability in ALL_CAPABILITIES:  # the five base ones and copy_thread, prune, delete_for_runs
        result = report.results[capability.value]
        assert result.detected and result.passed, (capability, result)
        assert result.tests_passed > 0 and result.tests_failed == 0, (capability, result)
    assert report.passed_all_base() and report.passed_all()
    # Every thread the suite opened is a session; its checkpoints are bounded ones citing blobs,
    # with small scalars only inline (never a conversation's channel).
    from novelforge_client.langgraph import _inlined
    from novelforge_sessions import session_runtime as rt

    graphs = GraphCheckpoint.objects.select_related("record", "thread__session")
    assert graphs.exists()
    for g in graphs:
        assert g.record.session_id == g.thread.session_id
        assert g.record.cursor["graph"]["checkpoint_id"] == g.checkpoint_id
        assert sorted(r["fingerprint"] for r in g.record.artifacts) == sorted(set(g.document["blobs"].values()))
        inline = g.document.get("channel_values", {})
        assert all(_inlined(v) for v in inline.values()) and not {c.lower() for c in inline} & rt.TRANSCRIPT_KEYS
        assert not set(inline) & set(g.document["blobs"])
    assert Artifact.objects.filter(kind="graph-blob").exists()


# ---- interrupt() as a review gate, resumed through the resume revalidation ---------------------------------
class Draft(TypedDict, total=False):
    draft: str
    verdict: dict
    final: str


def build_graph(saver: NovelForgeSaver, candidate_version_id: int, reviewer_session_id: int):
    def write(state: Draft) -> Draft:
        return {"draft": "The lamp had not failed in forty years."}

    def review(state: Draft) -> Draft:
        verdict = review_gate(candidate_version_id=candidate_version_id, rubric=RUBRIC, route="agent",
                              reviewer_session_ids=[reviewer_session_id])
        return {"verdict": verdict}

    def finish(state: Draft) -> Draft:
        return {"final": f"{state['draft']} [{state['verdict']['decision']}]"}

    builder = StateGraph(Draft)
    builder.add_node("write", write)
    builder.add_node("review", review)
    builder.add_node("finish", finish)
    builder.add_edge(START, "write")
    builder.add_edge("write", "review")
    builder.add_edge("review", "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=saver)


def test_an_interrupt_pauses_as_a_review_gate_and_the_graph_resumes_through_revalidation(graph_server, graph_token, project):
    api = httpx.Client(base_url=graph_server.url + "/api/v1", headers={"Authorization": f"Bearer {graph_token}"})
    candidate = api.post("/artifacts", json={"name": "chapter-3", "content": CHAPTER}).json()
    reviewer_session, reviewer = agent_reviewer(project)
    config = {"configurable": {"thread_id": "chapter-3"}}

    # First process: the graph writes, then pauses on the review gate.
    spec = ThreadSpec(role="writer", memory_policy="bounded", task_mode="drafting")
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, thread_spec=spec)
    graph = build_graph(saver, candidate["current_version_id"], reviewer_session.id)
    paused = graph.invoke({}, config)
    assert "__interrupt__" in paused and "final" not in paused
    session = Session.objects.get(graph_thread__thread_id="chapter-3")
    assert session.status == "awaiting_external"  # the agent route waits on an agent reviewer
    [gate] = ReviewGate.objects.filter(session=session)
    assert gate.state == "pending" and gate.candidate_id == candidate["current_version_id"]
    wait = Checkpoint.objects.filter(session=session).order_by("id").last()
    assert wait.boundary == "external_wait" and wait.pending["gates"][0]["gate_id"] == gate.id
    assert wait.cursor["graph"]["interrupted"] is True
    assert {"artifact_id": candidate["id"], "fingerprint": candidate["current_fingerprint"],
            "head_version_id": candidate["current_version_id"]} in wait.artifacts
    # The first process goes away: its lease runs out (in the database).
    RuntimeAttachment.objects.filter(session=session).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    saver.close()

    # The reviewer binds a verdict through the API, as its own session.
    claim = reviewer.post("/review-packets/claim").json()
    assert claim["packet"]["id"] == gate.packet.id
    bound = reviewer.post(f"/review-packets/{gate.packet.id}/verdicts",
                          agent_verdict(gate, claim["lease"]["fencing_token"], decision="pass"))
    assert bound.status_code == 201, bound.content

    # A second process resumes the thread: the session's resume revalidation, then generation 2.
    saver2 = NovelForgeSaver(url=graph_server.url, token=graph_token, thread_spec=spec)
    done_gate = saver2.wait_for_gate(gate.id)
    assert done_gate["state"] == "complete" and done_gate["verdicts"][0]["decision"] == "pass"
    report = saver2.resume("chapter-3")
    assert report["ok"] and report["checkpoint_id"] == wait.id and report["generation"] == 2
    steps = {s["step"]: s for s in report["steps"]}
    assert all(s["ok"] for s in steps.values()) and {"reviews", "artifacts", "authority"} <= set(steps)
    # the state blobs of the interrupted checkpoint and the gate's candidate, all still current
    assert len(wait.artifacts) >= 2 and steps["artifacts"]["detail"].startswith(f"{len(wait.artifacts)} artifact fingerprint")
    graph2 = build_graph(saver2, candidate["current_version_id"], reviewer_session.id)
    finished = graph2.invoke(Command(resume=done_gate["verdicts"][0]), config)
    assert finished["final"] == "The lamp had not failed in forty years. [pass]"
    assert finished["verdict"]["decision"] == "pass"

    session.refresh_from_db()
    assert session.status == "running" and session.generation == 2
    first_run, second_run = Run.objects.filter(session=session).order_by("seq")
    assert first_run.state != "open" and second_run.state == "open" and second_run.resumed_from_id == wait.id
    later = GraphCheckpoint.objects.filter(thread__session=session, record__run=second_run)
    assert later.exists()  # the graph's next checkpoints landed in the resumed run
    assert ReviewGate.objects.filter(session=session).count() == 1  # the re-executed node opened no second gate
    assert saver2.get_tuple(config).checkpoint["channel_values"]["final"].endswith("[pass]")
    saver2.close()
    api.close()


def test_the_sync_api_lists_filters_deletes_and_raises_typed_errors(graph_server, graph_token):
    from langgraph.checkpoint.base import empty_checkpoint

    saver = NovelForgeSaver(url=graph_server.url, token=graph_token)
    config = {"configurable": {"thread_id": "sync-thread", "checkpoint_ns": ""}}
    first = empty_checkpoint()
    first["channel_values"], first["channel_versions"] = {"notes": ["a", "b"]}, {"notes": 1}
    stored = saver.put(config, first, {"source": "input", "step": -1}, {"notes": 1})
    second = empty_checkpoint()
    second["channel_values"], second["channel_versions"] = {"notes": ["a", "b"]}, {"notes": 1}
    saver.put(stored, second, {"source": "loop", "step": 0}, {})
    saver.put_writes(stored, [("notes", ["c"])], "task-1")
    assert [t.metadata["step"] for t in saver.list(config)] == [0, -1]
    [looped] = saver.list(config, filter={"source": "loop"})
    assert looped.checkpoint["channel_values"] == {"notes": ["a", "b"]}  # found at its unchanged version
    assert looped.parent_config["configurable"]["checkpoint_id"] == first["id"]
    assert saver.get_tuple(stored).pending_writes == [("task-1", "notes", ["c"])]

    changed = dict(first, channel_values={"notes": ["z"]})
    with pytest.raises(GraphCheckpointConflict) as refused:
        saver.put(config, changed, {"source": "input", "step": -1}, {"notes": 1})
    assert refused.value.status == 409 and refused.value.details["checkpoint_id"] == first["id"]
    assert saver.get_tuple(stored).checkpoint["channel_values"] == {"notes": ["a", "b"]}  # nothing changed

    session_id = GraphThread.objects.get(thread_id="sync-thread").session_id
    saver.delete_thread("sync-thread")
    assert saver.get_tuple(config) is None and list(saver.list(config)) == []
    assert not Session.objects.filter(id=session_id).exists()
    saver.close()


def test_a_plain_interrupt_waits_on_the_user_and_the_same_process_continues(graph_server, graph_token):
    def ask(state: Draft) -> Draft:
        return {"draft": interrupt("Which ending?")}

    def finish(state: Draft) -> Draft:
        return {"final": state["draft"].upper()}

    builder = StateGraph(Draft)
    builder.add_node("ask", ask)
    builder.add_node("finish", finish)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", "finish")
    builder.add_edge("finish", END)
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token)
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "ask-thread"}}
    paused = graph.invoke({}, config)
    assert paused["__interrupt__"][0].value == "Which ending?"
    session = Session.objects.get(graph_thread__thread_id="ask-thread")
    assert session.status == "awaiting_user"
    wait = Checkpoint.objects.filter(session=session).order_by("id").last()
    assert wait.boundary == "user_wait" and wait.cursor["graph"]["interrupted"] is True
    assert graph.invoke(Command(resume="the lamp stays lit"), config)["final"] == "THE LAMP STAYS LIT"
    session.refresh_from_db()
    assert session.status == "running" and session.generation == 1
    saver.close()


# ---- values of any size, each sent once ------------------------------------------------------------------
class Recording(httpx.HTTPTransport):
    """The saver's HTTP layer, recording each request's method, API path and body size."""

    def __init__(self) -> None:
        super().__init__(retries=2)
        self.sent: list[tuple[str, str, int]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        self.sent.append((request.method, request.url.path.removeprefix("/api/v1"), len(body)))
        return super().handle_request(request)

    def paths(self, since: int = 0) -> list[str]:
        return [f"{method} {path}" for method, path, _ in self.sent[since:]]


class AsyncRecording(httpx.AsyncHTTPTransport):
    """:class:`Recording` for the async client."""

    def __init__(self) -> None:
        super().__init__(retries=2)
        self.sent: list[tuple[str, str, int]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        self.sent.append((request.method, request.url.path.removeprefix("/api/v1"), len(body)))
        return await super().handle_async_request(request)


def test_a_thread_whose_state_holds_8_mb_of_messages_is_saved_and_reloaded(graph_server, graph_token):
    """A chat of four 2 MiB turns (its messages channel 8 MiB and more): every request stays under
    the API's body limit (large values go up in chunks), and a fresh saver reloads all of it."""
    turn = 2 * 1024 * 1024
    contents = [os.urandom(turn // 2).hex() for _ in range(4)]  # distinct: no value repeats another

    def talk(state: MessagesState) -> dict:
        done = len(state["messages"]) - 1
        return {"messages": [AIMessage(content=contents[done], id=f"turn-{done}")]}

    def more(state: MessagesState) -> str:
        return "talk" if len(state["messages"]) <= len(contents) else END

    builder = StateGraph(MessagesState)
    builder.add_node("talk", talk)
    builder.add_edge(START, "talk")
    builder.add_conditional_edges("talk", more, ["talk", END])
    wire = Recording()
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, transport=wire)
    config = {"configurable": {"thread_id": "long-chat"}}
    out = builder.compile(checkpointer=saver).invoke({"messages": [HumanMessage("Tell it all.", id="ask")]}, config)
    assert [m.content for m in out["messages"][1:]] == contents
    saver.close()

    assert max(size for _, _, size in wire.sent) <= settings.API_MAX_BODY_BYTES
    assert "POST /graph-blobs" in wire.paths()  # the large values went up in chunks
    reloaded = NovelForgeSaver(url=graph_server.url, token=graph_token)
    state = builder.compile(checkpointer=reloaded).get_state(config)
    messages = state.values["messages"]
    assert [m.content for m in messages] == ["Tell it all.", *contents]
    assert sum(len(m.content) for m in messages) >= 8 * 1024 * 1024
    assert state.next == ()  # the graph ended; its last checkpoint is the one reloaded
    reloaded.close()


class Mood(enum.StrEnum):
    CALM = "calm"


def test_which_values_travel_inline_is_decided_by_exact_type_and_size():
    from novelforge_client.langgraph import _inlined

    for value in (None, True, False, 0, 2**53, -(2**53), "", "ü" * 256, "plain text"):
        assert _inlined(value), value
    for value in (1.0, float("nan"), 2**53 + 1, -(2**53) - 1, "x" * 257, "a\x00b", "\ud800", Mood.CALM, [1], {"a": 1},
                  b"bytes", (1,)):
        assert not _inlined(value), value


def test_the_savers_inline_bounds_are_the_servers():
    # The client package cannot import the server: its copies of the bounds are pinned here, so
    # that a bound changed on one side only fails this test, not every put with a value past it.
    from novelforge_client import langgraph as saver
    from novelforge_sessions.control import graphs

    assert saver._INLINE_INT == graphs.MAX_INLINE_INT
    assert saver._INLINE_CHARS == graphs.MAX_INLINE_CHARS
    assert 0 < saver._INLINE_BYTES < graphs.MAX_INLINE_VALUES_BYTES  # a margin under the server's limit
    assert saver._PUT_TASKS == graphs.MAX_PUT_TASK_WRITES
    assert saver._METADATA_BYTES == graphs.MAX_METADATA_BYTES
    from novelforge_sessions.api.graphs import GraphPutIn, GraphWritesIn

    assert saver._INLINE_MAX == GraphPutIn.model_fields["values"].metadata[0].max_length
    assert saver._TASK_WRITES == GraphWritesIn.model_fields["writes"].metadata[0].max_length


def test_the_saver_never_inlines_a_channel_the_server_keeps_out_of_its_rows():
    from novelforge_client.langgraph import _CONVERSATION_CHANNELS, _inline_values
    from novelforge_sessions import session_runtime as rt

    assert _CONVERSATION_CHANNELS == rt.TRANSCRIPT_KEYS
    versions = {"Messages": 1, "history": 1, "step": 1}
    assert _inline_values({"Messages": "hi", "history": "", "step": 1}, versions) == {"step": 1}


def _set_then_count(state: Any, values: dict[str, Any], server: Any, token: str, thread: str) -> tuple[Any, Any]:
    """A graph that sets ``values`` with turn 1, then counts turns to 3 (the values unchanged), run
    on a saver to its end: its builder, and the thread's latest stored graph checkpoint."""
    def first(current: Any) -> Any:
        return {**values, "turn": 1}

    def again(current: Any) -> Any:
        return {"turn": current["turn"] + 1}

    builder = StateGraph(state)
    builder.add_node("first", first)
    builder.add_node("again", again)
    builder.add_edge(START, "first")
    builder.add_edge("first", "again")
    builder.add_conditional_edges("again", lambda s: "again" if s["turn"] < 3 else END, ["again", END])
    saver = NovelForgeSaver(url=server.url, token=token)
    builder.compile(checkpointer=saver).invoke({}, {"configurable": {"thread_id": thread}}, durability="sync")
    saver.close()
    return builder, GraphCheckpoint.objects.filter(thread__thread_id=thread).order_by("-checkpoint_id").first()


def test_small_scalars_travel_inline_and_come_back_as_they_were(graph_server, graph_token):
    """Small JSON scalars (None, a bool, an int up to 2**53, text up to 256 characters) ride in the
    checkpoint itself, as LangGraph's PostgreSQL saver keeps primitive values: no blob, no channel
    version row. Anything else (a float, a larger int, longer text, a str subclass, a list) is a
    blob; a fresh saver reloads every value with its type."""
    from novelforge_sessions.control.models import GraphBlob

    class State(TypedDict, total=False):
        n: int
        flag: bool
        nothing: None
        name: str
        ratio: float
        big: int
        long: str
        mood: Mood
        items: list[int]
        turn: int

    values = {"n": 2**53, "flag": True, "nothing": None, "name": "ü" * 256, "ratio": 1.0, "big": 2**53 + 1,
              "long": "x" * 257, "mood": Mood.CALM, "items": [1, 2]}
    builder, latest = _set_then_count(State, values, graph_server, graph_token, "scalars")
    inline = latest.document["channel_values"]
    assert {k: inline[k] for k in ("n", "flag", "nothing", "name", "turn")} == {
        "n": 2**53, "flag": True, "nothing": None, "name": "ü" * 256, "turn": 3}
    assert not {"ratio", "big", "long", "mood", "items"} & set(inline)
    assert {"ratio", "big", "long", "mood", "items"} <= set(latest.document["blobs"])
    stored = set(GraphBlob.objects.filter(thread__thread_id="scalars").values_list("channel", flat=True))
    assert not {"n", "flag", "nothing", "name", "turn"} & stored
    reloaded = NovelForgeSaver(url=graph_server.url, token=graph_token)
    state = builder.compile(checkpointer=reloaded).get_state({"configurable": {"thread_id": "scalars"}}).values
    reloaded.close()
    assert state == {**values, "turn": 3}
    assert {k: type(v) for k, v in state.items()} == {k: type(v) for k, v in {**values, "turn": 3}.items()}


def test_scalars_past_one_put_s_inline_room_go_as_blobs_and_every_value_reloads(graph_server, graph_token):
    """80 texts of 250 characters are more than one put carries inline (16 KiB): the rest go as
    blobs, again on each put while unchanged, and a fresh saver reloads all of them."""
    names = [f"s{i:02d}" for i in range(80)]
    State = TypedDict("State", {**{name: str for name in names}, "turn": int}, total=False)  # type: ignore[misc]
    texts = {name: (name * 84)[:250] for name in names}
    builder, latest = _set_then_count(State, texts, graph_server, graph_token, "many-scalars")
    inline, blobs = set(latest.document["channel_values"]) & set(names), set(latest.document["blobs"]) & set(names)
    assert inline and blobs and inline | blobs == set(names) and not inline & blobs
    reloaded = NovelForgeSaver(url=graph_server.url, token=graph_token)
    config = {"configurable": {"thread_id": "many-scalars"}}
    assert builder.compile(checkpointer=reloaded).get_state(config).values == {**texts, "turn": 3}
    reloaded.close()


def test_more_scalar_channels_than_one_put_carries_inline_go_as_blobs(graph_server, graph_token):
    """600 channels of small integers: a put carries at most 500 inline (the server's limit on
    ``values``), the others as blobs; the node writing all 600 is sent in parts (200 writes a
    request), and a fresh saver reloads every value. Before, the put was refused 422."""
    names = [f"n{i:03d}" for i in range(600)]
    State = TypedDict("State", {**{name: int for name in names}, "turn": int}, total=False)  # type: ignore[misc]
    numbers = {name: i for i, name in enumerate(names)}
    builder, latest = _set_then_count(State, numbers, graph_server, graph_token, "many-channels")
    inline, blobs = set(latest.document["channel_values"]) & set(names), set(latest.document["blobs"]) & set(names)
    assert len(latest.document["channel_values"]) == 500 and inline | blobs == set(names) and not inline & blobs
    reloaded = NovelForgeSaver(url=graph_server.url, token=graph_token)
    config = {"configurable": {"thread_id": "many-channels"}}
    assert builder.compile(checkpointer=reloaded).get_state(config).values == {**numbers, "turn": 3}
    reloaded.close()


def test_a_value_is_sent_once_and_a_superstep_costs_one_request(graph_server, graph_token):
    """A value travels once: the node's write carries it, the checkpoint that follows names it by
    fingerprint, later checkpoints (the channel unchanged) do not name it, and another thread
    holding the same value names it too. A superstep is one request: the put, carrying the task's
    writes (held by the saver until it), no blob uploads; every write is stored."""

    class Doc(TypedDict, total=False):
        doc: str
        count: int

    document = os.urandom(50 * 1024).hex()  # 100 KiB: inline in one request
    steps = 6

    def draft(state: Doc) -> Doc:
        return {"doc": document, "count": 1}

    def count(state: Doc) -> Doc:
        return {"count": state["count"] + 1}

    builder = StateGraph(Doc)
    builder.add_node("draft", draft)
    builder.add_node("count", count)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "count")
    builder.add_conditional_edges("count", lambda s: "count" if s["count"] < steps else END, ["count", END])
    wire = Recording()
    # held until the put however slow this machine is (a hold that runs out sends them on their
    # own: test_writes_no_put_comes_for_are_sent_on_their_own)
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, transport=wire, hold_seconds=60)
    graph = builder.compile(checkpointer=saver)

    assert graph.invoke({}, {"configurable": {"thread_id": "doc-1"}}, durability="sync")["count"] == steps
    carried = [size for _, _, size in wire.sent if size >= len(document)]
    assert len(carried) == 1  # the draft's write; its checkpoint named the value by fingerprint
    assert sum(size for _, _, size in wire.sent) < len(document) * 4 / 3 + 64 * 1024
    # the heartbeat thread's own traffic, apart: it asks the new thread's runtime its lease, once
    # (the first beat is due a third of the server's default lease into it)
    lease_calls = [c for c in wire.paths() if c.split()[1].startswith("/runtimes/")]
    runtime = saver.runtimes["doc-1"]
    assert set(lease_calls) <= {f"GET /runtimes/{runtime}", f"POST /runtimes/{runtime}/heartbeat"}
    assert lease_calls.count(f"GET /runtimes/{runtime}") <= 1
    calls = [c for c in wire.paths() if c not in lease_calls]
    assert "POST /graph-blobs" not in calls and "POST /graph-blobs/missing" not in calls
    supersteps = steps + 1  # draft, then count until it reaches `steps`
    # the input's checkpoint, then each superstep's one checkpoint carrying its task's writes
    assert calls.count("POST /graph-threads/checkpoints") == supersteps + 1
    assert calls.count("POST /graph-threads/writes") == 0
    assert len(calls) == supersteps + 2  # + the one read of the thread's latest checkpoint
    assert GraphWrite.objects.filter(thread__thread_id="doc-1").values("task_id").distinct().count() == supersteps  # each task's writes stored

    before = len(wire.sent)
    assert graph.invoke({}, {"configurable": {"thread_id": "doc-2"}})["count"] == steps
    assert max(size for _, _, size in wire.sent[before:]) < len(document)  # the held value is never sent again
    [stored] = [g for g in GraphCheckpoint.objects.filter(thread__thread_id="doc-2") if "doc" in g.document["blobs"]][:1]
    assert Artifact.objects.filter(name="blob:" + stored.document["blobs"]["doc"]).count() == 1
    assert graph.get_state({"configurable": {"thread_id": "doc-2"}}).values["doc"] == document
    saver.close()


def test_a_value_the_server_does_not_hold_after_all_is_sent_again_once(graph_server, graph_token):
    """The saver believes the server holds a value (its memory of fingerprints is only a belief:
    another server, a restored database): the put is refused 409 graph_blob_missing, the saver
    forgets the fingerprint and sends the value itself, and the put lands."""
    from langgraph.checkpoint.base import empty_checkpoint

    wire = Recording()
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, transport=wire)
    value = ["a value the server never saw", os.urandom(16).hex()]
    saver._remember([saver._value(value).fingerprint])  # the false belief
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"], checkpoint["channel_versions"] = {"notes": value}, {"notes": 1}
    config = {"configurable": {"thread_id": "believed", "checkpoint_ns": ""}}
    stored = saver.put(config, checkpoint, {"source": "input", "step": -1}, {"notes": 1})
    assert wire.paths() == ["POST /graph-threads/checkpoints"] * 2  # refused by fingerprint, then sent inline
    assert saver.get_tuple(stored).checkpoint["channel_values"] == {"notes": value}
    saver.close()


def _input_checkpoint(saver: NovelForgeSaver, thread_id: str) -> RunnableConfig:
    from langgraph.checkpoint.base import empty_checkpoint

    checkpoint = empty_checkpoint()
    checkpoint["channel_values"], checkpoint["channel_versions"] = {"notes": "start"}, {"notes": 1}
    return saver.put({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}, checkpoint,
                     {"source": "input", "step": -1}, {"notes": 1})


def _end_the_open_run(server: DaphneServer, token: str, thread_id: str) -> GraphThread:
    """End the thread's open run (as an operator would), and a checkpoint to put after it: its put
    is then refused ``no_open_run``."""
    thread = GraphThread.objects.get(thread_id=thread_id)
    run = Run.objects.get(session_id=thread.session_id, state="open")
    with httpx.Client(base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}) as http:
        assert http.post(f"/runs/{run.id}/end", json={"outcome": "completed"}).status_code == 200
    return thread


def _following_checkpoint() -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    following = empty_checkpoint()
    following["channel_values"], following["channel_versions"] = {"notes": "kept"}, {"notes": 2}
    return following


def test_writes_no_put_comes_for_are_sent_on_their_own_and_before_any_read(graph_server, graph_token):
    """A task's ordinary writes wait for the put that follows them for at most ``hold_seconds``:
    then (or at the next read, or on close) they are sent on their own, and stored."""
    wire = Recording()
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, transport=wire, hold_seconds=0.2)
    stored = _input_checkpoint(saver, "held")
    saver.put_writes(stored, [("notes", "a slow sibling's write")], "task-1")
    wait_until(lambda: GraphWrite.objects.filter(task_id="task-1").exists(), "the held write sent on its own", timeout=20)
    assert wire.paths()[-1] == "POST /graph-threads/writes"
    patient = NovelForgeSaver(url=graph_server.url, token=graph_token, transport=wire, hold_seconds=600)
    patient.put_writes(stored, [("notes", "read right after")], "task-2")
    found = patient.get_tuple(stored)  # the read sends what is held first
    assert ("task-2", "notes", "read right after") in found.pending_writes
    patient.put_writes(stored, [("notes", "closed right after")], "task-3")
    patient.close()  # and so does close
    assert GraphWrite.objects.filter(task_id="task-3").exists()
    saver.close()


def test_a_task_s_small_scalar_writes_are_kept_in_their_rows_and_come_back_as_they_were(graph_server, graph_token):
    """A task's write of a small scalar (None, a bool, an int up to 2**53, text up to 256
    characters, on a channel not named like a conversation) is sent as its ``scalar`` and kept in
    the write's row, no blob; anything else is a blob, as are the scalars past a task's share of
    the body limit (a 128th: 2 KiB of the default 256 KiB). Every value reloads with its type,
    whether held for a put or sent on its own."""
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, hold_seconds=600)
    stored = _input_checkpoint(saver, "scalar-writes")
    small = [("a", None), ("b", True), ("c", 2**53), ("d", "ü" * 256), ("e", 0), ("f", "")]
    other = [("g", 1.5), ("h", 2**53 + 1), ("messages", "hi"), ("i", Mood.CALM), ("j", "x" * 257), ("k", [1])]
    texts = [(f"t{i}", "y" * 250) for i in range(10)]
    saver.put_writes(stored, small + other, "task-1")  # held for a put
    found = saver.get_tuple(stored)  # which sends it first
    assert found.pending_writes == [("task-1", ch, v) for ch, v in small + other]
    assert [type(v) for _, _, v in found.pending_writes] == [type(v) for _, v in small + other]
    rows = {w.channel: w for w in GraphWrite.objects.filter(task_id="task-1")}
    assert {ch for ch, w in rows.items() if w.value_id is None} == {ch for ch, _ in small}
    assert all(w.scalar is None for ch, w in rows.items() if ch not in dict(small))
    put = saver.put(stored, _following_checkpoint(), {"source": "loop", "step": 0}, {"notes": 2})
    saver.put_writes(put, texts, "task-2")
    following = saver.put(put, {**_following_checkpoint(), "id": "1ef-third"}, {"source": "loop", "step": 1},
                          {"notes": 3})  # carries task-2's held writes
    assert following["configurable"]["checkpoint_id"] == "1ef-third"
    rows2 = GraphWrite.objects.filter(task_id="task-2")
    assert 0 < rows2.filter(value=None).count() < len(texts) and rows2.count() == len(texts)
    assert rows2.filter(value=None).count() == 2048 // len(json.dumps("y" * 250))
    reloaded = NovelForgeSaver(url=graph_server.url, token=graph_token)
    assert reloaded.get_tuple(put).pending_writes == [("task-2", ch, v) for ch, v in texts]
    # a saver planning for a smaller body limit gives a task's scalars a 128th of it
    small = NovelForgeSaver(url=graph_server.url, token=graph_token, max_body_bytes=64 * 1024, hold_writes=False)
    small.put_writes(put, texts, "task-3")
    rows3 = GraphWrite.objects.filter(task_id="task-3")
    assert rows3.count() == len(texts) and rows3.filter(value=None).count() == 512 // len(json.dumps("y" * 250))
    assert reloaded.get_tuple(put).pending_writes == [(t, ch, v) for t in ("task-2", "task-3") for ch, v in texts]
    small.close()
    reloaded.close()
    saver.close()


class XorCipher:
    """A toy ``CipherProtocol`` (``EncryptedSerializer``'s), to see what goes through the serializer."""

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return "xor", bytes(b ^ 0x5A for b in plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == "xor"
        return bytes(b ^ 0x5A for b in ciphertext)


def test_with_a_serializer_of_its_own_every_write_goes_through_it(graph_server, graph_token):
    """A task's small scalar writes are kept as JSON in their rows only with LangGraph's own
    serializer. With an ``EncryptedSerializer`` every write goes through it, as PostgresSaver passes
    every write through its serializer: a node's route and the answer to an interrupt are stored
    encrypted, never as plain text, and the graph resumes from them."""
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    class Plan(TypedDict):
        route: str
        answer: str

    builder = StateGraph(Plan)
    builder.add_node("choose", lambda state: {"route": "the secret plan"})
    builder.add_node("ask", lambda state: {"answer": interrupt("Which ending?")})
    builder.add_edge(START, "choose")
    builder.add_edge("choose", "ask")
    builder.add_edge("ask", END)
    config = {"configurable": {"thread_id": "encrypted-writes"}}
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, heartbeat=False,
                            serde=EncryptedSerializer(XorCipher()))
    graph = builder.compile(checkpointer=saver)
    assert graph.invoke({}, config, durability="sync")["__interrupt__"][0].value == "Which ending?"
    assert graph.invoke(Command(resume="the lamp stays lit"), config, durability="sync") == {
        "route": "the secret plan", "answer": "the lamp stays lit"}
    saver.close()
    writes = GraphWrite.objects.filter(thread__thread_id="encrypted-writes")
    assert writes.filter(channel="route").exists() and writes.filter(channel="__resume__").exists()
    assert not writes.filter(scalar__isnull=False).exists()  # every write a blob, through the serializer
    values = [json.loads(v) for v in writes.values_list("value__content", flat=True)]
    assert values and all(v["serde"].endswith("+xor") for v in values)
    for plain in ("the secret plan", "the lamp stays lit"):
        assert not writes.filter(value__content__contains=plain).exists()
    # with LangGraph's own serializer the same route is a scalar in its row
    plain_saver = NovelForgeSaver(url=graph_server.url, token=graph_token, heartbeat=False)
    builder.compile(checkpointer=plain_saver).invoke({}, {"configurable": {"thread_id": "plain-writes"}},
                                                     durability="sync")
    plain_saver.close()
    assert GraphWrite.objects.get(thread__thread_id="plain-writes", channel="route").scalar == '"the secret plan"'


def _run_to_its_end(builder: StateGraph, server: Any, token: str, thread_id: str,
                    mode: str) -> tuple[Any, Recording | AsyncRecording]:
    """The graph run from an empty input with ``invoke`` (``mode`` sync) or ``ainvoke`` (async) on
    a recorded saver holding writes for 600 s, closed at the end (a task whose write came after the
    put took the held ones is sent then): its output, and what the saver sent."""
    wire: Recording | AsyncRecording = Recording() if mode == "sync" else AsyncRecording()
    transport = {"transport": wire} if mode == "sync" else {"async_transport": wire}
    saver = NovelForgeSaver(url=server.url, token=token, hold_seconds=600, heartbeat=False, **transport)
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": thread_id}}
    if mode == "sync":
        try:
            return graph.invoke({}, config, durability="sync"), wire
        finally:
            saver.close()

    async def run() -> Any:
        try:
            return await graph.ainvoke({}, config, durability="sync")
        finally:
            await saver.aclose()
    return asyncio.run(run()), wire


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_superstep_of_more_tasks_than_a_put_carries_is_saved_whole(graph_server, graph_token, mode):
    """A fan-out superstep (100 tasks through ``Send``) holds more tasks' writes than one put may
    carry (64): the put carries 64 and the others are stored on their own first; the graph runs to
    its end on either API and every task's write is stored."""
    class Fan(TypedDict, total=False):
        n: int
        done: Annotated[list[int], operator.add]

    builder = StateGraph(Fan)
    builder.add_node("work", lambda state: {"done": [state["n"]]})
    builder.add_conditional_edges(START, lambda state: [Send("work", {"n": i}) for i in range(100)], ["work"])
    builder.add_edge("work", END)
    out, wire = _run_to_its_end(builder, graph_server, graph_token, f"fan-out-{mode}", mode)
    assert sorted(out["done"]) == list(range(100))
    thread = GraphThread.objects.get(thread_id=f"fan-out-{mode}")
    assert GraphWrite.objects.filter(thread=thread, channel="done").values("task_id").distinct().count() == 100
    calls = [f"{method} {path}" for method, path, _ in wire.sent]
    assert calls.count("POST /graph-threads/writes") == 100 - 64  # the tasks no put carried


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_task_writing_more_than_a_request_holds_is_saved_whole(graph_server, graph_token, mode):
    """A node fanning out to 250 ``Send`` s writes 250 values in one task, more than one request may
    carry for a task (200): its writes go in two parts under the same task, and the graph runs to
    its end with every write stored once."""
    class Fan(TypedDict, total=False):
        n: int
        done: Annotated[list[int], operator.add]

    builder = StateGraph(Fan)
    builder.add_node("plan", lambda state: {})
    builder.add_node("work", lambda state: {"done": [state["n"]]})
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", lambda state: [Send("work", {"n": i}) for i in range(250)], ["work"])
    builder.add_edge("work", END)
    thread_id = f"wide-fan-out-{mode}"
    out, _ = _run_to_its_end(builder, graph_server, graph_token, thread_id, mode)
    assert sorted(out["done"]) == list(range(250))
    thread = GraphThread.objects.get(thread_id=thread_id)
    sends = GraphWrite.objects.filter(thread=thread, channel="__pregel_tasks")
    assert sends.count() == 250 and sends.values("task_id").distinct().count() == 1
    assert sorted(sends.values_list("idx", flat=True)) == list(range(250))
    assert GraphWrite.objects.filter(thread=thread, channel="done").values("task_id").distinct().count() == 250


def test_held_writes_larger_than_a_body_are_carried_in_part(graph_server, graph_token):
    """Held tasks whose writes alone would make the put's body larger than the limit: the put
    carries the latest that fit in half of it, the others are stored on their own first, and the
    put is stored (before, the put was refused 413 and nothing was saved)."""
    wire = Recording()
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, transport=wire, hold_seconds=600,
                            heartbeat=False)
    stored = _input_checkpoint(saver, "wide-writes")
    value = {"same": "value"}  # one blob, named by fingerprint in every write after the first
    for task in range(40):  # 40 tasks × 150 writes × about 100 bytes each: 600 KB of entries
        saver.put_writes(stored, [(f"channel-{i}", value) for i in range(150)], f"task-{task}")
    saver.put(stored, _following_checkpoint(), {"source": "loop", "step": 0}, {"notes": 2})
    thread = GraphThread.objects.get(thread_id="wide-writes")
    assert GraphWrite.objects.filter(thread=thread).count() == 40 * 150
    assert GraphCheckpoint.objects.filter(thread=thread).count() == 2
    calls = wire.paths()
    assert calls.count("POST /graph-threads/checkpoints") == 2
    assert 0 < calls.count("POST /graph-threads/writes") < 40  # the put carried the others
    assert max(size for _, _, size in wire.sent) < saver.max_body_bytes
    saver.close()


def test_long_config_values_past_the_metadata_limit_are_left_out_of_the_checkpoint_metadata(
        graph_server, graph_token, caplog):
    """LangGraph copies every string of a run's ``configurable`` into each checkpoint's metadata: a
    long one (a 20 KB prompt) would make it larger than the server keeps (16 KiB) and every put a
    422. The saver leaves the longest copied values out until it fits, says so once in its log,
    and the graph runs; what LangGraph set itself, and the short values, are kept and filterable."""
    class Count(TypedDict):
        n: int

    builder = StateGraph(Count)
    builder.add_node("add", lambda state: {"n": state["n"] + 1})
    builder.add_edge(START, "add")
    builder.add_edge("add", END)
    from novelforge_client.langgraph import _left_out

    _left_out.cache_clear()  # said once per process: said in this test
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, heartbeat=False)
    config = {"configurable": {"thread_id": "long-config", "prompt": "p" * 20_000, "user": "ada"}}
    with caplog.at_level("WARNING", logger="novelforge_client.langgraph"):
        assert builder.compile(checkpointer=saver).invoke({"n": 1}, config, durability="sync") == {"n": 2}
    stored = GraphCheckpoint.objects.filter(thread__thread_id="long-config")
    assert stored.count() == 3
    for item in stored:
        assert item.metadata["user"] == "ada" and "prompt" not in item.metadata and "step" in item.metadata
    said = [r for r in caplog.records if "['prompt']" in r.getMessage() and "metadata" in r.getMessage()]
    assert len(said) == 1  # once, not on each of the three puts
    found = list(saver.list({"configurable": {"thread_id": "long-config"}}, filter={"user": "ada"}))
    assert len(found) == 3
    saver.close()


def test_a_graph_nested_five_subgraphs_deep_with_descriptive_names_pauses_and_resumes(graph_server, graph_token):
    """LangGraph names a subgraph's namespace after its parents' nodes and task ids (37 characters
    more than the node's name per level): a few levels of names like these pass 200 characters,
    where the server stopped. The deepest subgraph asks, a fresh saver resumes, and every level's
    checkpoints are stored under their own namespace."""
    class Notes(TypedDict):
        notes: Annotated[list[str], operator.add]

    def level(depth: int):
        builder = StateGraph(Notes)
        if depth == 0:
            builder.add_node("ask_the_editor_which_ending_to_keep",
                             lambda state: {"notes": [interrupt("Which ending?")]})
            builder.add_edge(START, "ask_the_editor_which_ending_to_keep")
            builder.add_edge("ask_the_editor_which_ending_to_keep", END)
        else:
            name = f"chapter_review_assistant_level_{depth}"
            builder.add_node(name, level(depth - 1))
            builder.add_edge(START, name)
            builder.add_edge(name, END)
        return builder.compile()

    config = {"configurable": {"thread_id": "four-deep"}}
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, heartbeat=False)
    builder = StateGraph(Notes)
    builder.add_node("plan_the_novel_outline", level(4))
    builder.add_edge(START, "plan_the_novel_outline")
    builder.add_edge("plan_the_novel_outline", END)
    asked = builder.compile(checkpointer=saver).invoke({"notes": []}, config, durability="sync")
    assert asked["__interrupt__"][0].value == "Which ending?"
    saver.close()
    namespaces = set(GraphCheckpoint.objects.filter(thread__thread_id="four-deep")
                     .values_list("checkpoint_ns", flat=True))
    assert len(namespaces) == 6 and max(map(len, namespaces)) > 200  # the graph and its five subgraphs

    fresh = NovelForgeSaver(url=graph_server.url, token=graph_token, heartbeat=False)
    graph = builder.compile(checkpointer=fresh)
    assert graph.invoke(Command(resume="the lamp stays lit"), config, durability="sync") == {
        "notes": ["the lamp stays lit"]}
    deepest = graph.get_state(config, subgraphs=True)
    assert deepest.values == {"notes": ["the lamp stays lit"]} and not deepest.next
    fresh.close()


def test_a_refused_put_still_stores_the_writes_it_carried(graph_server, graph_token):
    """The put carrying held writes is refused (the thread's run ended): the writes are sent on
    their own (stored, as they would have been without holding), and the put's refusal stands."""
    wire = Recording()
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, transport=wire, hold_seconds=600)
    stored = _input_checkpoint(saver, "refused")
    saver.put_writes(stored, [("notes", "kept")], "task-1")
    thread = _end_the_open_run(graph_server, graph_token, "refused")
    with pytest.raises(Conflict) as refused:
        saver.put(stored, _following_checkpoint(), {"source": "loop", "step": 0}, {"notes": 2})
    assert refused.value.code == "no_open_run"
    assert wire.paths()[-2:] == ["POST /graph-threads/checkpoints", "POST /graph-threads/writes"]
    assert GraphWrite.objects.filter(thread=thread, task_id="task-1").count() == 1
    saver.close()


def test_the_async_saver_uploads_a_large_value_in_chunks_and_reads_it_back(graph_server, graph_token):
    from langgraph.checkpoint.base import empty_checkpoint

    wire = AsyncRecording()
    # hold_seconds: the held write waits for the read however slow this machine is
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, async_transport=wire, hold_seconds=600)
    large = os.urandom(400 * 1024).hex()  # 800 KiB of text: several chunks
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"], checkpoint["channel_versions"] = {"draft": large}, {"draft": 1}
    config = {"configurable": {"thread_id": "async-large", "checkpoint_ns": ""}}

    async def roundtrip() -> Any:
        stored = await saver.aput(config, checkpoint, {"source": "input", "step": -1}, {"draft": 1})
        await saver.aput_writes(stored, [("draft", large)], "task-1")  # held; then sent before the read, named
        found = await saver.aget_tuple(stored)
        await saver.aclose()
        return found

    found = asyncio.run(roundtrip())
    assert found.checkpoint["channel_values"] == {"draft": large}
    assert found.pending_writes == [("task-1", "draft", large)]
    calls = [f"{m} {p}" for m, p, _ in wire.sent]
    assert calls[0] == "POST /graph-blobs/missing" and calls.count("POST /graph-blobs") >= 4
    assert calls[-3:] == ["POST /graph-threads/checkpoints", "POST /graph-threads/writes", "GET /graph-threads/checkpoints"]
    assert max(size for _, p, size in wire.sent if p.startswith("/graph-threads")) < 16 * 1024  # named, never inline
    fingerprint = GraphCheckpoint.objects.get(thread__thread_id="async-large").document["blobs"]["draft"]
    assert Artifact.objects.filter(name="blob:" + fingerprint).count() == 1


def test_an_async_graph_s_superstep_costs_one_request_too(graph_server, graph_token):
    """``ainvoke`` as ``invoke``: each task's writes are held by ``aput_writes`` and ride in the
    body of the ``aput`` that follows (one request per superstep), and every write is stored."""

    class Count(TypedDict):
        count: int

    steps = 5
    builder = StateGraph(Count)
    builder.add_node("count", lambda s: {"count": s["count"] + 1})
    builder.add_edge(START, "count")
    builder.add_conditional_edges("count", lambda s: "count" if s["count"] < steps else END, ["count", END])
    wire = AsyncRecording()
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, async_transport=wire, hold_seconds=600,
                            heartbeat=False)
    graph = builder.compile(checkpointer=saver)

    async def run() -> Any:
        out = await graph.ainvoke({"count": 0}, {"configurable": {"thread_id": "async-count"}}, durability="sync")
        await saver.aclose()
        return out

    assert asyncio.run(run())["count"] == steps
    calls = [f"{m} {p}" for m, p, _ in wire.sent]
    # the input's checkpoint, then each superstep's one checkpoint carrying its task's writes; one read first
    supersteps = steps + 1  # the input's, then `count` until it reaches `steps`
    assert calls.count("POST /graph-threads/checkpoints") == supersteps + 1
    assert calls.count("POST /graph-threads/writes") == 0 and len(calls) == supersteps + 2, calls
    assert GraphWrite.objects.filter(thread__thread_id="async-count").values("task_id").distinct().count() == supersteps


def test_the_async_saver_sends_held_writes_before_a_read_on_close_and_when_no_put_comes(graph_server, graph_token):
    """What ``aput_writes`` holds goes out on its own before the next read, on ``aclose``, or once
    ``hold_seconds`` have passed without a put; and a refused put's carried writes are stored on
    their own. (Each step its own ``asyncio.run``: the database is read between them, in this thread.)"""
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, hold_seconds=600, heartbeat=False)
    stored = _input_checkpoint(saver, "async-held")

    def held(task_id: str) -> bool:
        return not GraphWrite.objects.filter(thread__thread_id="async-held", task_id=task_id).exists()

    asyncio.run(saver.aput_writes(stored, [("notes", "read right after")], "task-1"))
    assert held("task-1")
    found = asyncio.run(saver.aget_tuple(stored))  # the read sends what is held first
    assert ("task-1", "notes", "read right after") in found.pending_writes and not held("task-1")

    brief = NovelForgeSaver(url=graph_server.url, token=graph_token, hold_seconds=0.2, heartbeat=False)
    asyncio.run(brief.aput_writes(stored, [("notes", "no put came")], "task-2"))
    wait_until(lambda: not held("task-2"), "the held write sent on its own", timeout=20)
    brief.close()

    asyncio.run(saver.aput_writes(stored, [("notes", "carried by a refused put")], "task-3"))
    _end_the_open_run(graph_server, graph_token, "async-held")
    with pytest.raises(Conflict) as refused:
        asyncio.run(saver.aput(stored, _following_checkpoint(), {"source": "loop", "step": 0}, {"notes": 2}))
    assert refused.value.code == "no_open_run" and not held("task-3")

    asyncio.run(saver.aput_writes(stored, [("notes", "closed right after")], "task-4"))
    assert held("task-4")
    asyncio.run(saver.aclose())  # and close sends it
    assert not held("task-4")


def test_a_server_with_a_smaller_body_limit_teaches_the_saver_its_limit(graph_token):
    """The saver plans for the default body limit; a server configured lower refuses the first
    oversized request with 413 naming its limit, and the saver plans with that limit from then on."""
    from langgraph.checkpoint.base import empty_checkpoint

    small = DaphneServer(extra_env={"API_MAX_BODY_BYTES": "65536"})
    try:
        wire = Recording()
        saver = NovelForgeSaver(url=small.url, token=graph_token, transport=wire)
        value = os.urandom(60 * 1024).hex()  # 120 KiB: inline under the default limit, not under 64 KiB
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"], checkpoint["channel_versions"] = {"draft": value}, {"draft": 1}
        config = {"configurable": {"thread_id": "small-limit", "checkpoint_ns": ""}}
        stored = saver.put(config, checkpoint, {"source": "input", "step": -1}, {"draft": 1})
        assert saver.max_body_bytes == 65536
        assert wire.paths()[0] == "POST /graph-threads/checkpoints"  # refused: 413
        assert "POST /graph-blobs" in wire.paths()[1:]  # then uploaded in chunks under the limit
        assert saver.get_tuple(stored).checkpoint["channel_values"] == {"draft": value}
        saver.close()
    finally:
        small.stop()


def test_held_writes_that_cannot_be_sent_are_held_again_and_sent_later(graph_server, graph_token):
    """The server is unreachable when held writes go out (a read here): the read fails, the writes
    stay held, and the next read sends them."""
    saver = NovelForgeSaver(url=graph_server.url, token=graph_token, hold_seconds=600)
    stored = _input_checkpoint(saver, "unreachable")
    saver.put_writes(stored, [("notes", "kept while the server is away")], "task-1")
    away = NovelForgeSaver(url="http://127.0.0.1:9", token=graph_token, hold_seconds=600)  # nothing listens on port 9
    away._held, saver._held = saver._held, {}  # the same held writes, on a saver whose server is away
    with pytest.raises(Exception):
        away.get_tuple(stored)
    assert [h.task_id for items in away._held.values() for h in items] == ["task-1"]  # held again
    saver._held, away._held = away._held, {}
    found = saver.get_tuple(stored)
    assert ("task-1", "notes", "kept while the server is away") in found.pending_writes
    away.close()
    saver.close()
