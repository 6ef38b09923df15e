"""Idempotency keys on the agent writes that create something: start a run, attach a runtime, a
batch, a handoff, open a review gate (docs/agents.md#idempotency-keys).

The contract is the checkpoint's: the same key and body answer the first answer again (its
status and the same object), nothing written and no second event; the same key with another
body is 409 ``idempotency_key_reused`` and writes nothing. 16 concurrent retries of one key store
exactly one row and all get the same answer: the unique index decides, not a Python lock.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pytest

from novelforge_sessions.control.models import Handoff
from novelforge_sessions.models import Checkpoint, Event, IdempotentRequest, Run, RuntimeAttachment
from reviews.models import ReviewGate
from tests.reviews.factories import RUBRIC, make_world
from tests.support.factories import Api, api_session
from tests.support.races import oks, race

RACERS = 16


@dataclass
class Keyed:
    """One keyed write, set up: who sends it, where, its body, a body that differs, and what it wrote."""

    api: Api
    path: str
    body: dict[str, Any]
    other: dict[str, Any]
    written: Callable[[], tuple[int, int]]  # (rows, events) of what the write creates

    def state(self) -> tuple[int, int, int]:
        return (*self.written(), IdempotentRequest.objects.count())


def _events(kind: str, **where: Any) -> int:
    return Event.objects.filter(type=kind, **where).count()


def start_run(owner: Api, project) -> Keyed:
    sid = api_session(owner)["id"]
    return Keyed(owner, f"/sessions/{sid}/runs", {"cursor": {"step": 1}, "idempotency_key": "run-1"},
                 {"cursor": {"step": 2}, "idempotency_key": "run-1"},
                 lambda: (Run.objects.filter(session_id=sid).count(), _events("run.started", session_id=sid)))


def attach(owner: Api, project) -> Keyed:
    sid = api_session(owner, attach=False)["id"]
    return Keyed(owner, f"/sessions/{sid}/runtimes", {"runtime_family": "cli", "idempotency_key": "attach-1"},
                 {"runtime_family": "cli", "lease_seconds": 30, "idempotency_key": "attach-1"},
                 lambda: (RuntimeAttachment.objects.filter(session_id=sid).count(),
                          _events("runtime.attached", session_id=sid)))


BATCH_ITEMS = [{"kind": "checkpoint", "checkpoint": {"boundary": "context_freeze", "cursor": {"s": 1}}},
               {"kind": "cursor", "cursor": {"s": 2}},
               {"kind": "checkpoint", "checkpoint": {"boundary": "before_long_handoff", "cursor": {"s": 3}}}]


def batch(owner: Api, project) -> Keyed:
    run_id = api_session(owner, run=True)["run"]["id"]
    return Keyed(owner, f"/runs/{run_id}/batch", {"items": BATCH_ITEMS, "idempotency_key": "batch-1"},
                 {"items": BATCH_ITEMS[:1], "idempotency_key": "batch-1"},
                 lambda: (Checkpoint.objects.filter(run_id=run_id).count(),
                          _events("checkpoint.recorded", run_id=run_id) + _events("run.cursor_advanced", run_id=run_id)))


def hand_off(owner: Api, project) -> Keyed:
    run_id = api_session(owner, run=True)["run"]["id"]
    job = {"logical_id": "job-1", "required_capabilities": ["lint"], "params": {"n": 1}, "idempotency_key": "job-key"}
    return Keyed(owner, f"/runs/{run_id}/handoffs", job, {**job, "params": {"n": 2}},
                 lambda: (Handoff.objects.filter(run_id=run_id).count(), _events("handoff.created", run_id=run_id)))


def open_gate(owner: Api, project) -> Keyed:
    world = make_world(project)
    body = {"candidate_version_id": world.version.id, "rubric": RUBRIC, "route": "page", "reviewers": ["alice"],
            "idempotency_key": "gate-1"}
    sid = world.writer.id
    return Keyed(world.writer_api, f"/sessions/{sid}/review-gates", body, {**body, "reviewers": ["bob"]},
                 lambda: (ReviewGate.objects.filter(session_id=sid).count(),
                          _events("review.gate_opened", session_id=sid)))


WRITES = [start_run, attach, batch, hand_off, open_gate]


@pytest.fixture(params=WRITES, ids=[w.__name__ for w in WRITES])
def keyed(request, owner, project) -> Keyed:
    return request.param(owner, project)


@pytest.mark.django_db
def test_the_same_key_and_body_replay_the_first_answer_and_write_nothing(keyed):
    first = keyed.api.post(keyed.path, keyed.body)
    assert first.status_code == 201, first.content
    after_first = keyed.state()
    assert after_first == (1 if keyed.path.endswith(("/runs", "/runtimes", "/handoffs", "/review-gates")) else 2,
                           after_first[1], 1)
    again = keyed.api.post(keyed.path, keyed.body)
    assert (again.status_code, again.json()) == (201, first.json())
    assert keyed.state() == after_first


@pytest.mark.django_db
def test_the_same_key_with_another_body_is_refused_and_writes_nothing(keyed):
    assert keyed.api.post(keyed.path, keyed.body).status_code == 201
    before = keyed.state()
    resp = keyed.api.post(keyed.path, keyed.other)
    assert resp.status_code == 409, resp.content
    assert resp.json()["error"]["code"] == "idempotency_key_reused"
    assert keyed.state() == before


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_of_one_key_store_one_row_and_all_get_its_answer(keyed):
    def retry(_: int) -> tuple[int, Any]:
        resp = Api(keyed.api.token).post(keyed.path, keyed.body)
        return resp.status_code, resp.json()

    answers = oks(race(retry, RACERS))
    assert [code for code, _ in answers] == [201] * RACERS, answers
    assert all(body == answers[0][1] for _, body in answers)
    rows, events = keyed.written()
    assert rows == (2 if "/batch" in keyed.path else 1)
    assert events == (3 if "/batch" in keyed.path else 1)
    assert IdempotentRequest.objects.count() == 1


@pytest.mark.django_db
def test_a_new_key_is_a_new_write(owner, project):
    keyed = batch(owner, project)
    assert keyed.api.post(keyed.path, keyed.body).status_code == 201
    fresh = keyed.api.post(keyed.path, {**keyed.body, "idempotency_key": "batch-2"})
    assert fresh.status_code == 201 and fresh.json()["checkpoint_count"] == 4
    assert keyed.state() == (4, 6, 2)


@pytest.mark.django_db
def test_a_replay_wins_over_a_refusal_decided_since(owner, project):
    """The run the key started has ended and another run is open: the retry still answers the first run."""
    keyed = start_run(owner, project)
    first = keyed.api.post(keyed.path, keyed.body).json()
    assert owner.post(f"/runs/{first['id']}/end", {"outcome": "completed"}).status_code == 200
    again = keyed.api.post(keyed.path, keyed.body)
    assert again.status_code == 201 and again.json()["id"] == first["id"] and again.json()["state"] == "completed"
    # A batch replays after its run ended, too.
    keyed = batch(owner, project)
    first = keyed.api.post(keyed.path, keyed.body).json()
    assert owner.post(f"/runs/{first['run_id']}/end", {"outcome": "completed"}).status_code == 200
    assert keyed.api.post(keyed.path, keyed.body).json() == first


@pytest.mark.django_db
def test_keys_are_scoped_to_their_parent_and_to_the_callers_reach(owner, outsider, project):
    one, two = start_run(owner, project), start_run(owner, project)
    a = one.api.post(one.path, one.body).json()
    b = two.api.post(two.path, two.body).json()  # the same key on another session: its own run
    assert a["id"] != b["id"] and IdempotentRequest.objects.count() == 2
    # Another project's token never sees the key's answer: the session is not found for it.
    resp = outsider.post(one.path, one.body)
    assert resp.status_code == 404, resp.content


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", "with space", "x" * 201, "é"])
def test_a_malformed_key_is_a_422_naming_it_and_writes_nothing(owner, project, key):
    keyed = start_run(owner, project)
    resp = keyed.api.post(keyed.path, {**keyed.body, "idempotency_key": key})
    assert resp.status_code == 422, resp.content
    assert "idempotency_key" in str(resp.json()["error"]["details"])
    assert keyed.state() == (0, 0, 0)


@pytest.mark.django_db
def test_without_a_key_each_request_is_its_own_write(owner, project):
    keyed = hand_off(owner, project)
    body = {k: v for k, v in keyed.body.items() if k != "idempotency_key"}
    assert keyed.api.post(keyed.path, body).status_code == 201
    assert keyed.api.post(keyed.path, body).status_code == 200  # the logical id's own replay
    assert keyed.state() == (1, 1, 0)


def test_the_openapi_schema_declares_each_key_with_its_limit_and_pattern():
    from django.test import Client

    from novelforge_sessions import session_runtime as rt

    schemas = Client().get("/api/openapi.json").json()["components"]["schemas"]
    for name in ("RunIn", "AttachIn", "BatchIn", "HandoffIn", "GateIn"):
        field = schemas[name]["properties"]["idempotency_key"]
        text = next(s for s in field["anyOf"] if s.get("type") == "string")
        assert text["maxLength"] == 200 and field["pattern"] == rt.IDEMPOTENCY_KEY_PATTERN, (name, field)
