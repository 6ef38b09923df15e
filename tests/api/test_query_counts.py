"""The hot write paths use a small, fixed number of queries (docs/model.md#one-transaction-per-write).

Pinned so the write path cannot silently grow. Counts include the token lookup and the
BEGIN/COMMIT of the one write transaction (psycopg 3 reports both as queries).
"""
from __future__ import annotations

import pytest

from novelforge_sessions.models import RuntimeAttachment

# transaction=True: inside a test transaction every atomic() would add SAVEPOINT/RELEASE queries
# that production (autocommit) does not run, so the counts here are the real ones.
pytestmark = pytest.mark.django_db(transaction=True)


def test_checkpoint_write_queries(owner, new_session, django_assert_max_num_queries):
    s = new_session(run=True)
    art = owner.post("/artifacts", {"name": "ch", "content": "text"}).json()
    body = {"boundary": "context_freeze", "cursor": {"step": 1},
            "artifacts": [{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}]}
    owner.post(f"/runs/{s['run']['id']}/checkpoints", body)  # warm: token last_used_at write
    # token, BEGIN, run lock (+project join, the checkpoint's id), artifact check,
    # insert + update run + event (one statement), COMMIT
    with django_assert_max_num_queries(6):
        assert owner.post(f"/runs/{s['run']['id']}/checkpoints", body).status_code == 201


def test_a_session_bound_checkpoint_resolves_its_refs_within_its_reach_in_the_same_statement(
    project, new_session, django_assert_max_num_queries,
):
    """A bound token's artifact refs are resolved within its reach: the reach is a
    subquery of the one artifact check, so the count is the unbound token's."""
    from novelforge_sessions.actions.tokens import create_token
    from novelforge_sessions.models import Session
    from tests.support.factories import Api

    s = new_session(run=True)
    bound = Api(create_token(project, name="bound", permissions=["read", "write"], session=Session.objects.get(id=s["id"]))[1])
    art = bound.post("/artifacts", {"name": "ch", "content": "text"}).json()
    body = {"boundary": "context_freeze", "cursor": {"step": 1},
            "artifacts": [{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}]}
    bound.post(f"/runs/{s['run']['id']}/checkpoints", body)  # warm: token last_used_at write
    with django_assert_max_num_queries(6):
        assert bound.post(f"/runs/{s['run']['id']}/checkpoints", body).status_code == 201
    # without refs there is no artifact check at all
    with django_assert_max_num_queries(5):
        assert bound.post(f"/runs/{s['run']['id']}/checkpoints", {**body, "artifacts": []}).status_code == 201


def test_heartbeat_queries(owner, new_session, django_assert_max_num_queries):
    s = new_session(run=True)
    runtime_id = RuntimeAttachment.objects.get(session_id=s["id"]).id
    owner.post(f"/runtimes/{runtime_id}/heartbeat", {})
    # token, one conditional UPDATE … RETURNING (with the open run's abort flag)
    with django_assert_max_num_queries(2):
        assert owner.post(f"/runtimes/{runtime_id}/heartbeat", {}).status_code == 200


def test_transition_queries(owner, new_session, django_assert_max_num_queries):
    s = new_session(run=True)
    owner.get("/sessions")
    # token, BEGIN, session lock, open run lookup, session update, event, COMMIT
    with django_assert_max_num_queries(7):
        assert owner.post(f"/sessions/{s['id']}/transition", {"to": "awaiting_user"}).status_code == 200
    # leaving the run-holding states also ends the run: + run update + its event
    with django_assert_max_num_queries(9):
        assert owner.post(f"/sessions/{s['id']}/transition", {"to": "failed"}).status_code == 200


def test_duplicate_close_is_read_only(owner, new_session, django_assert_max_num_queries):
    s = new_session()
    owner.post(f"/sessions/{s['id']}/close")
    # token, BEGIN, session lock (with its ordering lock, one statement), live-runtime lookup, COMMIT
    with django_assert_max_num_queries(5):
        assert owner.post(f"/sessions/{s['id']}/close").json()["already_closed"] is True


def test_batch_write_queries(owner, new_session, django_assert_max_num_queries):
    """Ten steps, one write transaction, set-based: the count does not grow with the items."""
    s = new_session(run=True)
    run_id = s["run"]["id"]
    items = [{"kind": "checkpoint", "checkpoint": {"boundary": "context_freeze", "cursor": {"i": i}}} for i in range(9)]
    items.append({"kind": "cursor", "cursor": {"i": 9}})
    owner.post(f"/runs/{run_id}/batch", {"items": items[:1]})  # warm: token last_used_at write
    # token, BEGIN, run lock (+project join), insert checkpoints, update run, insert events, COMMIT
    with django_assert_max_num_queries(7):
        assert owner.post(f"/runs/{run_id}/batch", {"items": items}).status_code == 201


def test_cursor_advance_queries(owner, new_session, django_assert_max_num_queries):
    """The lease check rides in the run lock (a runtime whose lease ran out advances nothing)."""
    s = new_session(run=True)
    owner.post(f"/runs/{s['run']['id']}/cursor", {"cursor": {"step": 1}})  # warm: token last_used_at write
    # token, BEGIN, run lock (+ the session, its liveness), run update, event, COMMIT
    with django_assert_max_num_queries(6):
        assert owner.post(f"/runs/{s['run']['id']}/cursor", {"cursor": {"step": 2}}).status_code == 200
