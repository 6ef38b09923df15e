"""Bounded checkpoints (docs/model.md#checkpoints): pure validation and the API's typed refusals."""
from __future__ import annotations

import pytest

from novelforge_sessions import session_runtime as rt

CAP = 4096
GOOD = {"boundary": "context_freeze", "cursor": {"step": "outline", "beat": 3}}


def test_a_minimal_checkpoint_is_accepted():
    spec = rt.validate_checkpoint(GOOD, max_bytes=CAP)
    assert spec.boundary is rt.CheckpointBoundary.CONTEXT_FREEZE
    assert spec.cursor == {"step": "outline", "beat": 3}
    assert spec.resume_policy == "revalidate"
    assert spec.size_bytes == rt.json_size(GOOD)


def test_every_contract_boundary_is_accepted():
    assert len(rt.CheckpointBoundary) == 8
    for boundary in rt.CheckpointBoundary:
        assert rt.validate_checkpoint({**GOOD, "boundary": boundary.value}, max_bytes=CAP).boundary is boundary


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        ({**GOOD, "pending": {"transcript": "user: hi"}}, "$.pending.transcript"),
        ({**GOOD, "cursor": {"step": "x", "messages": []}}, "$.cursor.messages"),
        ({**GOOD, "pending": {"notes": [{"role": "assistant", "content": "I think..."}]}}, "$.pending.notes"),
        ({**GOOD, "cursor": {"step": "x", "private_reasoning": "because"}}, "$.cursor.private_reasoning"),
        ({**GOOD, "cursor": {"step": "x" * 3000}}, "$.cursor.step"),
        ({**GOOD, "chat_history": ["a"]}, "$.chat_history"),
    ],
)
def test_transcript_like_content_is_not_bounded(payload, path):
    with pytest.raises(rt.CheckpointNotBounded) as info:
        rt.validate_checkpoint(payload, max_bytes=1_000_000)
    assert info.value.code == "checkpoint_not_bounded"
    assert info.value.details["path"] == path


def test_oversized_checkpoint_is_not_bounded():
    big = {**GOOD, "pending": {f"gate{i}": "x" * 100 for i in range(60)}}
    with pytest.raises(rt.CheckpointNotBounded) as info:
        rt.validate_checkpoint(big, max_bytes=CAP)
    assert info.value.details["limit"] == CAP and info.value.details["size"] > CAP


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"cursor": {"a": 1}}, "boundary"),
        ({"boundary": "nap", "cursor": {"a": 1}}, "boundary"),
        ({"boundary": "context_freeze"}, "cursor"),
        ({"boundary": "context_freeze", "cursor": {}}, "cursor"),
        ({**GOOD, "artifacts": [{"artifact_id": 1, "fingerprint": "md5:abc"}]}, "artifacts[0].fingerprint"),
        ({**GOOD, "artifacts": [{"fingerprint": "sha256:" + "0" * 64}]}, "artifacts[0]"),
        ({**GOOD, "colour": "blue"}, "colour"),
    ],
)
def test_invalid_checkpoints_name_the_field(payload, field):
    with pytest.raises(rt.InvalidPayload) as info:
        rt.validate_checkpoint(payload, max_bytes=CAP)
    assert info.value.details["field"] == field


# ---- through the API ------------------------------------------------------------------------
@pytest.mark.django_db
def test_api_refuses_a_transcript_checkpoint_and_writes_nothing(owner, new_session):
    session = new_session(run=True)
    run_id = session["run"]["id"]
    resp = owner.post(f"/runs/{run_id}/checkpoints", {**GOOD, "pending": {"conversation": ["hello"]}})
    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "checkpoint_not_bounded"
    assert resp.json()["error"]["details"]["path"] == "$.pending.conversation"
    assert owner.get(f"/runs/{run_id}/checkpoints").json()["items"] == []


@pytest.mark.django_db
def test_api_refuses_an_oversized_checkpoint(owner, new_session, settings):
    settings.CHECKPOINT_MAX_BYTES = 2048
    run_id = new_session(run=True)["run"]["id"]
    resp = owner.post(f"/runs/{run_id}/checkpoints", {**GOOD, "pending": {f"g{i}": "y" * 200 for i in range(20)}})
    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "checkpoint_not_bounded"


@pytest.mark.django_db
def test_api_records_checkpoints_in_sequence_with_current_authority(owner, new_session, project):
    run_id = new_session(run=True)["run"]["id"]
    art = owner.post("/artifacts", {"name": "ch1", "content": "It was a dark night."}).json()
    first = owner.post(f"/runs/{run_id}/checkpoints", {**GOOD, "artifacts": [
        {"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}]})
    second = owner.post(f"/runs/{run_id}/checkpoints", {"boundary": "user_wait", "cursor": {"step": "ask"}})
    assert first.status_code == 201 and second.status_code == 201, (first.content, second.content)
    assert (first.json()["seq"], second.json()["seq"]) == (1, 2)
    assert first.json()["authority"] == project.authority_ref()
    assert owner.get(f"/runs/{run_id}").json()["cursor"] == {"step": "ask"}


@pytest.mark.django_db
def test_api_refuses_unknown_artifact_versions_and_stale_authority(owner, new_session, project):
    run_id = new_session(run=True)["run"]["id"]
    bogus = owner.post(f"/runs/{run_id}/checkpoints", {**GOOD, "artifacts": [{"artifact_id": 999, "fingerprint": "sha256:" + "1" * 64}]})
    assert bogus.status_code == 422 and bogus.json()["error"]["code"] == "unknown_artifact_version"
    stale = owner.post(f"/runs/{run_id}/checkpoints", {**GOOD, "authority": {"authority_version": project.authority_version - 1 + 5}})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_authority"
    assert owner.get(f"/runs/{run_id}/checkpoints").json()["items"] == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("extra", "status", "code"),
    [
        ({"chat_history": ["user: hi"]}, 422, "checkpoint_not_bounded"),
        ({"colour": "blue"}, 422, "validation_error"),
    ],
)
def test_api_refuses_unknown_top_level_checkpoint_keys(owner, new_session, extra, status, code):
    """Unknown keys reach the pure core (which refuses them); they were once dropped silently."""
    run_id = new_session(run=True)["run"]["id"]
    resp = owner.post(f"/runs/{run_id}/checkpoints", {**GOOD, **extra})
    assert resp.status_code == status, resp.content
    assert resp.json()["error"]["code"] == code
    assert owner.get(f"/runs/{run_id}/checkpoints").json()["items"] == []


# ---- transcripts by shape, whatever the key names --------------------------------------
FP = "sha256:" + "0" * 64
TRANSCRIPTS = {
    "speaker/text": [{"speaker": "user", "text": "Draft the lighthouse scene for me"},
                     {"speaker": "assistant", "text": "Here is a first pass at the scene."}],
    "who/said": [{"who": "Mara", "said": "Where did the keeper go tonight?"},
                 {"who": "Jon", "said": "Down to the water, like every night."},
                 {"who": "Mara", "said": "Then we wait for him here."}],
    "from/body": [{"from": "me", "body": "can you check chapter two for pacing"},
                  {"from": "bot", "body": "Checked it: the middle drags a little."},
                  {"from": "me", "body": "ok fix that"}],
    "author/message+ts": [{"author": "human", "message": "continue from the storm please", "ts": 1},
                          {"author": "ai", "message": "The storm broke at midnight, and Mara ran.", "ts": 2}],
    "pairs": [["user", "hello, can you draft chapter one"], ["assistant", "Here is a draft of chapter one."],
              ["user", "shorter please"]],
    "tuples of three speakers": [["Mara", "The lamp is out again tonight."], ["Jon", "I will fetch the oil."],
                                 ["Ada", "No need, the storm has passed."], ["Mara", "Then light it."]],
}


@pytest.mark.parametrize("turns", list(TRANSCRIPTS.values()), ids=list(TRANSCRIPTS))
def test_chat_turns_are_detected_by_shape_whatever_the_key_names(turns):
    """On the original code only key names and {role, content} counted: every one of these was accepted."""
    for payload, path in (({**GOOD, "cursor": {"step": "x", "notes": turns}}, "$.cursor.notes"),
                          ({**GOOD, "pending": {"handoffs": turns}}, "$.pending.handoffs"),
                          ({**GOOD, "cursor": {"step": "x", "log": {"recent": turns}}}, "$.cursor.log.recent")):
        with pytest.raises(rt.CheckpointNotBounded) as info:
            rt.validate_checkpoint(payload, max_bytes=1_000_000)
        assert info.value.details["path"] == path


LEGITIMATE = {
    "artifact refs": [{"artifact_id": 1, "fingerprint": FP}, {"artifact_id": 2, "fingerprint": FP},
                      {"artifact_id": 3, "fingerprint": FP}],
    "cursor steps": [{"step": "outline", "status": "done"}, {"step": "draft", "status": "doing"},
                     {"step": "review", "status": "todo"}, {"step": "publish", "status": "todo"}],
    "steps with titles, sorted by status": [
        {"title": "Write the chapter outline", "status": "done"}, {"title": "Draft the opening scene", "status": "done"},
        {"title": "Send the scene to review", "status": "todo"}, {"title": "Publish chapter one", "status": "todo"}],
    "named steps with descriptions": [{"name": "outline", "description": "Outline chapter one with its beats"},
                                      {"name": "draft", "description": "Draft the first scene from the outline"}],
    "ids": [1, 2, 3, 5, 8],
    "handoff refs": ["chapter-1/continuity", "chapter-1/translation"],
    "handoff ref objects": [{"logical_id": "review-1-1", "state": "pending"}, {"logical_id": "review-1-2", "state": "pending"},
                            {"logical_id": "review-1-3", "state": "claimed"}],
    "gate refs": [{"gate_id": 4}, {"gate_id": 9}],
    "beats": [["beat", "storm"], ["beat", "lamp"], ["beat", "keeper"]],
    "pairs of ids": [[1, 2], [3, 4]],
    "one labelled sentence": [{"kind": "note", "text": "Mara must not learn the keeper's name yet."}],
}


@pytest.mark.parametrize("value", list(LEGITIMATE.values()), ids=list(LEGITIMATE))
def test_bounded_state_is_not_mistaken_for_a_transcript(value):
    assert rt.find_transcript_content({**GOOD, "cursor": {"step": "x", "state": value}}) is None


def test_the_existing_rules_still_hold():
    assert rt.find_transcript_content({"cursor": {"m": [{"role": "user", "content": "hi"}]}}) == "$.cursor.m"
    assert rt.find_transcript_content({"cursor": {"history": []}}) == "$.cursor.history"


# ---- typed refs: shapes (pure) --------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"approvals": {"write_intent_id": 1}}, "approvals"),
        ({"approvals": [5]}, "approvals[0]"),
        ({"approvals": [{"intent_id": 5}]}, "approvals[0].intent_id"),
        ({"approvals": [{"write_intent_id": "5"}]}, "approvals[0].write_intent_id"),
        ({"approvals": [{"write_intent_id": True}]}, "approvals[0].write_intent_id"),
        ({"approvals": [{"write_intent_id": 1}, {"write_intent_id": 2, "approval_id": "x"}]}, "approvals[1].approval_id"),
        ({"approvals": [{"write_intent_id": 1}, {"write_intent_id": 1}]}, "approvals[1].write_intent_id"),
        ({"pending": ["j1"]}, "pending"),
        ({"pending": {"handoffs": "j1"}}, "pending.handoffs"),
    ],
)
def test_ref_shapes_are_typed_and_name_the_field(extra, field):
    with pytest.raises(rt.InvalidPayload) as info:
        rt.validate_checkpoint({**GOOD, **extra}, max_bytes=CAP)
    assert info.value.details["field"] == field


def test_pending_keys_are_those_of_the_registered_wait_kinds():
    with pytest.raises(rt.InvalidPayload) as info:
        rt.validate_checkpoint({**GOOD, "pending": {"gate": "next"}}, max_bytes=CAP, pending_keys={"handoffs", "gates"})
    assert info.value.details["field"] == "pending.gate"
    spec = rt.validate_checkpoint({**GOOD, "approvals": [{"write_intent_id": 3, "approval_id": 4}],
                                   "pending": {"handoffs": ["j1"]}}, max_bytes=CAP, pending_keys={"handoffs"})
    assert spec.approvals == (rt.ApprovalRef(3, 4),) and spec.pending == {"handoffs": ["j1"]}
