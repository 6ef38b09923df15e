"""Bounded checkpoints (contract §06, §13.6): pure validation and the API's typed refusals."""
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
