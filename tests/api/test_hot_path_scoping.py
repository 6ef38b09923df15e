"""The checkpoint and transition paths read their rows in SQL (for CPU): same scoping as the ORM.

A session-bound token reaches only its own session's runs; an id beyond bigint names no row
(404, never a 500); nothing is written when the lookup refuses.
"""
from __future__ import annotations

import pytest

from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.models import Checkpoint, Event, Session

from tests.support.factories import Api

pytestmark = pytest.mark.django_db

CHECKPOINT = {"boundary": "user_wait", "cursor": {"a": 1}}


def test_a_session_bound_token_checkpoints_and_transitions_only_its_own_session(project, new_session):
    mine, other = new_session(run=True), new_session(run=True)
    _, raw = create_token(project, name="bound", permissions=["read", "write"], session=Session.objects.get(id=mine["id"]))
    bound = Api(raw)
    events_before = Event.objects.count()

    refused = bound.post(f"/runs/{other['run']['id']}/checkpoints", CHECKPOINT)
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
    refused = bound.post(f"/sessions/{other['id']}/transition", {"to": "awaiting_user"})
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
    assert Checkpoint.objects.count() == 0 and Event.objects.count() == events_before
    assert Session.objects.get(id=other["id"]).status == "running"

    assert bound.post(f"/runs/{mine['run']['id']}/checkpoints", CHECKPOINT).json()["seq"] == 1
    moved = bound.post(f"/sessions/{mine['id']}/transition", {"to": "awaiting_user"})
    assert moved.status_code == 200 and moved.json()["status"] == "awaiting_user"


@pytest.mark.parametrize("big", [2**63, 2**63 - 1, 0, -1])
def test_ids_out_of_range_are_404_not_500(owner, new_session, big):
    new_session(run=True)
    for path, body in ((f"/runs/{big}/checkpoints", CHECKPOINT), (f"/sessions/{big}/transition", {"to": "idle"})):
        resp = owner.post(path, body)
        assert resp.status_code == 404, (path, resp.content)
        assert resp.json()["error"]["code"] == "not_found"
    assert Checkpoint.objects.count() == 0


def test_an_ended_run_refuses_a_checkpoint_with_its_state(owner, new_session):
    s = new_session(run=True)
    assert owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed"}).status_code == 200
    resp = owner.post(f"/runs/{s['run']['id']}/checkpoints", CHECKPOINT)
    assert resp.status_code == 409
    assert resp.json()["error"]["code"] == "run_not_open" and resp.json()["error"]["details"]["state"] == "completed"
    assert Checkpoint.objects.count() == 0
