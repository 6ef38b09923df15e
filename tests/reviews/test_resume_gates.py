"""Resume knows review gates (docs/model.md#waits): a pending gate is one of the things a run
waits on — revalidated by resume's ``reviews`` step and carried over to the new run, so that
a verdict bound afterwards settles the run that continues the cursor, never the interrupted one."""
from __future__ import annotations

from typing import Any

import pytest

from novelforge_sessions.actions import artifacts
from novelforge_sessions.control import intents
from novelforge_sessions.control.checkpoints import record_checkpoint
from novelforge_sessions.control.resume import resume_session
from novelforge_sessions.actions.runs import start_run
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.sessions import close_session
from novelforge_sessions.control import waits
from novelforge_sessions.control.models import Handoff
from novelforge_sessions.apikit.auth import caller_for_token
from novelforge_sessions.errors import ResumeRefused, ValidationFailed
from novelforge_sessions.models import Artifact, ArtifactVersion, Checkpoint, Event, Run, Session
from reviews.access import reviewer_for_user
from reviews.actions import GateSpec, bind_verdict, cancel_gate, open_gate
from reviews.models import ReviewGate, Verdict
from tests.support.factories import caller_for
from tests.reviews.factories import RUBRIC, add_writer, agent_reviewer, agent_verdict, citing, orchestrator, verdict_for, World
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

RUNTIME = RuntimeSpec(runtime_family="claude-code", capabilities=["draft"], lease_seconds=600)


def freeze(world: World, **pending: Any) -> Checkpoint:
    return record_checkpoint(world.writer_caller, world.run.id, {
        "boundary": "user_wait", "cursor": {"step": "await-review"}, "pending": pending})


def resume(world: World):
    close_session(world.writer_caller, world.writer.id)
    return resume_session(world.writer_caller, world.writer.id, runtime=RUNTIME)


def step(outcome_or_report, name: str) -> dict[str, Any]:
    report = outcome_or_report if isinstance(outcome_or_report, dict) else outcome_or_report.report()
    names = [s["step"] for s in report["steps"]]
    assert names.index("results") + 1 == names.index("reviews") == names.index("consumed") - 1, names
    return next(s for s in report["steps"] if s["step"] == name)


def run_row(run_id: int) -> tuple:
    return Run.objects.filter(id=run_id).values_list("state", "pending_external", "ended_at", "end_reason").get()


def move_head(world: World, to: ArtifactVersion | None = None, key: str = "move-head") -> ArtifactVersion:
    """Make another version of the candidate's artifact current (an approved write): ``to``,
    or a new version. Returns the version now current."""
    boss = caller_for(world.project)
    artifact_id = world.version.artifact_id
    if to is None:
        artifacts.add_artifact_version(boss, artifact_id, content="A different chapter.")
    version = to or world.version.artifact.versions.order_by("-number").first()
    before = intents.read_before_state(boss, kind="artifact.make_current", artifact_id=artifact_id)
    intent = intents.create_intent(boss, kind="artifact.make_current", idempotency_key=key, artifact_id=artifact_id,
                                   before_fingerprint=before.fingerprint, params={"version_id": version.id}).intent
    intents.approve_intent(boss, intent.id)
    intents.execute_intent(boss, intent.id)
    assert Artifact.objects.get(id=artifact_id).current_version_id == version.id
    return version


# ---- page route ----------------------------------------------------------------------------------
def test_resume_carries_a_pending_page_gate_to_the_new_run_and_the_verdict_settles_that_run(world: World):
    gate = world.gate(route="page")
    freeze(world, gates=[{"gate_id": gate.id}])
    world.refresh()
    assert world.writer.status == "awaiting_user"
    old_run = run_row(world.run.id)

    outcome = resume(world)
    reviews = step(outcome, "reviews")
    assert reviews["ok"] is True and reviews["data"] == {"pending": [gate.id], "complete": []}
    gate.refresh_from_db()
    assert gate.run_id == outcome.run_id != world.run.id
    assert waits.waiting_on(Session.objects.get(id=world.writer.id), Run.objects.get(id=outcome.run_id)) == {
        "gates": [{"id": gate.id, "route": "page", "state": "pending"}]}
    resumed = Event.objects.get(type="session.resumed", session_id=world.writer.id)
    assert resumed.payload["carried_over"] == {"gates": [gate.id]}
    interrupted = run_row(world.run.id)
    assert interrupted[0] == "interrupted"

    # the continuing run waits on the reviewer again (resume leaves it awaiting_user, docs/model.md#waits);
    # the verdict moves the session back to running
    assert Session.objects.get(id=world.writer.id).status == "awaiting_user"
    mark = Event.objects.order_by("-id").values_list("id", flat=True).first()
    bind_verdict(reviewer_for_user(world.users["alice"]), gate.packet.id, verdict_for(gate), channel="page")
    session = Session.objects.get(id=world.writer.id)
    assert session.status == "running"
    assert Run.objects.get(id=outcome.run_id).state == "open"
    assert run_row(world.run.id) == interrupted  # the interrupted run is not touched
    later = Event.objects.filter(id__gt=mark)
    assert set(later.filter(type__startswith="review.").values_list("run_id", flat=True)) == {outcome.run_id}
    assert not later.filter(run_id=world.run.id).exists()
    assert old_run[0] == "open"


def test_a_verdict_bound_after_resume_continues_the_resumed_run(world: World):
    gate = world.gate(route="page")
    freeze(world, gates=[{"gate_id": gate.id}])
    outcome = resume(world)
    assert Session.objects.get(id=world.writer.id).status == "awaiting_user"
    bind_verdict(reviewer_for_user(world.users["alice"]), gate.packet.id, verdict_for(gate), channel="page")
    gate.refresh_from_db()
    assert gate.state == "complete" and gate.run_id == outcome.run_id
    assert Session.objects.get(id=world.writer.id).status == "running"
    assert Run.objects.get(id=outcome.run_id).state == "open"


def test_a_gate_whose_candidate_went_stale_refuses_resume_with_re_review_and_writes_nothing(world: World):
    gate = world.gate(route="page")
    freeze(world, gates=[{"gate_id": gate.id}])
    close_session(world.writer_caller, world.writer.id)
    move_head(world)
    before = snapshot()
    with pytest.raises(ResumeRefused) as info:
        resume_session(world.writer_caller, world.writer.id, runtime=RUNTIME)
    report = info.value.details["report"]
    reviews = step(report, "reviews")
    assert reviews["ok"] is False and reviews["repair"] == "re-review" and report["repairs"] == ["re-review"]
    assert [p["problem"] for p in reviews["data"]["problems"]] == ["candidate changed"]
    assert reviews["data"]["problems"][0]["gate_id"] == gate.id
    assert [s["step"] for s in report["steps"] if not s["ok"]] == ["reviews", "continue"]
    assert snapshot() == before


def test_a_cancelled_gate_the_checkpoint_waits_on_is_reported(world: World):
    gate = world.gate(route="page")
    freeze(world, gates=[{"gate_id": gate.id}])
    cancel_gate(world.writer_caller, gate.id, reason="re-freeze the candidate")
    close_session(world.writer_caller, world.writer.id)
    before = snapshot()
    with pytest.raises(ResumeRefused) as info:
        resume_session(world.writer_caller, world.writer.id, runtime=RUNTIME)
    reviews = step(info.value.details["report"], "reviews")
    assert reviews["ok"] is False and reviews["repair"] == "re-review"
    assert reviews["data"]["problems"] == [{"gate_id": gate.id, "problem": "review gate cancelled", "repair": "re-review"}]
    assert snapshot() == before


def test_a_complete_gate_is_reported_with_its_outcome(world: World):
    gate = world.gate(route="page")
    freeze(world, gates=[{"gate_id": gate.id}])
    bind_verdict(reviewer_for_user(world.users["alice"]), gate.packet.id, verdict_for(gate, decision="pass"), channel="page")
    outcome = resume(world)
    assert step(outcome, "reviews")["data"] == {"pending": [], "complete": [{"gate_id": gate.id, "outcome": "pass"}]}


def complete(world: World, gate: ReviewGate, decision: str = "pass") -> None:
    bind_verdict(reviewer_for_user(world.users["alice"]), gate.packet.id, verdict_for(gate, decision=decision), channel="page")
    gate.refresh_from_db()
    assert (gate.state, gate.outcome) == ("complete", decision)


def resume_refused(world: World) -> dict[str, Any]:
    """Resume is refused and writes nothing; the dry run reports the same; returns the report."""
    close_session(world.writer_caller, world.writer.id)
    before = snapshot()
    with pytest.raises(ResumeRefused) as dry:
        resume_session(world.writer_caller, world.writer.id, runtime=RUNTIME, dry_run=True)
    with pytest.raises(ResumeRefused) as info:
        resume_session(world.writer_caller, world.writer.id, runtime=RUNTIME)
    assert snapshot() == before
    report = info.value.details["report"]
    assert dry.value.details["report"]["steps"] == report["steps"]
    assert [s["step"] for s in report["steps"] if not s["ok"]] == ["reviews", "continue"]
    assert report["repairs"] == ["re-review"]
    return report


# A verdict judged the candidate, not the artifact. The gate completed,
# then the artifact's head moved on through artifact.make_current; the cursor would continue at
# its "reviewed" step on content nobody reviewed (docs/model.md#stop-conditions: a fingerprint changed unexpectedly).
@pytest.mark.parametrize("decision", ["pass", "revise", "reject"])
def test_a_complete_gate_whose_candidate_changed_refuses_resume_with_re_review_and_writes_nothing(world: World, decision: str):
    gate = world.gate(route="page")
    complete(world, gate, decision)
    freeze(world, gates=[{"gate_id": gate.id}])
    moved = move_head(world)
    reviews = step(resume_refused(world), "reviews")
    assert reviews["ok"] is False and reviews["repair"] == "re-review"
    assert reviews["detail"] == "1 review gate(s) no longer valid"
    assert reviews["data"] == {"pending": [], "complete": [], "problems": [{
        "gate_id": gate.id, "problem": "candidate changed", "route": "page",
        "candidate_fingerprint": world.version.fingerprint, "current": moved.fingerprint, "repair": "re-review"}]}
    assert moved.fingerprint != world.version.fingerprint


def test_the_api_answers_409_resume_refused_for_a_complete_gate_whose_candidate_changed(world: World):
    """Over HTTP too: it once answered 200 and continued the cursor at the reviewed step."""
    gate = world.gate(route="page")
    complete(world, gate)
    freeze(world, gates=[{"gate_id": gate.id}])
    moved = move_head(world)
    assert world.writer_api.post(f"/sessions/{world.writer.id}/close", {}).status_code == 200
    before = snapshot()
    resp = world.writer_api.post(f"/sessions/{world.writer.id}/resume",
                                 {"runtime": {"runtime_family": "claude-code", "lease_seconds": 600}})
    assert resp.status_code == 409, resp.content
    err = resp.json()["error"]
    assert err["code"] == "resume_refused"
    reviews = step(err["details"]["report"], "reviews")
    assert reviews["ok"] is False and reviews["repair"] == "re-review" and reviews["data"]["complete"] == []
    assert [(p["gate_id"], p["candidate_fingerprint"], p["current"]) for p in reviews["data"]["problems"]] == [
        (gate.id, world.version.fingerprint, moved.fingerprint)]
    assert snapshot() == before


def test_a_complete_and_a_pending_gate_on_a_changed_candidate_are_reported_alike(world: World):
    done = world.gate(route="page")
    complete(world, done)
    waiting = world.gate(route="page", reviewers=["bob"])
    freeze(world, gates=[{"gate_id": done.id}, {"gate_id": waiting.id}])
    move_head(world)
    problems = step(resume_refused(world), "reviews")["data"]["problems"]
    assert [p["gate_id"] for p in problems] == [done.id, waiting.id]
    assert {**problems[0], "gate_id": None} == {**problems[1], "gate_id": None}


def test_a_complete_gate_the_checkpoint_does_not_cite_is_not_revalidated(world: World):
    """Only the gates the checkpoint waits on (and every pending one) bind the cursor."""
    gate = world.gate(route="page")
    complete(world, gate)
    freeze(world)
    move_head(world)
    outcome = resume(world)
    assert step(outcome, "reviews")["data"] == {"pending": [], "complete": []}


def test_a_complete_gate_whose_candidate_changed_and_changed_back_still_counts(world: World):
    gate = world.gate(route="page")
    complete(world, gate)
    freeze(world, gates=[{"gate_id": gate.id}])
    move_head(world)
    move_head(world, to=world.version, key="move-back")
    outcome = resume(world)
    reviews = step(outcome, "reviews")
    assert reviews["ok"] is True and reviews["data"] == {"pending": [], "complete": [{"gate_id": gate.id, "outcome": "pass"}]}
    assert Run.objects.get(id=outcome.run_id).cursor == {"step": "await-review"}


def test_a_complete_gate_on_a_candidate_promoted_after_the_verdict_still_counts(world: World):
    """The usual order: freeze a new version, review it, then make it current — the head moving
    from the version current at freeze time to the candidate itself is not a change."""
    boss = caller_for(world.project)
    artifacts.add_artifact_version(boss, world.version.artifact_id, content="The second draft.")
    draft = world.version.artifact.versions.order_by("-number").first()
    gate = world.gate(route="page", candidate_version_id=draft.id)
    assert gate.head_version_id == world.version.id != draft.id
    complete(world, gate)
    freeze(world, gates=[{"gate_id": gate.id}])
    move_head(world, to=draft)
    outcome = resume(world)
    assert step(outcome, "reviews")["data"] == {"pending": [], "complete": [{"gate_id": gate.id, "outcome": "pass"}]}


def test_gate_refs_are_resolved_at_write_time(world: World):
    gate = world.gate(route="page")
    cp = freeze(world, gates=[{"gate_id": gate.id}])
    assert cp.pending == {"gates": [{"gate_id": gate.id, "route": "page", "state": "pending",
                                     "candidate_version_id": world.version.id,
                                     "candidate_fingerprint": world.version.fingerprint}]}
    # a gate of another session of the project is not this run's to wait on
    writer2 = caller_for_token(add_writer(world.project)[1])
    run2 = start_run(orchestrator(world.project), writer2.session_id, cursor={"step": "draft"},
                     frozen_inputs=citing(world.version))
    theirs = open_gate(writer2, writer2.session_id, GateSpec(
        candidate_version_id=world.version.id, rubric=RUBRIC, route="page", reviewers=["bob"]))
    count = (Checkpoint.objects.count(), Event.objects.count())
    for refs, field in (([{"gate_id": theirs.id}], "pending.gates[0].gate_id"),
                        ([{"gate_id": gate.id}, {"gate_id": gate.id + 1000}], "pending.gates[1].gate_id")):
        with pytest.raises(ValidationFailed) as info:
            freeze(world, gates=refs)
        assert info.value.details["field"] == field
    with pytest.raises(ValidationFailed) as info:
        record_checkpoint(writer2, run2.id, {"boundary": "user_wait", "cursor": {"s": 1}, "pending": {"gates": [{"gate_id": gate.id}]}})
    assert (Checkpoint.objects.count(), Event.objects.count()) == count


# ---- agent route -----------------------------------------------------------------------------------
def test_an_agent_gate_and_its_handoffs_follow_the_new_run(world: World):
    agent_session, agent = agent_reviewer(world.project)  # a live runtime that declares "review"
    gate = world.gate(route="agent")
    handoff = Handoff.objects.get(review_assignment__packet__gate=gate)
    freeze(world, gates=[{"gate_id": gate.id}], handoffs=[handoff.logical_id])
    world.refresh()
    assert world.writer.status == "awaiting_external" and world.run.pending_external == [handoff.logical_id]

    outcome = resume(world)
    assert step(outcome, "reviews")["ok"] is True
    gate.refresh_from_db()
    handoff.refresh_from_db()
    new_run = Run.objects.get(id=outcome.run_id)
    assert gate.run_id == handoff.run_id == new_run.id and new_run.pending_external == [handoff.logical_id]
    interrupted = run_row(world.run.id)
    assert interrupted[0] == "interrupted"

    # the continuing run waits on the reviewer (resume leaves it awaiting_external, the agent
    # route's state); the bound verdict settles *that* run
    assert Session.objects.get(id=world.writer.id).status == "awaiting_external"
    lease = agent.post("/review-packets/claim").json()["lease"]
    assert agent.post(f"/review-packets/{gate.packet.id}/verdicts",
                      agent_verdict(gate, lease["fencing_token"])).status_code == 201
    assert Verdict.objects.filter(packet=gate.packet).count() == 1
    assert Session.objects.get(id=world.writer.id).status == "running"
    new_run.refresh_from_db()
    assert new_run.state == "open" and new_run.pending_external == []
    assert run_row(world.run.id) == interrupted  # the interrupted run's pending list is not rewritten


def test_a_verdict_settles_the_run_that_waits_on_its_handoff_even_for_a_gate_resumed_before_carry_over(world: World):
    """A gate resumed by the old code kept its interrupted run while its handoff moved on; the
    verdict must still settle the run whose pending list holds the handoff."""
    _, agent = agent_reviewer(world.project)
    gate = world.gate(route="agent")
    outcome = resume(world)
    ReviewGate.objects.filter(id=gate.id).update(run_id=world.run.id)  # as the old resume left it
    gate.refresh_from_db()
    assert Session.objects.get(id=world.writer.id).status == "awaiting_external"
    interrupted = run_row(world.run.id)
    lease = agent.post("/review-packets/claim").json()["lease"]
    assert agent.post(f"/review-packets/{gate.packet.id}/verdicts",
                      agent_verdict(gate, lease["fencing_token"])).status_code == 201
    assert Session.objects.get(id=world.writer.id).status == "running"
    assert Run.objects.get(id=outcome.run_id).pending_external == []
    assert run_row(world.run.id) == interrupted
