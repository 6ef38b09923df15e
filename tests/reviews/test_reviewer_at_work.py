"""An agent reviewer's claim, heartbeat and verdict are work of its own session: that
session must be able to work — not ``completed``, ``stale``
or ``terminated``, a live runtime by its lease, declaring ``review`` — and the claim declares
what that runtime declares. Resume's capabilities step asks who may *claim* a pending
agent-review slot, never the writer's resumed runtime.

Every refusal is typed and writes nothing: no claim, no lease renewal, no verdict, no delivery,
no event; the writer keeps waiting.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec, attach_runtime, reconcile_expired_runtimes
from novelforge_sessions.actions.sessions import close_session, transition_session
from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.apikit.auth import caller_for_token
from novelforge_sessions.control.handoffs import create_handoff
from novelforge_sessions.control.models import ConsumeReceipt, Handoff, ResultDelivery
from novelforge_sessions.control.resume import resume_session
from novelforge_sessions.errors import NoLiveRuntime, ResumeRefused, SessionTerminated
from novelforge_sessions.models import ArtifactVersion, Event, RuntimeAttachment, Session, content_fingerprint
from reviews import actions
from reviews.access import reviewer_for_caller
from reviews.models import ReviewAssignment, ReviewGate, Verdict
from tests.support.factories import Api, caller_for
from tests.reviews.factories import World, add_writer, agent_verdict, citing, verdict_for
from tests.support.responses import refused

pytestmark = pytest.mark.django_db


def reviewer(world: World, *, caps: Sequence[str] | None = ("review",), memory: str = "none") -> tuple[Session, Api]:
    """A semantic_reviewer session with a bound ``read,review`` token; ``caps=None``: no runtime ever."""
    setup = caller_for(world.project, ["write"])
    session = sessions.create_session(
        setup, sessions.NewSession(role="semantic_reviewer", memory_policy=memory, task_mode="review",
                                   runtime_family="chat"),
        runtime=None if caps is None else RuntimeSpec(runtime_family="chat", capabilities=list(caps), lease_seconds=600),
    )
    _, raw = create_token(world.project, name=f"rev-{session.id}", permissions=["read", "review"], session=session)
    return session, Api(raw)


def run_then(status: str) -> Callable[[World, Session], None]:
    def move(world: World, session: Session) -> None:
        boss = caller_for(world.project)
        runs.start_run(boss, session.id, cursor={"step": "review"})
        transition_session(boss, session.id, status, reason="done with reviewing")
    return move


def lease_ran_out(world: World, session: Session) -> None:
    RuntimeAttachment.objects.filter(session=session).update(lease_expires_at=timezone.now() - timedelta(minutes=1))


def lost_and_reconciled(world: World, session: Session) -> None:
    runs.start_run(caller_for(world.project), session.id, cursor={"step": "review"})
    lease_ran_out(world, session)
    reconcile_expired_runtimes()
    assert Session.objects.get(id=session.id).status == "failed"


def closed(world: World, session: Session) -> None:
    close_session(caller_for(world.project), session.id)


def resumed_without_review(world: World, session: Session) -> None:
    """Generation 2 declares no ``review``: what generation 1 declared no longer counts."""
    close_session(caller_for(world.project), session.id)
    attach_runtime(caller_for(world.project), session.id, RuntimeSpec(runtime_family="chat", capabilities=["draft"]))


#: How a reviewer session stops being able to work, and the refusal it then gets.
UNABLE: dict[str, tuple[Callable[[World, Session], None], str]] = {
    "terminated": (run_then("terminated"), "session_terminated"),
    "stale": (run_then("stale"), "session_terminated"),
    "completed": (run_then("completed"), "session_terminated"),
    "lease ran out": (lease_ran_out, "no_live_runtime"),
    "lost, reconciled": (lost_and_reconciled, "no_live_runtime"),
    "runtime closed": (closed, "no_live_runtime"),
    "live runtime without review": (resumed_without_review, "handoff_not_claimable"),
}


def state(world: World) -> dict[str, Any]:
    """Everything a refused claim, heartbeat or verdict must leave as it was."""
    return {
        "handoffs": sorted(Handoff.objects.values_list("id", "state", "attempt", "fencing_token", "lease_holder",
                                                       "lease_expires_at")),
        "assignments": sorted(ReviewAssignment.objects.values_list("id", "state", "reviewer")),
        "gates": sorted(ReviewGate.objects.values_list("id", "state", "bound_verdicts")),
        "verdicts": Verdict.objects.count(), "deliveries": ResultDelivery.objects.count(),
        "receipts": ConsumeReceipt.objects.count(), "events": Event.objects.count(),
        "writer": Session.objects.filter(id=world.writer.id).values_list("status", "version").get(),
    }


# ---- the reviewer's own session -----------------------------------------------------------------------
@pytest.mark.parametrize("how", list(UNABLE))
def test_a_reviewer_session_that_cannot_work_claims_nothing(world: World, how: str):
    gate = world.gate(route="agent")
    session, api = reviewer(world)
    make_unable, code = UNABLE[how]
    make_unable(world, session)
    before = state(world)
    err = refused(api.post("/review-packets/claim"), 409, code)
    assert err["details"]["session_id"] == session.id
    if code == "handoff_not_claimable":
        assert err["details"]["missing_capabilities"] == ["review"]
    assert state(world) == before
    assert Handoff.objects.get(review_assignment__packet__gate=gate).state == "pending"
    # it may still read its own (empty) queue: reading is not work
    assert api.get("/review-packets").status_code == 200


def test_a_reviewer_session_that_never_had_a_runtime_claims_nothing(world: World):
    world.gate(route="agent")
    session, api = reviewer(world, caps=None)
    before = state(world)
    err = refused(api.post("/review-packets/claim"), 409, "no_live_runtime")
    assert err["details"] == {"session_id": session.id, "status": "created"}
    assert state(world) == before


def test_a_live_runtime_without_review_claims_nothing(world: World):
    world.gate(route="agent")
    _, api = reviewer(world, caps=["draft"])
    before = state(world)
    err = refused(api.post("/review-packets/claim"), 409, "handoff_not_claimable")
    assert err["details"]["missing_capabilities"] == ["review"]
    assert state(world) == before


@pytest.mark.parametrize("how", list(UNABLE))
def test_a_claim_held_by_a_session_that_stopped_working_neither_renews_nor_binds(world: World, how: str):
    gate = world.gate(route="agent")
    session, api = reviewer(world)
    lease = api.post("/review-packets/claim").json()["lease"]
    assert lease["fencing_token"] == 1
    make_unable, code = UNABLE[how]
    make_unable(world, session)
    before = state(world)
    refused(api.post(f"/review-packets/{gate.packet.id}/heartbeat", {"fencing_token": 1}), 409, code)
    refused(api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, 1, decision="pass")),
                 409, code)
    assert state(world) == before
    gate.refresh_from_db()
    assert gate.state == "pending" and Session.objects.get(id=world.writer.id).status == "awaiting_external"


@pytest.mark.parametrize("how", list(UNABLE))
def test_a_bound_verdict_resubmitted_after_the_reviewer_stopped_working_gets_the_first_answer(world: World, how: str):
    """At-least-once delivery: the retry of a verdict already bound is answered with that verdict,
    whether or not the reviewer's session can still work; anything else it sends is refused by
    that, and nothing is written either way."""
    gate = world.gate(route="agent")
    session, api = reviewer(world)
    token = api.post("/review-packets/claim").json()["lease"]["fencing_token"]
    first = api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, token, decision="pass"))
    assert first.status_code == 201, first.content
    make_unable, code = UNABLE[how]
    make_unable(world, session)
    before = state(world)
    again = api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, token, decision="pass"))
    assert again.status_code == 200, again.content
    assert again.json() == first.json()
    # not the same verdict, or not under the claim that bound it: the session's refusal
    for body in (agent_verdict(gate, token, decision="fail"), agent_verdict(gate, token + 1, decision="pass"),
                 agent_verdict(gate, token, decision="pass", confidence="very")):
        refused(api.post(f"/review-packets/{gate.packet.id}/verdicts", body), 409, code)
    assert state(world) == before
    assert Verdict.objects.get().fingerprint == Verdict.objects.get(id=first.json()["id"]).fingerprint


def test_the_actions_check_again_under_their_locks(world: World):
    """Identities built while their reviewers could work, used after they stopped: the claim and
    the verdict re-read the reviewer's session under their locks and refuse, writing nothing."""
    gate = world.gate(route="agent", required_verdicts=3)
    session, api = reviewer(world)
    identity = reviewer_for_caller(caller_for_token(api.token), working=True)
    assert identity.runtime_id is not None and identity.capabilities == ("review",)
    claim = actions.claim_packet(identity)
    assert claim is not None and claim.handoff.fencing_token == 1
    terminated, terminated_api = reviewer(world)
    stopped = reviewer_for_caller(caller_for_token(terminated_api.token), working=True)
    expired, expired_api = reviewer(world)
    gone = reviewer_for_caller(caller_for_token(expired_api.token), working=True)
    run_then("terminated")(world, session)
    run_then("terminated")(world, terminated)
    lease_ran_out(world, expired)
    before = state(world)
    with pytest.raises(SessionTerminated):
        actions.bind_verdict(identity, gate.packet.id, verdict_for(gate), channel="api", fencing_token=1)
    with pytest.raises(SessionTerminated):
        actions.claim_packet(stopped)
    with pytest.raises(NoLiveRuntime):
        actions.claim_packet(gone)
    assert state(world) == before
    assert ReviewAssignment.objects.filter(packet=gate.packet, state="open").count() == 2


def test_the_claim_declares_what_the_reviewers_runtime_declares(world: World):
    """A slot requiring more than ``review`` goes to the reviewer whose runtime declares it all:
    the claim passes the runtime's capabilities, as a job worker's claim does."""
    gate = world.gate(route="agent")
    Handoff.objects.filter(review_assignment__packet__gate=gate).update(required_capabilities=["review", "french"])
    _, plain = reviewer(world)
    assert plain.post("/review-packets/claim").json() == {"packet": None, "lease": None}
    assert Handoff.objects.get(review_assignment__packet__gate=gate).state == "pending"
    fluent_session, fluent = reviewer(world, caps=["review", "french"])
    taken = fluent.post("/review-packets/claim").json()
    assert taken["packet"]["id"] == gate.packet.id and taken["lease"]["attempt"] == 1
    assert ReviewAssignment.objects.get(packet=gate.packet).reviewer == f"session:{fluent_session.id}"


def test_a_working_reviewer_still_claims_renews_and_binds(world: World):
    gate = world.gate(route="agent")
    _, api = reviewer(world)
    lease = api.post("/review-packets/claim").json()["lease"]
    assert api.post(f"/review-packets/{gate.packet.id}/heartbeat", {"fencing_token": lease["fencing_token"]}).status_code == 200
    bound = api.post(f"/review-packets/{gate.packet.id}/verdicts", agent_verdict(gate, lease["fencing_token"], decision="pass"))
    assert bound.status_code == 201, bound.content
    gate.refresh_from_db()
    assert gate.state == "complete" and Session.objects.get(id=world.writer.id).status == "running"


def test_a_reviewer_that_was_resumed_with_review_works_again(world: World):
    """Generation 2 declaring ``review`` is what counts after a close: the session is the identity."""
    gate = world.gate(route="agent")
    session, api = reviewer(world)
    closed(world, session)
    refused(api.post("/review-packets/claim"), 409, "no_live_runtime")
    attach_runtime(caller_for(world.project), session.id, RuntimeSpec(runtime_family="chat", capabilities=["review"]))
    assert api.post("/review-packets/claim").json()["packet"]["id"] == gate.packet.id


# ---- resume: who may serve a pending agent-review slot ---------------------------------------------------
WRITER_REVIEWS = RuntimeSpec(runtime_family="claude-code", capabilities=["draft", "review"], lease_seconds=600)


def capabilities_step(report: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in report["steps"] if s["step"] == "capabilities")


def dry_run(world: World, caller=None, runtime: RuntimeSpec = WRITER_REVIEWS) -> dict[str, Any]:
    """The resume report (dry run) of the writer, whose runtime was closed: 200's or 409's."""
    try:
        return resume_session(caller or world.writer_caller, world.writer.id, runtime=runtime, dry_run=True).report()
    except ResumeRefused as refused:
        return refused.details["report"]


def waiting_on_agent_gate(world: World, **kw: Any) -> tuple[ReviewGate, Handoff]:
    gate = world.gate(route="agent", **kw)
    close_session(world.writer_caller, world.writer.id)
    assert Session.objects.get(id=world.writer.id).status == "awaiting_external"
    return gate, Handoff.objects.filter(review_assignment__packet__gate=gate).order_by("id").first()


def test_the_writers_resumed_runtime_never_serves_its_own_review_slot(world: World):
    _, handoff = waiting_on_agent_gate(world)
    before = Event.objects.count()
    report = dry_run(world)  # the writer's new runtime declares `review`
    step = capabilities_step(report)
    assert report["ok"] is False and step["ok"] is False and step["repair"] == "attach-capable-runtime"
    assert step["data"]["missing"] == [{"logical_id": handoff.logical_id, "handoff_id": handoff.id, "purpose": "review",
                                        "missing": ["review"]}]
    with pytest.raises(ResumeRefused):
        resume_session(world.writer_caller, world.writer.id, runtime=WRITER_REVIEWS)
    assert Event.objects.count() == before and Session.objects.get(id=world.writer.id).status == "awaiting_external"


@pytest.mark.parametrize("who", ["another writer", "reviewer with memory session", "terminated reviewer",
                                 "reviewer without review", "reviewer whose lease ran out"])
def test_a_live_runtime_that_may_not_claim_the_slot_does_not_serve_it(world: World, who: str):
    _, handoff = waiting_on_agent_gate(world)
    if who == "another writer":
        other, _ = add_writer(world.project)
        RuntimeAttachment.objects.filter(session=other).update(capabilities=["draft", "review"])
    elif who == "reviewer with memory session":
        reviewer(world, memory="session")
    elif who == "terminated reviewer":
        session, _ = reviewer(world)
        run_then("terminated")(world, session)
    elif who == "reviewer without review":
        reviewer(world, caps=["draft"])
    else:
        session, _ = reviewer(world)
        lease_ran_out(world, session)
    step = capabilities_step(dry_run(world))
    assert step["ok"] is False and [m["handoff_id"] for m in step["data"]["missing"]] == [handoff.id]


def test_a_slot_is_served_by_an_eligible_reviewer_and_the_report_names_it_within_reach(world: World):
    _, handoff = waiting_on_agent_gate(world)
    session, _ = reviewer(world)
    runtime_id = RuntimeAttachment.objects.get(session=session).id
    # the unbound project token reaches every runtime of the project
    step = capabilities_step(dry_run(world, caller=caller_for(world.project)))
    assert step["ok"] is True
    assert step["data"]["served"] == {handoff.logical_id: {"live_runtimes": 1, "runtime_ids": [runtime_id]}}
    # the writer's bound token learns that the need is served, not which session serves it
    report = dry_run(world)
    step = capabilities_step(report)
    assert report["ok"] is True and step["data"]["served"] == {handoff.logical_id: {"live_runtimes": 1, "runtime_ids": []}}
    outcome = resume_session(world.writer_caller, world.writer.id, runtime=WRITER_REVIEWS)
    assert outcome.ok and Session.objects.get(id=world.writer.id).status == "awaiting_external"


def test_a_pre_assigned_slot_is_served_only_by_its_reviewer(world: World):
    assigned, _ = reviewer(world)
    _, handoff = waiting_on_agent_gate(world, reviewer_session_ids=[assigned.id])
    reviewer(world)  # another eligible reviewer, live: it may not take a slot assigned to someone else
    lease_ran_out(world, assigned)
    step = capabilities_step(dry_run(world, caller=caller_for(world.project)))
    assert step["ok"] is False and [m["handoff_id"] for m in step["data"]["missing"]] == [handoff.id]
    RuntimeAttachment.objects.filter(session=assigned).update(lease_expires_at=timezone.now() + timedelta(minutes=5))
    step = capabilities_step(dry_run(world, caller=caller_for(world.project)))
    assigned_runtime = RuntimeAttachment.objects.get(session=assigned).id
    assert step["ok"] is True and step["data"]["served"][handoff.logical_id]["runtime_ids"] == [assigned_runtime]


def test_the_candidates_author_does_not_serve_the_slot(world: World):
    """A reviewer session whose token wrote the candidate may not claim it, so it serves nothing."""
    session, api = reviewer(world)
    author = caller_for_token(api.token)
    content = "the reviewer's draft"
    own = ArtifactVersion.objects.create(artifact=world.version.artifact, number=2, content=content,
                                         fingerprint=content_fingerprint(content.encode()), created_by=author.label)
    runs.end_run(world.writer_caller, world.run.id, outcome="completed")
    run = runs.start_run(world.writer_caller, world.writer.id, frozen_inputs=citing(own))
    world.run = run
    _, handoff = waiting_on_agent_gate(world, candidate_version_id=own.id)
    assert api.post("/review-packets/claim").json() == {"packet": None, "lease": None}  # the claim agrees
    step = capabilities_step(dry_run(world, caller=caller_for(world.project)))
    assert step["ok"] is False and [m["handoff_id"] for m in step["data"]["missing"]] == [handoff.id]


def test_a_job_handoff_is_still_served_by_the_resumed_runtime(world: World):
    """Jobs keep their rule: any runtime declaring what they require, the resumed one included."""
    job = create_handoff(world.writer_caller, world.run.id, logical_id="lint-1", required_capabilities=["lint"]).handoff
    close_session(world.writer_caller, world.writer.id)
    step = capabilities_step(dry_run(world, runtime=RuntimeSpec(runtime_family="x", capabilities=["lint"])))
    assert step["ok"] is True and step["data"]["served"] == {job.logical_id: "resumed runtime"}
