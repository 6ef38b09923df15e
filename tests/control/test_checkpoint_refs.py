"""Checkpoint references are typed and resolved at write time; resume verifies every one
(docs/model.md#checkpoints).

Refs of any other shape, or naming something that does not resolve (an intent of another
project, an approval of another intent, a handoff of another session), are a 422 naming the
field path, and nothing is written. What is stored is the normalized, resolved ref."""
from __future__ import annotations

import pytest

from novelforge_sessions.control.models import Approval, WriteIntent
from novelforge_sessions.models import Checkpoint
from tests.control.conftest import make_artifact, make_handoff
from tests.support.responses import ok, refused
from tests.control.test_resume_control import _approved_intent, approve_and_execute, checkpoint, close, refused_at, resume
from tests.control.test_write_intents import before
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

BODY = {"boundary": "before_consequential_write", "cursor": {"step": "publish"}}


def refused_ref(api, run_id: int, field: str, **body) -> dict:
    before_counts = snapshot()
    err = refused(api.post(f"/runs/{run_id}/checkpoints", {**BODY, **body}), 422, "validation_error")
    assert err["details"]["field"] == field, err
    assert snapshot() == before_counts
    return err


def _proposed_intent(owner, key: str = "publish-later") -> dict:
    art = make_artifact(owner, f"art-{key}")
    v2 = ok(owner.post(f"/artifacts/{art['id']}/versions", {"content": "final"}), 201)
    return ok(owner.post("/write-intents", {
        "kind": "artifact.make_current", "idempotency_key": key, "artifact_id": art["id"],
        "params": {"version_id": v2["id"]}, "before_fingerprint": before(owner, "artifact.make_current", art["id"])}), 201)


# ---- write time: shapes --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"approvals": [7]}, "approvals[0]"),
        ({"approvals": [{"intent_id": 7}]}, "approvals[0].intent_id"),
        ({"approvals": [{"write_intent_id": "7"}]}, "approvals[0].write_intent_id"),
        ({"pending": {"gate": "next"}}, "pending.gate"),
        ({"pending": {"events": ["e1"]}}, "pending.events"),
        ({"pending": {"handoffs": "j1"}}, "pending.handoffs"),
        ({"pending": {"handoffs": [3]}}, "pending.handoffs[0]"),
        ({"pending": {"handoffs": [{"logical_id": 3}]}}, "pending.handoffs[0].logical_id"),
        ({"pending": {"handoffs": [{"id": 3}]}}, "pending.handoffs[0]"),
        ({"pending": {"handoffs": [{"handoff_id": "3"}]}}, "pending.handoffs[0].handoff_id"),
        ({"pending": {"gates": [4]}}, "pending.gates[0]"),
        ({"pending": {"gates": [{"gate_id": "4"}]}}, "pending.gates[0].gate_id"),
    ],
)
def test_refs_of_another_shape_are_refused_naming_the_field(owner, running, body, field):
    """On the original code every one of these was stored (201) and then ignored by resume."""
    refused_ref(owner, running["run"]["id"], field, **body)


# ---- write time: resolution ----------------------------------------------------------------------
def test_unresolvable_refs_are_refused_naming_the_field(owner, manager, outsider, running, new_session):
    run_id = running["run"]["id"]
    _, approved = _approved_intent(owner, manager)
    other_intent = _proposed_intent(owner, "other")
    foreign = _proposed_intent(outsider, "foreign")
    refused_ref(owner, run_id, "approvals[0].write_intent_id", approvals=[{"write_intent_id": foreign["id"]}])
    refused_ref(owner, run_id, "approvals[0].write_intent_id", approvals=[{"write_intent_id": 10**9}])
    # an approval of another intent
    refused_ref(owner, run_id, "approvals[1].approval_id", approvals=[
        {"write_intent_id": approved["id"]}, {"write_intent_id": other_intent["id"], "approval_id": approved["approval"]["id"]}])
    # a handoff of another session, by logical id and by id
    other = new_session(run=True)
    theirs = make_handoff(owner, other["run"]["id"], "theirs")
    make_handoff(owner, run_id, "mine")
    refused_ref(owner, run_id, "pending.handoffs[1]", pending={"handoffs": ["mine", "theirs"]})
    refused_ref(owner, run_id, "pending.handoffs[0].handoff_id", pending={"handoffs": [{"handoff_id": theirs["id"]}]})
    refused_ref(owner, run_id, "pending.handoffs[1].logical_id", pending={"handoffs": ["mine", {"logical_id": "nope"}]})
    refused_ref(owner, run_id, "pending.handoffs[1]", pending={"handoffs": ["mine", "mine"]})
    # a gate that is not this session's
    refused_ref(owner, run_id, "pending.gates[0].gate_id", pending={"gates": [{"gate_id": 10**6}]})


def test_refs_are_stored_normalized_and_resolved(owner, manager, running):
    run_id = running["run"]["id"]
    _, approved = _approved_intent(owner, manager)
    waiting = _proposed_intent(owner)
    h1 = make_handoff(owner, run_id, "j1")
    h2 = make_handoff(owner, run_id, "j2")
    h3 = make_handoff(owner, run_id, "j3")
    cp = checkpoint(owner, run_id, boundary="external_wait",
                    approvals=[{"write_intent_id": approved["id"]},
                               {"write_intent_id": waiting["id"]}],
                    pending={"handoffs": ["j1", {"logical_id": "j2"}, {"handoff_id": h3["id"]}], "gates": []})
    assert cp["approvals"] == [
        {"write_intent_id": approved["id"], "approval_id": None, "standing_approval_id": approved["approval"]["id"],
         "before_fingerprint": approved["before_fingerprint"], "intent_state": "approved"},
        {"write_intent_id": waiting["id"], "approval_id": None, "standing_approval_id": None,
         "before_fingerprint": waiting["before_fingerprint"], "intent_state": "proposed"},
    ]
    assert cp["pending"] == {"handoffs": [{"handoff_id": h1["id"], "logical_id": "j1"},
                                          {"handoff_id": h2["id"], "logical_id": "j2"},
                                          {"handoff_id": h3["id"], "logical_id": "j3"}], "gates": []}
    assert Checkpoint.objects.get(id=cp["id"]).approvals == cp["approvals"]


# ---- resume: every intent ref is verified, however it was spelled ---------------------------------
def test_a_revoked_approval_fails_resume_even_when_the_ref_names_only_the_intent(owner, manager, running):
    """The original code let this pass: the ref did not name the approval, and revoking put the
    intent back to ``proposed``, which read as "still waiting for an approval"."""
    _, intent = _approved_intent(owner, manager)
    checkpoint(owner, running["run"]["id"], **BODY, approvals=[{"write_intent_id": intent["id"]}])
    ok(manager.post(f"/write-intents/{intent['id']}/revoke-approval", {"note": "not yet"}))
    assert WriteIntent.objects.get(id=intent["id"]).state == "proposed"
    close(owner, running["id"])
    failed = refused_at(owner, running["id"], "approvals", "re-approve")
    assert failed["data"]["problems"] == [{"write_intent_id": intent["id"], "approval_id": intent["approval"]["id"],
                                           "problem": "approval stale (revoked)", "repair": "re-approve"}]
    ok(manager.post(f"/write-intents/{intent['id']}/approve"))  # a standing re-approval repairs it
    assert ok(resume(owner, running["id"], dry_run=True))["ok"] is True


def test_an_intent_rejected_after_the_checkpoint_is_re_freeze(owner, manager, running):
    waiting = _proposed_intent(owner)
    checkpoint(owner, running["run"]["id"], **BODY, approvals=[{"write_intent_id": waiting["id"]}])
    ok(manager.post(f"/write-intents/{waiting['id']}/reject", {"note": "no"}))
    close(owner, running["id"])
    failed = refused_at(owner, running["id"], "approvals", "re-freeze")
    assert failed["data"]["problems"][0]["problem"] == "write intent rejected"


def test_a_proposed_intent_the_cursor_waits_on_is_not_a_failure(owner, running):
    waiting = _proposed_intent(owner)
    checkpoint(owner, running["run"]["id"], **BODY, approvals=[{"write_intent_id": waiting["id"]}])
    close(owner, running["id"])
    step = next(s for s in ok(resume(owner, running["id"], dry_run=True))["steps"] if s["step"] == "approvals")
    assert step["ok"] is True and step["data"] == {"checked": 1}


def test_refs_stored_before_they_were_typed_are_checked_not_ignored(owner, manager, running):
    """A checkpoint written by the old code (free-form refs) is not silently valid: an
    unreadable ref stops resume, and a bare intent ref is checked against the approvals'
    own history (one stood at checkpoint time, and was revoked since)."""
    _, intent = _approved_intent(owner, manager)
    cp = checkpoint(owner, running["run"]["id"], **BODY)
    Checkpoint.objects.filter(id=cp["id"]).update(approvals=[{"write_intent_id": intent["id"]}])
    ok(manager.post(f"/write-intents/{intent['id']}/revoke-approval", {"note": "not yet"}))
    close(owner, running["id"])
    assert refused_at(owner, running["id"], "approvals", "re-approve")["data"]["problems"][0]["problem"] == \
        "approval stale (revoked)"
    Checkpoint.objects.filter(id=cp["id"]).update(approvals=[{"intent": intent["id"]}])
    failed = refused_at(owner, running["id"], "approvals", "re-freeze")
    assert failed["data"]["problems"] == [{"ref": {"intent": intent["id"]}, "problem": "unreadable write-intent ref",
                                           "repair": "re-freeze"}]
    assert Approval.objects.filter(intent_id=intent["id"]).count() == 1


def test_an_approval_that_stood_goes_stale_when_authority_moves(owner, manager, running):
    _, intent = _approved_intent(owner, manager)
    checkpoint(owner, running["run"]["id"], **BODY, approvals=[{"write_intent_id": intent["id"]}])
    canon = make_artifact(owner, "canon")
    approve_and_execute(owner, manager, {
        "kind": "authority.settle", "idempotency_key": "settle", "before_fingerprint": before(owner, "authority.settle"),
        "params": {"artifacts": [{"artifact_id": canon["id"], "fingerprint": canon["current_fingerprint"]}]}})
    close(owner, running["id"])
    report = refused(resume(owner, running["id"]), 409, "resume_refused")["details"]["report"]
    approvals = next(s for s in report["steps"] if s["step"] == "approvals")
    assert approvals["ok"] is False and approvals["repair"] == "re-approve"
    assert approvals["data"]["problems"][0]["problem"] == "approval stale (authority_changed)"
    assert set(report["repairs"]) == {"re-approve", "re-freeze"}  # the authority step fails too


def test_a_transcript_under_other_key_names_is_refused_over_the_api_and_nothing_is_written(owner, running):
    run_id = running["run"]["id"]
    before_counts = snapshot()
    turns = [{"who": "user", "said": "draft the storm scene please"}, {"who": "assistant", "said": "Here it is, in full."}]
    err = refused(owner.post(f"/runs/{run_id}/checkpoints", {**BODY, "cursor": {"step": "x", "recent": turns}}),
                  422, "checkpoint_not_bounded")
    assert err["details"]["path"] == "$.cursor.recent"
    assert snapshot() == before_counts
