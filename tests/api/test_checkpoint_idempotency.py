"""Checkpoints with an idempotency key: a retry replays the first write, never a second one.

The key is what makes a client's retry after a dropped answer safe (the typed client sends one
with every checkpoint): same key and body → 200 with the checkpoint the first request wrote;
same key, other body → 409 ``idempotency_key_reused``; either way nothing more is written.
"""
from __future__ import annotations

import pytest

from novelforge_sessions.models import Checkpoint, Event, Run
from tests.support.factories import Api
from tests.support.races import oks, race

CP = {"boundary": "context_freeze", "cursor": {"step": 1}, "idempotency_key": "step-1/attempt"}


def _written(run_id: int) -> tuple:
    run = Run.objects.get(id=run_id)
    return (Checkpoint.objects.filter(run_id=run_id).count(),
            Event.objects.filter(run_id=run_id, type="checkpoint.recorded").count(), run.checkpoint_count)


@pytest.mark.django_db
def test_the_same_key_and_body_replays_the_first_checkpoint(owner, new_session):
    run_id = new_session(run=True)["run"]["id"]
    first = owner.post(f"/runs/{run_id}/checkpoints", CP)
    assert first.status_code == 201, first.content
    again = owner.post(f"/runs/{run_id}/checkpoints", CP)
    assert again.status_code == 200, again.content
    assert again.json() == first.json()  # the original outcome, id and seq included
    assert _written(run_id) == (1, 1, 1)
    # A new key is a new checkpoint.
    assert owner.post(f"/runs/{run_id}/checkpoints", {**CP, "idempotency_key": "step-2"}).json()["seq"] == 2
    assert _written(run_id) == (2, 2, 2)


@pytest.mark.django_db
def test_the_same_key_with_another_body_is_refused_and_writes_nothing(owner, new_session):
    run_id = new_session(run=True)["run"]["id"]
    first = owner.post(f"/runs/{run_id}/checkpoints", CP).json()
    before = _written(run_id)
    resp = owner.post(f"/runs/{run_id}/checkpoints", {**CP, "cursor": {"step": 2}})
    assert resp.status_code == 409, resp.content
    assert resp.json()["error"]["code"] == "idempotency_key_reused"
    assert resp.json()["error"]["details"]["checkpoint_id"] == first["id"]
    assert _written(run_id) == before


@pytest.mark.django_db
def test_a_replay_after_the_run_ended_still_returns_the_first_outcome(owner, new_session):
    run_id = new_session(run=True)["run"]["id"]
    first = owner.post(f"/runs/{run_id}/checkpoints", CP).json()
    assert owner.post(f"/runs/{run_id}/end", {"outcome": "completed"}).status_code == 200
    again = owner.post(f"/runs/{run_id}/checkpoints", CP)
    assert (again.status_code, again.json()) == (200, first)
    fresh = owner.post(f"/runs/{run_id}/checkpoints", {**CP, "idempotency_key": "new"})
    assert fresh.status_code == 409 and fresh.json()["error"]["code"] == "run_not_open"
    assert _written(run_id) == (1, 1, 1)


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", "with space", "x" * 201, "é"])
def test_a_malformed_key_is_a_422_naming_it_and_writes_nothing(owner, new_session, key):
    run_id = new_session(run=True)["run"]["id"]
    resp = owner.post(f"/runs/{run_id}/checkpoints", {**CP, "idempotency_key": key})
    assert resp.status_code == 422, resp.content
    assert "idempotency_key" in str(resp.json()["error"]["details"])
    assert _written(run_id) == (0, 0, 0)


@pytest.mark.django_db
def test_a_batch_item_with_a_key_is_refused_not_silently_dropped(owner, new_session):
    run_id = new_session(run=True)["run"]["id"]
    resp = owner.post(f"/runs/{run_id}/batch", {"items": [{"kind": "checkpoint", "checkpoint": CP}]})
    assert resp.status_code == 422, resp.content
    assert resp.json()["error"]["details"]["field"] == "items[0].checkpoint.idempotency_key"
    assert _written(run_id) == (0, 0, 0)


@pytest.mark.django_db(transaction=True)
def test_racing_retries_with_one_key_write_exactly_one_checkpoint(owner, new_session):
    run_id = new_session(run=True)["run"]["id"]
    n = 8

    def retry(_: int) -> tuple[int, int]:
        resp = Api(owner.token).post(f"/runs/{run_id}/checkpoints", CP)
        return resp.status_code, resp.json()["id"]

    answers = oks(race(retry, n))
    assert sorted(code for code, _ in answers) == [200] * (n - 1) + [201]
    assert len({cid for _, cid in answers}) == 1
    assert _written(run_id) == (1, 1, 1)
