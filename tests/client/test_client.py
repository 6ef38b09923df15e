"""The typed client against a real daphne server and PostgreSQL: every operation, sync and async.

``test_every_operation`` walks a whole project through the sync client (sessions, runtimes, runs,
checkpoints, handoffs, results, write intents, bindings, routing, review gates and packets,
resume) and then checks that it called every public operation of the client; the async test
drives the same core through :class:`AsyncClient`.
"""
from __future__ import annotations

import asyncio
import inspect

import pytest

from novelforge_client import AsyncClient, Client
from novelforge_client import errors as E
from novelforge_client import models as m
from novelforge_client.client import _Operations
from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.control.models import Handoff
from novelforge_sessions.models import Checkpoint, RuntimeAttachment

from tests.reviews.factories import RUBRIC, agent_reviewer

pytestmark = pytest.mark.django_db(transaction=True)

OPERATIONS = {
    name for name, fn in inspect.getmembers(_Operations, inspect.isfunction) if not name.startswith("_")
} | {"sessions", "transcript", "runtimes", "runs", "checkpoints", "events", "handoffs", "deliveries", "receipts",
     "write_intents", "review_gates", "review_packets", "artifacts", "wait_for_verdict", "runtime", "keep_alive"}


class Recording(Client):
    """Records which public operations a test called (to prove every one was exercised)."""

    called: set[str] = set()

    def __getattribute__(self, name: str):
        if name in OPERATIONS:
            Recording.called.add(name)
        return super().__getattribute__(name)


WRITER = dict(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli")


def test_every_operation(server, project, token, worker_token):
    _, manager_raw = create_token(project, name="manager", permissions=["read", "write", "approve", "project"])
    nf, worker, manager = Recording(server.url, token), Recording(server.url, worker_token), Recording(server.url, manager_raw)

    assert nf.project().id == project.id
    art = nf.create_artifact("chapter-1", "The lamp had not failed in forty years.\n", kind="chapter")
    v2 = nf.add_version(art.id, "The lamp had not failed in forty years.\nTonight it flickered.\n")
    assert nf.artifact(art.id).name == "chapter-1"
    assert "flickered" in nf.artifact_version(v2.id).content
    assert [a.id for a in nf.artifacts()] == [art.id] == [a.id for a in nf.list_artifacts().items]

    # a session created with its runtime: the answer carries the runtime id to heartbeat
    s = nf.create_session(**WRITER, runtime=m.RuntimeIn(runtime_family="cli", capabilities=["draft"], lease_seconds=300))
    assert isinstance(s, m.SessionCreatedOut) and s.runtime_id is not None and nf.runtime_for(s.id) == s.runtime_id
    assert [x.id for x in nf.sessions()] == [s.id] == [x.id for x in nf.list_sessions(role="writer").items]
    assert nf.list_sessions(role="manager").items == []
    assert nf.session(s.id).status == "created"
    beat = nf.heartbeat(s.runtime_id, lease_seconds=300)
    assert (beat.runtime_id, beat.session_id, beat.abort_requested) == (s.runtime_id, s.id, False)
    assert nf.get_runtime(s.runtime_id).live and [r.id for r in nf.runtimes(s.id)] == [s.runtime_id]
    assert nf.list_runtimes(s.id).items[0].lease_seconds == 300

    run = nf.start_run(s.id, cursor={"step": "outline"}, target="chapter-1")
    assert nf.session(s.id).status == "running" and nf.run(run.id).target == "chapter-1"
    assert nf.advance(run.id, {"step": "draft"}).cursor == {"step": "draft"}
    assert [r.id for r in nf.runs(s.id)] == [run.id] == [r.id for r in nf.list_runs(s.id).items]
    entry = nf.append_transcript(s.id, "assistant", "drafting now")
    assert [t.seq for t in nf.transcript(s.id)] == [entry.seq] == [t.seq for t in nf.list_transcript(s.id).items]
    cp = nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": "draft"},
                       artifacts=[m.ArtifactRefIn(artifact_id=art.id, fingerprint=v2.fingerprint)])
    assert nf.get_checkpoint(cp.id).seq == 1 == cp.seq
    assert [c.id for c in nf.checkpoints(run.id)] == [cp.id] == [c.id for c in nf.list_checkpoints(run.id).items]
    steps = nf.batch(run.id, [{"kind": "checkpoint", "checkpoint": {"boundary": "context_freeze", "cursor": {"step": "draft"}}},
                              {"kind": "cursor", "cursor": {"step": "draft"}}])
    assert steps.checkpoint_count == 2 and [i.kind for i in steps.items] == ["checkpoint", "cursor"]

    # handoff → claim → renew → deliver (at least once) → receipt
    job = nf.hand_off(run.id, "continuity-1", required_capabilities=["continuity"], timeout_seconds=60,
                      inputs=[{"artifact_id": art.id, "fingerprint": v2.fingerprint}], params={"check": "names"})
    assert nf.session(s.id).status == "awaiting_external"
    assert nf.hand_off(run.id, "continuity-1", required_capabilities=["continuity"], timeout_seconds=60,
                       inputs=[{"artifact_id": art.id, "fingerprint": v2.fingerprint}], params={"check": "names"}).id == job.id
    assert worker.claim("w1", ["draft"]) is None
    lease = worker.claim("w1", ["continuity"])
    assert lease is not None and lease.id == job.id and lease.attempt == 1
    assert worker.renew_lease(lease.id, lease.fencing_token).fencing_token == lease.fencing_token
    first = worker.deliver(lease.id, fencing_token=lease.fencing_token, job_fingerprint=job.job_fingerprint,
                           result={"ok": True})
    again = worker.deliver(lease.id, fencing_token=lease.fencing_token, job_fingerprint=job.job_fingerprint,
                           result={"ok": True})
    assert (first.outcome, again.outcome) == ("consumed", "already_consumed") and first.receipt == again.receipt
    assert nf.handoff(job.id).state == first.handoff_state
    assert [h.id for h in nf.handoffs(session_id=s.id)] == [job.id] == [h.id for h in nf.list_handoffs(logical_id="continuity-1").items]
    assert len(list(nf.deliveries(job.id))) == 2 == len(nf.list_deliveries(job.id).items)
    assert [r.logical_id for r in nf.receipts()] == ["continuity-1"] == [r.logical_id for r in nf.list_receipts().items]
    assert nf.session(s.id).status == "running"

    # a second job, cancelled
    other = nf.hand_off(run.id, "continuity-2", required_capabilities=["continuity"])
    assert nf.cancel_handoff(other.id, "not needed").state == "cancelled"

    # routing, write intents, bindings, authority
    assert [r.runtime_id for r in nf.runtimes_for("draft")] == [s.runtime_id]
    assert nf.runtimes_for(["draft", "nothing"]) == []
    before = nf.before_state("artifact.make_current", artifact_id=art.id)
    intent = nf.propose_write("artifact.make_current", idempotency_key="promote-v2", before_fingerprint=before.before_fingerprint,
                              params={"version_id": v2.id}, artifact_id=art.id, session_id=s.id)
    replay = nf.propose_write("artifact.make_current", idempotency_key="promote-v2", before_fingerprint=before.before_fingerprint,
                              params={"version_id": v2.id}, artifact_id=art.id, session_id=s.id)
    assert replay.id == intent.id and replay.replayed and not intent.replayed
    assert [i.id for i in nf.write_intents(session_id=s.id)] == [intent.id] == [i.id for i in nf.list_write_intents().items]
    with pytest.raises(E.Forbidden):
        nf.approve(intent.id)  # the agent token may not approve
    assert manager.approve(intent.id, "fine").approval is not None
    assert manager.revoke_approval(intent.id, "wait").approval is None
    manager.approve(intent.id)
    done = nf.execute(intent.id)
    assert done.state == "executed" and nf.execute(intent.id).replayed and nf.write_intent(intent.id).state == "executed"
    other_intent = nf.propose_write("artifact.make_current", idempotency_key="promote-again",
                                    before_fingerprint=nf.before_state("artifact.make_current", artifact_id=art.id).before_fingerprint,
                                    params={"version_id": v2.id}, artifact_id=art.id)
    assert manager.reject(other_intent.id, "no").state == "rejected"
    assert manager.authority_changes().items == []  # making a version current is not an authority change
    assert isinstance(manager.invalidated_bindings(), list)
    assert isinstance(manager.mark_stale([]), m.MarkStaleOut)

    # a review gate on the agent route, answered by an agent reviewer through the client
    reviewer_session, reviewer_api = agent_reviewer(project)
    reviewer = Recording(server.url, reviewer_api.token)
    gate = nf.open_review_gate(s.id, candidate_version_id=v2.id, rubric=RUBRIC, route="agent",
                               evidence=[{"key": "style_guide", "label": "Style", "content": "short sentences"}])
    assert [g.id for g in nf.review_gates(s.id)] == [gate.id] == [g.id for g in nf.list_review_gates(s.id).items]
    claim = reviewer.claim_review_packet()
    assert claim.packet is not None and claim.lease is not None and claim.packet.id == gate.packet_id
    assert reviewer.heartbeat_review_packet(claim.packet.id, claim.lease.fencing_token).attempt == 1
    assert [p.packet_id for p in reviewer.review_packets()] == [gate.packet_id] == [p.packet_id for p in reviewer.list_review_packets().items]
    assert reviewer.review_packet(gate.packet_id).fingerprint == gate.packet_fingerprint
    verdict = {"packet_fingerprint": gate.packet_fingerprint, "artifact_fingerprint": gate.candidate_fingerprint,
               "decision": "pass", "scores": {"clarity": 4, "pacing": 6}, "findings": [], "confidence": 0.8}
    bound = reviewer.submit_verdict(gate.packet_id, verdict, claim.lease.fencing_token)
    assert reviewer.submit_verdict(gate.packet_id, verdict, claim.lease.fencing_token).id == bound.id
    finished = nf.wait_for_verdict(gate.id, timeout=30, poll=0.1)
    assert finished.state == "complete" and [v.decision for v in finished.verdicts] == ["pass"]
    assert nf.review_gate(gate.id).bound_verdicts == 1
    gate2 = nf.open_review_gate(s.id, candidate_version_id=v2.id, rubric=RUBRIC, route="agent")
    assert nf.cancel_review_gate(gate2.id).state == "cancelled"
    assert reviewer_session.id != s.id

    # abort is signalled on the heartbeat; the run ends aborted
    assert nf.abort(s.id, "stop").run_id == run.id
    assert nf.heartbeat(s.runtime_id).abort_requested is True
    assert nf.end_run(run.id, "aborted").state == "aborted"
    assert nf.session(s.id).status == "idle"
    with pytest.raises(E.IllegalTransition) as info:
        nf.transition(s.id, "created")
    assert info.value.code == "illegal_transition" and info.value.details

    # close, resume (dry run first: nothing changes), detach the new generation, forget
    assert nf.close(s.id).already_closed is False and nf.runtime_for(s.id) is None
    dry = nf.resume(s.id, {"runtime_family": "cli"}, dry_run=True)
    assert dry.ok and dry.dry_run and dry.runtime_id is None and nf.session(s.id).generation == 1
    report = nf.resume(s.id, {"runtime_family": "cli"}, checkpoint_id=cp.id)
    assert report.ok and report.generation == 2 and nf.runtime_for(s.id) == report.runtime_id
    assert [st.step for st in report.steps] and all(st.ok for st in report.steps)
    assert nf.run(report.run_id).cursor == {"step": "draft"}
    with nf.keep_alive(report.runtime_id) as rt:
        assert rt.beats == 1 and rt.id == report.runtime_id
    assert not nf.get_runtime(report.runtime_id).live and nf.runtime_for(s.id) is None
    with nf.runtime(s.id, "cli", lease_seconds=120) as rt:
        assert rt.runtime is not None and rt.runtime.generation == 3
        nf.detach(rt.id)  # detaching twice is fine
    assert nf.session(s.id).generation == 3

    # a conflicting result: typed error, then a manager resolves it
    s3 = nf.create_session(**WRITER, runtime={"runtime_family": "cli"})
    run3 = nf.start_run(s3.id, cursor={"step": "check"})
    third = nf.hand_off(run3.id, "continuity-3", required_capabilities=["continuity"])
    lease3 = worker.claim("w1", ["continuity"])
    assert lease3 is not None and lease3.id == third.id
    worker.deliver(third.id, fencing_token=lease3.fencing_token, job_fingerprint=third.job_fingerprint, result={"n": 1})
    with pytest.raises(E.ConflictingResult) as info:
        worker.deliver(third.id, fencing_token=lease3.fencing_token, job_fingerprint=third.job_fingerprint, result={"n": 2})
    assert info.value.status == 409 and isinstance(info.value, E.Conflict)
    assert nf.session(s3.id).status == "failed" and nf.session(s3.id).open_conflict
    assert manager.resolve_conflict(third.id, "the first answer stands").conflict_resolution == "the first answer stands"

    plain = nf.create_session(**WRITER)
    assert plain.runtime_id is None
    nf.forget(plain.id)
    with pytest.raises(E.NotFound):
        nf.session(plain.id)

    types = [e.type for e in nf.events(session_id=s.id)]
    assert types[0] == "session.created" and "session.resumed" in types
    assert nf.list_events(session_id=s.id, limit=2).next_after is not None

    missing = OPERATIONS - Recording.called
    assert not missing, f"operations this test never called: {sorted(missing)}"


def test_generation_fencing_names_the_remembered_runtime(server, token):
    """The client names the runtime it attached (create, attach, resume) in that session's writes,
    so a superseded generation is refused with ``StaleRuntime``."""
    gen1 = Client(server.url, token)
    s = gen1.create_session(**WRITER, runtime={"runtime_family": "cli"})
    run = gen1.start_run(s.id, cursor={"step": "outline"})
    gen1.checkpoint(run.id, boundary="context_freeze", cursor={"step": "outline"})
    gen2 = Client(server.url, token)
    gen2.close(s.id)
    report = gen2.resume(s.id, {"runtime_family": "cli"})
    with pytest.raises(E.StaleRuntime) as info:
        gen1.transition(s.id, "completed")
    assert info.value.details == {"runtime_id": s.runtime_id, "live_runtime_id": report.runtime_id, "live_generation": 2}
    with pytest.raises(E.RuntimeRequired):
        Client(server.url, token).transition(s.id, "completed")
    assert gen2.append_transcript(s.id, "assistant", "on time").seq == 1


def test_request_models_refuse_bad_input_before_the_round_trip(server, token):
    nf = Client(server.url, token)
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        nf.create_session(role="poet", memory_policy="bounded", task_mode="x", runtime_family="cli")
    with pytest.raises(ValidationError):
        nf.checkpoint(1, boundary="whenever", cursor={})
    assert nf.list_sessions().items == []  # nothing was sent, nothing written


def test_async_client_drives_the_same_operations(server, token, worker_token):
    async def scenario() -> None:
        async with AsyncClient(server.url, token) as nf, AsyncClient(server.url, worker_token) as worker:
            s = await nf.create_session(**WRITER, runtime={"runtime_family": "cli", "lease_seconds": 300})
            assert nf.runtime_for(s.id) == s.runtime_id
            run = await nf.start_run(s.id, cursor={"step": "outline"})
            cp = await nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": "outline"})
            job = await nf.hand_off(run.id, "async-1", required_capabilities=["lint"])
            lease = await worker.claim("aw", ["lint"])
            assert lease is not None and lease.id == job.id
            out = await worker.deliver(job.id, fencing_token=lease.fencing_token, job_fingerprint=job.job_fingerprint,
                                       result={"ok": True})
            assert out.outcome == "consumed"
            with pytest.raises(E.IllegalTransition):
                await nf.transition(s.id, "created")
            assert [c.id async for c in nf.checkpoints(run.id)] == [cp.id]
            assert [x.id async for x in nf.sessions()] == [s.id]
            types = [e.type async for e in nf.events(session_id=s.id)]
            assert {"handoff.created", "handoff.claimed", "handoff.result_consumed"} <= set(types)
            await nf.end_run(run.id, "completed")
            await nf.close(s.id)
            dry = await nf.resume(s.id, {"runtime_family": "cli"}, dry_run=True)
            assert dry.ok and dry.dry_run

    asyncio.run(scenario())
    assert Checkpoint.objects.count() == 1 and Handoff.objects.count() == 1
    assert RuntimeAttachment.objects.get().ended_at is not None  # closed: the generation ended
