"""The LangGraph checkpointer keeps the runtimes it holds alive, and says when one is lost; and a
thread opened to open review gates opens them (real daphne + PostgreSQL, real processes).

* The saver heartbeats every runtime it holds (one background thread, every third of the lease):
  a graph running three leases long with no heartbeat of its own keeps its runtime; a closed
  saver, or a killed process, stops beating and the reconciler marks the session
  ``failed / runtime_lost`` once the lease runs out.
* A lost runtime (the heartbeat refused) is raised as ``LeaseLost`` by the thread's next put,
  write or read, from inside the graph run too, until the thread is resumed.
* A manager's abort, learned from a heartbeat, ends the thread's run ``aborted`` and is raised as
  ``RunAborted`` by its next put or write (not sent), until the thread is released and resumed.
* ``ThreadSpec(opens_gates=True)`` opens the thread as a writer: ``review_gate`` opens its gate;
  the default thread (a specialist) is refused ``forbidden``, and no gate or wait is written.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, TypedDict

import httpx
import pytest
from django.utils import timezone
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph

from novelforge_client.errors import Forbidden, LeaseLost, RuntimeNotLive
from novelforge_client.langgraph import NovelForgeSaver, ThreadSpec, review_gate
from novelforge_sessions.actions.runtimes import RUNTIME_LOST, reconcile_expired_runtimes
from novelforge_sessions.control.models import GraphCheckpoint, GraphThread
from novelforge_sessions.models import Checkpoint, RuntimeAttachment, Session
from reviews.models import ReviewGate
from tests.reviews.factories import CHAPTER, RUBRIC, agent_reviewer
from tests.support.servers import ROOT
from tests.support.waits import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

#: The threads' lease: short, so that a run three leases long takes seconds (the server allows 1 s;
#: 2 s leaves a heartbeat 1.3 s of slack on a busy machine).
LEASE = 2



@pytest.fixture
def saver_for(graph_server, graph_token) -> Iterator[Any]:
    """Savers on the test's server, each closed at the end (its heartbeat thread stopped) even if
    the test failed first: no test leaves a thread beating."""
    made: list[NovelForgeSaver] = []

    def make(**kwargs: Any) -> NovelForgeSaver:
        made.append(NovelForgeSaver(url=graph_server.url, token=graph_token, **kwargs))
        return made[-1]

    yield make
    for saver in made:
        saver.close()
        assert saver._beater is None or not saver._beater.is_alive()


class Count(TypedDict, total=False):
    n: int


def _runtime(thread_id: str) -> RuntimeAttachment:
    return RuntimeAttachment.objects.get(session__graph_thread__thread_id=thread_id)


def _open(saver: NovelForgeSaver, thread_id: str) -> dict[str, Any]:
    """The thread's input checkpoint: opens its session (runtime generation 1), held by the saver."""
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"], checkpoint["channel_versions"] = {"n": 0}, {"n": 1}
    return saver.put({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}, checkpoint,
                     {"source": "input", "step": -1}, {"n": 1})


def _invoke_in_background(graph: Any, config: dict[str, Any], **kwargs: Any
                          ) -> tuple[threading.Thread, list[BaseException]]:
    """``graph.invoke({"n": 0}, config)`` on a thread of its own (started); what it raises is
    collected in the list (the test's subject)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            graph.invoke({"n": 0}, config, **kwargs)
        except BaseException as exc:  # noqa: BLE001 — what the graph raised is the test's subject
            raised.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    return runner, raised


def _expire(thread_id: str) -> None:
    """The runtime's lease runs out (in the database) and the reconciler marks it lost."""
    runtime = _runtime(thread_id)
    RuntimeAttachment.objects.filter(id=runtime.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert runtime.id in {r.runtime_id for r in reconcile_expired_runtimes()}


# ---- the background heartbeat ---------------------------------------------------------------------------
def test_a_graph_running_three_leases_long_keeps_its_runtime_without_a_heartbeat_of_its_own(saver_for):
    """Three steps, each lasting until the saver beat three more times (a lease): the run takes
    three leases, the runtime stays live and the reconciler finds nothing to mark; once the
    saver is closed nothing beats, and the lease runs out into ``failed / runtime_lost``."""
    saver = saver_for(thread_spec=ThreadSpec(lease_seconds=LEASE))
    thread_id = "three-leases"

    def step(state: Count) -> Count:
        n = state["n"] + 1
        wait_until(lambda: saver.beats(thread_id) >= 3 * n, f"lease {n} renewed by the saver", timeout=10 * LEASE)
        return {"n": n}

    builder = StateGraph(Count)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: "step" if s["n"] < 3 else END, ["step", END])
    started = time.monotonic()
    out = builder.compile(checkpointer=saver).invoke({"n": 0}, {"configurable": {"thread_id": thread_id}})
    elapsed = time.monotonic() - started
    assert out["n"] == 3 and elapsed >= 3 * LEASE  # beats a third of a lease apart: nine take three leases

    runtime = _runtime(thread_id)
    assert runtime.generation == 1 and runtime.state == "live" and runtime.lease_seconds == LEASE
    assert runtime.lease_expires_at > timezone.now()
    assert runtime.heartbeat_at - runtime.attached_at >= timedelta(seconds=2 * LEASE)  # renewed to the end
    assert runtime.id not in {r.runtime_id for r in reconcile_expired_runtimes()}
    session = runtime.session
    session.refresh_from_db()
    assert session.status == "running" and saver.runtimes[thread_id] == runtime.id

    saver.close()  # stops the heartbeat thread: nothing renews the lease any more
    assert saver._beater is not None and not saver._beater.is_alive()
    runtime.refresh_from_db()
    last = runtime.lease_expires_at
    wait_until(lambda: timezone.now() > last, "the last lease to run out", timeout=3 * LEASE)
    runtime.refresh_from_db()
    assert runtime.lease_expires_at == last  # no beat after close
    assert runtime.id in {r.runtime_id for r in reconcile_expired_runtimes()}
    session.refresh_from_db()
    assert (session.status, session.status_reason) == ("failed", RUNTIME_LOST)


GRAPH_PROCESS = """
import sys, threading
from typing import TypedDict
from langgraph.graph import END, START, StateGraph
from novelforge_client.langgraph import NovelForgeSaver, ThreadSpec

class Count(TypedDict, total=False):
    n: int

def work(state):
    threading.Event().wait()  # a step that never ends: the process is killed in it
    return {"n": 1}

saver = NovelForgeSaver(thread_spec=ThreadSpec(lease_seconds=int(sys.argv[2])))
builder = StateGraph(Count)
builder.add_node("work", work)
builder.add_edge(START, "work")
builder.add_edge("work", END)
builder.compile(checkpointer=saver).invoke({"n": 0}, {"configurable": {"thread_id": sys.argv[1]}})
"""


def test_a_killed_graph_process_stops_beating_and_its_session_fails_runtime_lost_within_a_lease(
        graph_server, graph_token, tmp_path):
    script = tmp_path / "graph_process.py"
    script.write_text(textwrap.dedent(GRAPH_PROCESS))
    env = {**os.environ, "NOVELFORGE_URL": graph_server.url, "NOVELFORGE_TOKEN": graph_token, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), "killed", str(LEASE)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def exited() -> str | None:
            return f"the graph process exited {proc.returncode}: {proc.stderr.read()[-2000:]}" \
                if proc.poll() is not None else None

        opened = wait_until(lambda: RuntimeAttachment.objects.filter(session__graph_thread__thread_id="killed").first(),
                            "the graph process to open its thread", timeout=60, fail=exited)
        # The process's saver is beating: the lease moves forward, twice.
        first = opened.lease_expires_at
        wait_until(lambda: _runtime("killed").lease_expires_at > first, "a first heartbeat", timeout=5 * LEASE,
                   fail=exited)
        second = _runtime("killed").lease_expires_at
        wait_until(lambda: _runtime("killed").lease_expires_at > second, "a second heartbeat", timeout=5 * LEASE,
                   fail=exited)
        assert _runtime("killed").state == "live"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    killed_at = timezone.now()
    assert proc.returncode == -signal.SIGKILL

    runtime = _runtime("killed")
    assert runtime.lease_expires_at <= killed_at + timedelta(seconds=LEASE)  # at most a lease left
    wait_until(lambda: timezone.now() > runtime.lease_expires_at, "the lease to run out", timeout=3 * LEASE)
    assert _runtime("killed").lease_expires_at == runtime.lease_expires_at  # nothing beat since the kill
    assert runtime.id in {r.runtime_id for r in reconcile_expired_runtimes()}
    session = Session.objects.get(graph_thread__thread_id="killed")
    assert (session.status, session.status_reason) == ("failed", RUNTIME_LOST)
    assert _runtime("killed").state != "live"


def test_a_lost_runtime_is_raised_as_lease_lost_by_the_next_saver_call_until_the_thread_is_resumed(saver_for, caplog):
    saver = saver_for(thread_spec=ThreadSpec(lease_seconds=LEASE))
    thread_id = "lost-midway"
    config = {"configurable": {"thread_id": thread_id}}

    def step(state: Count) -> Count:  # lasts until the saver learned its runtime is gone
        wait_until(lambda: saver.lease_lost(thread_id), "the saver to learn the runtime is lost", timeout=10 * LEASE)
        return {"n": state["n"] + 1}

    builder = StateGraph(Count)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    graph = builder.compile(checkpointer=saver)
    caplog.set_level(logging.WARNING, logger="novelforge_client.langgraph")
    runner, raised = _invoke_in_background(graph, config)
    try:
        wait_until(lambda: saver.beats(thread_id) >= 1, "the saver to beat the thread's runtime", timeout=10 * LEASE)
        runtime = _runtime(thread_id)
        stored = GraphCheckpoint.objects.filter(thread__thread_id=thread_id).count()
        _expire(thread_id)  # the session fails runtime_lost under the running graph
    finally:
        runner.join(30)
    assert not runner.is_alive()

    [exc] = raised
    assert isinstance(exc, LeaseLost), repr(exc)
    assert (exc.thread_id, exc.runtime_id, exc.details["cause"]) == (thread_id, runtime.id, "runtime_not_live")
    assert isinstance(exc.__cause__, RuntimeNotLive)
    assert GraphCheckpoint.objects.filter(thread__thread_id=thread_id).count() == stored  # the step's put was not sent
    assert any(r.levelno == logging.WARNING and "LeaseLost" in r.getMessage() and str(runtime.id) in r.getMessage()
               for r in caplog.records)
    # Every next call on the thread raises it too, before sending anything.
    with pytest.raises(LeaseLost):
        saver.get_tuple(config)
    with pytest.raises(LeaseLost):
        saver.put_writes({"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": "x"}},
                         [("n", 5)], "task-1")
    assert thread_id not in saver.runtimes and saver.beats(thread_id) == 0  # no longer beaten

    # Resuming the thread (generation 2) holds its new runtime: beaten, and the calls go through.
    report = saver.resume(thread_id)
    assert report["ok"] and report["generation"] == 2
    assert saver.lease_lost(thread_id) is None and saver.runtimes[thread_id] == report["runtime_id"]
    wait_until(lambda: saver.beats(thread_id) >= 1, "the resumed runtime to be beaten", timeout=10 * LEASE)
    assert saver.get_tuple(config).checkpoint["channel_values"]["n"] == 0
    saver.close()
    assert not saver._beater.is_alive()


def test_the_async_saver_is_beaten_and_raises_lease_lost_and_a_deleted_thread_is_let_go(saver_for):
    saver = saver_for(thread_spec=ThreadSpec(lease_seconds=LEASE))
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"], checkpoint["channel_versions"] = {"n": 0}, {"n": 1}

    async def open_thread(thread_id: str) -> Any:
        return await saver.aput({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}, checkpoint,
                                {"source": "input", "step": -1}, {"n": 1})

    lost, deleted = asyncio.run(open_thread("async-lost")), asyncio.run(open_thread("async-deleted"))
    wait_until(lambda: saver.beats("async-lost") >= 2 and saver.beats("async-deleted") >= 2,
               "both async threads beaten", timeout=10 * LEASE)
    asyncio.run(saver.adelete_thread("async-deleted"))  # let go: no more beats, nothing lost
    _expire("async-lost")
    wait_until(lambda: saver.lease_lost("async-lost"), "the loss to be seen", timeout=10 * LEASE)
    assert saver.lease_lost("async-deleted") is None and set(saver.runtimes) == set()

    async def calls() -> list[type]:
        raised = []
        for call in (saver.aget_tuple(lost), saver.aput_writes(lost, [("n", 1)], "task-1"),
                     saver.aput(lost, checkpoint, {"source": "loop", "step": 0}, {})):
            with pytest.raises(LeaseLost) as info:
                await call
            raised.append(type(info.value.__cause__))
        await saver.aclose()
        return raised

    assert asyncio.run(calls()) == [RuntimeNotLive] * 3
    assert not saver._beater.is_alive()


def test_without_heartbeat_the_saver_starts_no_thread(saver_for):
    saver = saver_for(thread_spec=ThreadSpec(lease_seconds=LEASE), heartbeat=False)
    _open(saver, "unbeaten")
    assert saver.runtimes["unbeaten"] == _runtime("unbeaten").id
    assert saver._beater is None and saver.beats("unbeaten") == 0
    before = _runtime("unbeaten").heartbeat_at
    beat = saver.heartbeat("unbeaten")  # by hand, at the thread's own lease (not the server's default)
    runtime = _runtime("unbeaten")
    assert beat["runtime_id"] == runtime.id and runtime.heartbeat_at > before
    assert runtime.lease_expires_at - runtime.heartbeat_at == timedelta(seconds=LEASE)
    saver.close()


# ---- a thread that opens review gates --------------------------------------------------------------------
class Draft(TypedDict, total=False):
    verdict: dict


def _gate_graph(saver: NovelForgeSaver, candidate_version_id: int, reviewer_session_id: int):
    def review(state: Draft) -> Draft:
        return {"verdict": review_gate(candidate_version_id=candidate_version_id, rubric=RUBRIC, route="agent",
                                       reviewer_session_ids=[reviewer_session_id])}

    builder = StateGraph(Draft)
    builder.add_node("review", review)
    builder.add_edge(START, "review")
    builder.add_edge("review", END)
    return builder.compile(checkpointer=saver)


def test_a_thread_opened_to_open_gates_opens_one_and_the_default_thread_is_refused(graph_server, graph_token, saver_for, project):
    with httpx.Client(base_url=graph_server.url + "/api/v1", headers={"Authorization": f"Bearer {graph_token}"}) as api:
        candidate = api.post("/artifacts", json={"name": "chapter-9", "content": CHAPTER}).json()
    reviewer_session, _ = agent_reviewer(project)

    # The default graph thread is a specialist: its gate is refused, typed, and nothing is written.
    plain = saver_for()
    with pytest.raises(Forbidden) as refused:
        _gate_graph(plain, candidate["current_version_id"], reviewer_session.id).invoke(
            {}, {"configurable": {"thread_id": "no-gates"}})
    assert refused.value.status == 403 and refused.value.details["role"] == "specialist"
    session = Session.objects.get(graph_thread__thread_id="no-gates")
    assert session.role == "specialist" and session.status == "running"  # no wait recorded
    assert not ReviewGate.objects.filter(session=session).exists()
    assert not Checkpoint.objects.filter(session=session, boundary__in=["user_wait", "external_wait"]).exists()
    plain.close()

    # opens_gates: the thread is a writer, and the same graph pauses on its gate.
    gates = saver_for(thread_spec=ThreadSpec(opens_gates=True))
    paused = _gate_graph(gates, candidate["current_version_id"], reviewer_session.id).invoke(
        {}, {"configurable": {"thread_id": "gates"}})
    assert "__interrupt__" in paused
    session = Session.objects.get(graph_thread__thread_id="gates")
    assert session.role == "writer" and session.status == "awaiting_external"
    [gate] = ReviewGate.objects.filter(session=session)
    assert gate.state == "pending" and gate.candidate_id == candidate["current_version_id"]
    assert [g["id"] for g in gates.pending_gates("gates")] == [gate.id]
    gates.close()
    assert GraphThread.objects.filter(thread_id__in=["gates", "no-gates"]).count() == 2


def test_the_gate_option_chooses_a_gate_opening_role():
    assert ThreadSpec().role == "specialist"
    assert ThreadSpec(opens_gates=True).role == "writer"
    assert ThreadSpec(role="manager", opens_gates=True).role == "manager"
    assert ThreadSpec(role="writer").role == "writer"  # a writer opens gates with or without the option
    with pytest.raises(ValueError, match="writer or manager"):
        ThreadSpec(role="specialist", opens_gates=True)
    body = ThreadSpec(opens_gates=True, lease_seconds=LEASE).open_body()
    assert body["role"] == "writer" and body["lease_seconds"] == LEASE and "opens_gates" not in body


# ---- a manager's abort ----------------------------------------------------------------------------------
def test_a_run_a_manager_aborts_is_ended_aborted_and_raised_as_run_aborted_then_the_thread_resumes(
        saver_for, graph_server, graph_token, caplog):
    """The dashboard's (or the API's) abort flags the thread's open run; the saver's heartbeat learns
    it, and the running graph's next put is not sent: the run is ended ``aborted`` (the session
    idle, its runtime still live) and ``RunAborted`` raised out of ``graph.invoke``. Released and
    resumed, the thread goes on from its last checkpoint in generation 2."""
    from novelforge_client import Client
    from novelforge_client.errors import RunAborted
    from novelforge_sessions.models import Run, Session

    saver = saver_for(thread_spec=ThreadSpec(lease_seconds=LEASE))
    thread_id = "aborted-midway"
    config = {"configurable": {"thread_id": thread_id}}
    steps_run: list[int] = []

    def step(state: Count) -> Count:  # the first step lasts until the saver learned of the abort
        steps_run.append(state["n"])
        if len(steps_run) == 1:
            wait_until(lambda: saver.abort_requested(thread_id), "the saver to learn of the abort", timeout=10 * LEASE)
        return {"n": state["n"] + 1}

    builder = StateGraph(Count)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: "step" if s["n"] < 3 else END, ["step", END])
    graph = builder.compile(checkpointer=saver)
    caplog.set_level(logging.WARNING, logger="novelforge_client.langgraph")
    runner, raised = _invoke_in_background(graph, config, durability="sync")  # each step waits for its put
    try:
        wait_until(lambda: steps_run, "the graph's first step to run", timeout=10 * LEASE)
        session = Session.objects.get(graph_thread__thread_id=thread_id)
        run_id = Run.objects.get(session=session, state="open").id
        stored = GraphCheckpoint.objects.filter(thread__thread_id=thread_id).count()
        with Client(graph_server.url, graph_token) as nf:
            nf.abort(session.id, "stop the chapter")
    finally:
        runner.join(30)
    assert not runner.is_alive()

    [exc] = raised
    assert isinstance(exc, RunAborted), repr(exc)
    assert (exc.thread_id, exc.run_id) == (thread_id, run_id)
    assert steps_run == [0]  # the graph stopped at the step's put
    assert GraphCheckpoint.objects.filter(thread__thread_id=thread_id).count() == stored  # the put was not sent
    ended = Run.objects.get(id=run_id)
    assert ended.state == "aborted"
    session.refresh_from_db()
    assert session.status == "idle"
    assert _runtime(thread_id).state == "live" and saver.runtimes[thread_id] == _runtime(thread_id).id
    assert saver.abort_requested(thread_id)
    with pytest.raises(RunAborted):  # every next put or write too, until the thread is resumed
        saver.put_writes({"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": "x"}},
                         [("n", 5)], "task-1")
    assert Run.objects.get(id=run_id).state == "aborted" and Run.objects.filter(session=session).count() == 1
    assert any("RunAborted" in r.getMessage() and str(run_id) in r.getMessage() for r in caplog.records)

    # Released and resumed (generation 2, a new run), the graph goes on from its last checkpoint.
    saver.release(thread_id)
    report = saver.resume(thread_id)
    assert report["ok"] and report["generation"] == 2
    out = graph.invoke(None, config, durability="sync")
    assert out["n"] == 3 and steps_run == [0, 0, 1, 2]
    assert Run.objects.filter(session=session).count() == 2
    assert not saver.abort_requested(thread_id)
