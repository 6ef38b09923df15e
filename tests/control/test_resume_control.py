"""Resume as revalidation (docs/model.md#resume, docs/model.md#stop-conditions): every failing step, the success path, dry run."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from novelforge_sessions.actions.runtimes import reconcile_expired_runtimes
from novelforge_sessions.control.models import (
    Handoff,
)
from novelforge_sessions.models import Artifact, Checkpoint, Event, Run, RuntimeAttachment, Session
from tests.control.conftest import claim, deliver, make_artifact, make_handoff
from tests.support.responses import ok, refused
from tests.control.test_write_intents import before
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

STEPS = ["load", "framework", "authority", "context", "artifacts", "approvals", "capabilities", "results", "reviews",
         "consumed", "continue"]
RUNTIME = {"runtime_family": "claude-code", "capabilities": ["draft"], "lease_seconds": 60}


def checkpoint(api, run_id: int, **body) -> dict:
    return ok(api.post(f"/runs/{run_id}/checkpoints", {"boundary": "context_freeze", "cursor": {"step": "outline"}, **body}), 201)


def resume(api, session_id: int, *, capabilities: list[str] | None = None, **body):
    runtime = {**RUNTIME, "capabilities": capabilities if capabilities is not None else RUNTIME["capabilities"]}
    return api.post(f"/sessions/{session_id}/resume", {"runtime": runtime, **body})


def close(api, session_id: int) -> None:
    ok(api.post(f"/sessions/{session_id}/close", {}))


def refused_at(api, session_id: int, step: str, repair: str, **body) -> dict:
    """Resume must stop with 409, name exactly ``step`` as failed, and change nothing."""
    before_state = snapshot()
    err = refused(resume(api, session_id, **body), 409, "resume_refused")
    report = err["details"]["report"]
    assert [s["step"] for s in report["steps"]] == STEPS
    assert [s["step"] for s in report["steps"] if not s["ok"]] == [step, "continue"], report
    assert report["repairs"] == [repair]
    failed = next(s for s in report["steps"] if s["step"] == step)
    assert failed["repair"] == repair
    assert snapshot() == before_state
    return failed


def approve_and_execute(owner, manager, body: dict) -> dict:
    intent = ok(owner.post("/write-intents", body), 201)
    ok(manager.post(f"/write-intents/{intent['id']}/approve"))
    return ok(owner.post(f"/write-intents/{intent['id']}/execute"))


@pytest.fixture
def paused(owner, running) -> dict:
    """A running session with a checkpoint, closed (idle), ready to resume."""
    cp = checkpoint(owner, running["run"]["id"], cursor={"step": "outline", "beat": 3})
    return {"session": running, "checkpoint": cp}


# ---- success ---------------------------------------------------------------------------------------
def test_resume_revalidates_every_step_then_continues_in_a_new_run_and_generation(owner, paused):
    sid = paused["session"]["id"]
    close(owner, sid)
    generation = Session.objects.get(id=sid).generation
    report = ok(resume(owner, sid))
    assert [s["step"] for s in report["steps"]] == STEPS and all(s["ok"] for s in report["steps"])
    assert report["generation"] == generation + 1
    run = Run.objects.get(id=report["run_id"])
    assert run.cursor == {"step": "outline", "beat": 3} and run.resumed_from_id == paused["checkpoint"]["id"]
    assert run.state == "open" and run.generation == generation + 1
    session = Session.objects.get(id=sid)
    assert session.status == "running" and session.generation == generation + 1


def test_dry_run_reports_and_changes_nothing(owner, paused):
    sid = paused["session"]["id"]
    close(owner, sid)
    before_state = snapshot()
    report = ok(resume(owner, sid, dry_run=True))
    assert report["ok"] is True and report["dry_run"] is True and report["run_id"] is None
    assert [s["step"] for s in report["steps"]] == STEPS
    assert snapshot() == before_state


def test_dry_run_of_a_waiting_session_with_handoffs_changes_nothing(owner, worker, running):
    make_handoff(owner, running["run"]["id"], "j1", required_capabilities=["draft"])
    checkpoint(owner, running["run"]["id"], boundary="external_wait", pending={"handoffs": ["j1"]})
    close(owner, running["id"])
    before_state = snapshot()
    assert ok(resume(owner, running["id"], dry_run=True))["ok"] is True
    assert snapshot() == before_state


def test_resume_of_a_waiting_session_hands_its_pending_work_to_the_new_run(owner, worker, running):
    h = make_handoff(owner, running["run"]["id"], "j1", required_capabilities=["translate"])
    checkpoint(owner, running["run"]["id"], boundary="external_wait", pending={"handoffs": ["j1"]})
    close(owner, running["id"])
    assert Session.objects.get(id=running["id"]).status == "awaiting_external"
    report = ok(resume(owner, running["id"], capabilities=["draft", "translate"]))
    caps = next(s for s in report["steps"] if s["step"] == "capabilities")
    assert caps["data"]["served"] == {"j1": "resumed runtime"}
    new_run = Run.objects.get(id=report["run_id"])
    assert Handoff.objects.get(id=h["id"]).run_id == new_run.id and new_run.pending_external == ["j1"]
    assert Run.objects.get(id=running["run"]["id"]).state == "interrupted"
    got = claim(worker, ["translate"])
    assert ok(deliver(worker, got, {"t": 1}))["outcome"] == "consumed"
    assert Run.objects.get(id=new_run.id).pending_external == []


# ---- each failing step --------------------------------------------------------------------------------
def test_framework_changed(owner, manager, paused):
    approve_and_execute(owner, manager, {
        "kind": "framework.change", "idempotency_key": "fw", "before_fingerprint": before(owner, "framework.change"),
        "params": {"framework_version": "2"}})
    close(owner, paused["session"]["id"])
    failed = refused_at(owner, paused["session"]["id"], "framework", "terminate-as-stale")
    assert failed["data"] == {"bound": "1", "current": "2"}


def test_authority_changed(owner, manager, paused):
    art = make_artifact(owner, "canon")
    approve_and_execute(owner, manager, {
        "kind": "authority.settle", "idempotency_key": "settle", "before_fingerprint": before(owner, "authority.settle"),
        "params": {"artifacts": [{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}]}})
    close(owner, paused["session"]["id"])
    failed = refused_at(owner, paused["session"]["id"], "authority", "re-freeze")
    assert failed["data"]["authority_version"] == {"bound": 1, "current": 2}


def test_artifact_changed(owner, manager, running):
    art = make_artifact(owner, "draft")
    checkpoint(owner, running["run"]["id"], artifacts=[{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}])
    v2 = ok(owner.post(f"/artifacts/{art['id']}/versions", {"content": "changed"}), 201)
    approve_and_execute(owner, manager, {
        "kind": "artifact.make_current", "idempotency_key": "v2", "artifact_id": art["id"], "params": {"version_id": v2["id"]},
        "before_fingerprint": before(owner, "artifact.make_current", art["id"])})
    close(owner, running["id"])
    failed = refused_at(owner, running["id"], "artifacts", "re-freeze")
    assert failed["data"]["changed"] == [{"artifact_id": art["id"], "bound": art["current_fingerprint"], "current": v2["fingerprint"]}]


def test_a_frozen_candidate_that_is_not_current_resumes_while_the_head_stays(owner, manager, running):
    """A checkpoint citing a frozen candidate that is not (yet) its
    artifact's current version (the contract's "frozen candidate before review" boundary) was
    refused on resume as "changed" although nothing changed. Each ref records the head at
    checkpoint time; only a head that moved since (to anything but the cited version) fails."""
    art = make_artifact(owner, "candidate")
    v2 = ok(owner.post(f"/artifacts/{art['id']}/versions", {"content": "draft two, better"}), 201)
    cp = checkpoint(owner, running["run"]["id"], boundary="candidate_frozen", cursor={"step": "await-review"},
                    artifacts=[{"artifact_id": art["id"], "fingerprint": v2["fingerprint"]}])
    assert cp["artifacts"] == [{"artifact_id": art["id"], "fingerprint": v2["fingerprint"],
                                "head_version_id": art["current_version_id"]}]
    close(owner, running["id"])
    steps = {s["step"]: s for s in ok(resume(owner, running["id"], dry_run=True))["steps"]}
    assert steps["artifacts"]["ok"] and steps["artifacts"]["data"]["unmoved"] == [
        {"artifact_id": art["id"], "bound": v2["fingerprint"], "current": art["current_fingerprint"]}]
    assert steps["artifacts"]["detail"] == ("1 artifact fingerprint(s) hold: 1 frozen at a version that is not current, "
                                            "and nothing made another version current since")
    # the candidate made current is the cited version: it holds
    approve_and_execute(owner, manager, {
        "kind": "artifact.make_current", "idempotency_key": "v2", "artifact_id": art["id"], "params": {"version_id": v2["id"]},
        "before_fingerprint": before(owner, "artifact.make_current", art["id"])})
    steps = {s["step"]: s for s in ok(resume(owner, running["id"], dry_run=True))["steps"]}
    assert steps["artifacts"]["detail"] == "1 artifact fingerprint(s) still current"
    # a head moved to anything else: changed, as before (same shape and repair), and nothing is written
    v3 = ok(owner.post(f"/artifacts/{art['id']}/versions", {"content": "draft three"}), 201)
    approve_and_execute(owner, manager, {
        "kind": "artifact.make_current", "idempotency_key": "v3", "artifact_id": art["id"], "params": {"version_id": v3["id"]},
        "before_fingerprint": before(owner, "artifact.make_current", art["id"])})
    failed = refused_at(owner, running["id"], "artifacts", "re-freeze")
    assert failed["detail"] == "1 artifact(s) changed since the checkpoint"
    assert failed["data"] == {"changed": [{"artifact_id": art["id"], "bound": v2["fingerprint"], "current": v3["fingerprint"]}]}


def test_a_ref_stored_before_refs_recorded_the_head_keeps_the_earlier_rule(owner, running):
    """A checkpoint written before refs carried ``head_version_id``: its cited version must be
    the head (nothing tells a head that stayed from one that moved and came back)."""
    art = make_artifact(owner, "old-ref")
    v2 = ok(owner.post(f"/artifacts/{art['id']}/versions", {"content": "v2"}), 201)
    cp = checkpoint(owner, running["run"]["id"], artifacts=[{"artifact_id": art["id"], "fingerprint": v2["fingerprint"]}])
    Checkpoint.objects.filter(id=cp["id"]).update(artifacts=[{"artifact_id": art["id"], "fingerprint": v2["fingerprint"]}])
    close(owner, running["id"])
    failed = refused_at(owner, running["id"], "artifacts", "re-freeze")
    assert failed["data"] == {"changed": [{"artifact_id": art["id"], "bound": v2["fingerprint"], "current": art["current_fingerprint"]}]}


def _approved_intent(owner, manager) -> tuple[dict, dict]:
    art = make_artifact(owner, "to-publish")
    v2 = ok(owner.post(f"/artifacts/{art['id']}/versions", {"content": "final"}), 201)
    intent = ok(owner.post("/write-intents", {
        "kind": "artifact.make_current", "idempotency_key": "publish", "artifact_id": art["id"],
        "params": {"version_id": v2["id"]}, "before_fingerprint": before(owner, "artifact.make_current", art["id"])}), 201)
    return art, ok(manager.post(f"/write-intents/{intent['id']}/approve"))


def test_approval_stale(owner, manager, running):
    _, intent = _approved_intent(owner, manager)
    checkpoint(owner, running["run"]["id"], boundary="before_consequential_write",
               approvals=[{"write_intent_id": intent["id"], "approval_id": intent["approval"]["id"]}])
    ok(manager.post(f"/write-intents/{intent['id']}/revoke-approval", {"note": "needs another look"}))
    close(owner, running["id"])
    failed = refused_at(owner, running["id"], "approvals", "re-approve")
    assert failed["data"]["problems"][0]["problem"] == "approval stale (revoked)"
    # re-approving repairs it
    ok(manager.post(f"/write-intents/{intent['id']}/approve"))
    assert ok(resume(owner, running["id"], dry_run=True))["ok"] is True


def test_write_precondition_stale(owner, manager, running, project):
    art, intent = _approved_intent(owner, manager)
    checkpoint(owner, running["run"]["id"], boundary="before_consequential_write",
               approvals=[{"write_intent_id": intent["id"]}])
    v3 = ok(owner.post(f"/artifacts/{art['id']}/versions", {"content": "other"}), 201)
    approve_and_execute(owner, manager, {
        "kind": "artifact.make_current", "idempotency_key": "other", "artifact_id": art["id"],
        "params": {"version_id": v3["id"]}, "before_fingerprint": before(owner, "artifact.make_current", art["id"])})
    close(owner, running["id"])
    failed = refused_at(owner, running["id"], "approvals", "re-freeze")
    assert failed["data"]["problems"][0]["problem"] == "write precondition stale"


def test_capability_missing(owner, new_session, running):
    make_handoff(owner, running["run"]["id"], "translate-ch1", required_capabilities=["translate"])
    checkpoint(owner, running["run"]["id"], boundary="external_wait", pending={"handoffs": ["translate-ch1"]})
    close(owner, running["id"])
    failed = refused_at(owner, running["id"], "capabilities", "attach-capable-runtime")
    assert failed["data"]["missing"][0]["logical_id"] == "translate-ch1"
    assert failed["data"]["missing"][0]["missing"] == ["translate"]
    # a live runtime elsewhere in the project that declares it is enough
    helper = new_session(runtime_family="local-model")
    ok(owner.post(f"/sessions/{helper['id']}/close", {}))
    rt = ok(owner.post(f"/sessions/{helper['id']}/runtimes", {"runtime_family": "local-model", "capabilities": ["translate"]}), 201)
    caps = next(s for s in ok(resume(owner, running["id"], dry_run=True))["steps"] if s["step"] == "capabilities")
    assert caps["ok"] and caps["data"]["served"] == {"translate-ch1": {"live_runtimes": 1, "runtime_ids": [rt["id"]]}}


def test_conflicting_result(owner, worker, running):
    h = make_handoff(owner, running["run"]["id"], "review-1")
    checkpoint(owner, running["run"]["id"], boundary="external_wait", pending={"handoffs": ["review-1"]})
    got = claim(worker)
    ok(deliver(worker, got, {"v": "a"}))
    refused(deliver(worker, got, {"v": "b"}), 409, "conflicting_result")
    close(owner, running["id"])
    assert Session.objects.get(id=running["id"]).status == "failed"
    failed = refused_at(owner, running["id"], "results", "resolve-conflict")
    assert failed["data"]["conflicted"] == ["review-1"]
    assert Handoff.objects.get(id=h["id"]).state == "conflicted"


def test_an_unbound_invalid_delivery_stops_resume(owner, worker, running):
    make_handoff(owner, running["run"]["id"], "review-2", result_schema={"v": "string"})
    checkpoint(owner, running["run"]["id"], boundary="external_wait", pending={"handoffs": ["review-2"]})
    got = claim(worker)
    refused(deliver(worker, got, {"v": 1}), 422, "invalid_result")
    close(owner, running["id"])
    failed = refused_at(owner, running["id"], "results", "re-freeze")
    assert failed["data"]["invalid_deliveries_for"] == ["review-2"]


def test_the_sessions_own_write_executed_after_the_checkpoint_is_reported_and_carried_past(owner, manager, running):
    """The canonical crash right after a write. The checkpoint at
    ``before_consequential_write`` cites the approved intent and the artifact; the intent is
    executed; the runtime's lease runs out before the next checkpoint (reconciled: failed /
    runtime_lost). Resume refused on ``artifacts`` and ``consumed`` with repair re-freeze, which
    cannot be taken (no open run, no live runtime). Executing again replays the recorded outcome,
    so continuing repeats nothing: the report says the write is done, and the cursor continues."""
    art, intent = _approved_intent(owner, manager)
    cursor = {"step": "make-current"}
    cp = checkpoint(owner, running["run"]["id"], boundary="before_consequential_write", cursor=cursor,
                    artifacts=[{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}],
                    approvals=[{"write_intent_id": intent["id"], "approval_id": intent["approval"]["id"]}])
    executed = ok(owner.post(f"/write-intents/{intent['id']}/execute"))  # the write happened after the checkpoint
    head = Artifact.objects.get(id=art["id"]).current_version
    assert head.id == intent["params"]["version_id"]
    RuntimeAttachment.objects.filter(session_id=running["id"]).update(lease_expires_at=timezone.now() - timedelta(minutes=1))
    assert [r.session_status for r in reconcile_expired_runtimes()] == ["failed"]

    report = ok(resume(owner, running["id"]))
    steps = {s["step"]: s for s in report["steps"]}
    assert all(s["ok"] for s in report["steps"]) and report["repairs"] == []
    assert steps["artifacts"]["data"]["written"] == [{
        "artifact_id": art["id"], "bound": art["current_fingerprint"], "current": head.fingerprint,
        "write_intent_ids": [intent["id"]]}]
    assert steps["artifacts"]["detail"] == (
        f"1 artifact fingerprint(s) hold: 1 made current since by the checkpoint's own write intent #{intent['id']}, "
        "already executed")
    [done] = steps["consumed"]["data"]["executed_writes"]
    assert done["write_intent_id"] == intent["id"] and done["outcome"] == executed["outcome"]
    assert steps["consumed"]["detail"].startswith(
        f"write intent #{intent['id']} (artifact.make_current) already executed after the checkpoint: the write is done")
    run = Run.objects.get(id=report["run_id"])
    assert run.cursor == cursor and run.resumed_from_id == cp["id"] and run.state == "open"
    assert Session.objects.get(id=running["id"]).status == "running"
    # the continued cursor executes again: the recorded outcome, nothing written
    events = Event.objects.count()
    again = ok(owner.post(f"/write-intents/{intent['id']}/execute"))
    assert again["outcome"] == executed["outcome"] and Event.objects.count() == events
    assert Artifact.objects.get(id=art["id"]).current_version_id == head.id


def test_a_change_after_the_sessions_own_write_still_stops_resume(owner, manager, running):
    """Only the head the checkpoint's own write produced is accepted: another write after it is a change."""
    art, intent = _approved_intent(owner, manager)
    checkpoint(owner, running["run"]["id"], boundary="before_consequential_write",
               artifacts=[{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}],
               approvals=[{"write_intent_id": intent["id"]}])
    ok(owner.post(f"/write-intents/{intent['id']}/execute"))
    v3 = ok(owner.post(f"/artifacts/{art['id']}/versions", {"content": "someone else's"}), 201)
    approve_and_execute(owner, manager, {
        "kind": "artifact.make_current", "idempotency_key": "v3", "artifact_id": art["id"], "params": {"version_id": v3["id"]},
        "before_fingerprint": before(owner, "artifact.make_current", art["id"])})
    close(owner, running["id"])
    failed = refused_at(owner, running["id"], "artifacts", "re-freeze")
    assert failed["data"] == {"changed": [{"artifact_id": art["id"], "bound": art["current_fingerprint"],
                                           "current": v3["fingerprint"]}]}


def test_already_consumed_result_from_an_older_checkpoint(owner, worker, running):
    make_handoff(owner, running["run"]["id"], "research-1")
    older = checkpoint(owner, running["run"]["id"], boundary="external_wait", pending={"handoffs": ["research-1"]})
    ok(deliver(worker, claim(worker), {"facts": 3}))
    # the workflow moved past the result: a later checkpoint after binding it
    checkpoint(owner, running["run"]["id"], boundary="after_external_result", cursor={"step": "draft"})
    close(owner, running["id"])
    failed = refused_at(owner, running["id"], "consumed", "re-freeze", checkpoint_id=older["id"])
    assert failed["data"]["already_consumed"][0]["logical_id"] == "research-1"
    # the latest checkpoint resumes fine, and the awaited result is reported bound
    report = ok(resume(owner, running["id"]))
    assert Run.objects.get(id=report["run_id"]).cursor == {"step": "draft"}


def test_waiting_on_a_bound_result_is_not_a_repeat(owner, worker, running):
    make_handoff(owner, running["run"]["id"], "research-2")
    checkpoint(owner, running["run"]["id"], boundary="external_wait", pending={"handoffs": ["research-2"]})
    ok(deliver(worker, claim(worker), {"facts": 3}))
    close(owner, running["id"])
    report = ok(resume(owner, running["id"]))
    results = next(s for s in report["steps"] if s["step"] == "results")
    assert list(results["data"]["bound"]) == ["research-2"]
    consumed = next(s for s in report["steps"] if s["step"] == "consumed")
    assert consumed["ok"] is True
