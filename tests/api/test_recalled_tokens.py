"""Recalled tokens on the checkpoint, batch and graph writes (apikit/auth.py): one round trip fewer, and
every request still answered as a fresh lookup would answer it.

A token the process looked up in the last ``TOKEN_RECALL_SECONDS`` is not looked up again on
these two routes: the run lock checks its row again in the same statement. Whatever changed on
the row since (revoked, deleted, other permissions, another binding, another name) is in force
on the very next request, and a recalled caller's refusal is always the fresh answer (401 before
a 422 or a 404), with nothing written.
"""
from __future__ import annotations

import base64
import logging
import time

import pytest
from django.http import HttpResponse
from django.test import RequestFactory
from django.utils import timezone

from novelforge_sessions.access import token_label
from novelforge_sessions.apikit.base import answered_with_a_fresh_token
from novelforge_sessions.apikit import auth
from novelforge_sessions.apikit.auth import FRESH_TOKEN_ATTR
from novelforge_sessions.control.models import GraphCheckpoint, GraphWrite
from novelforge_sessions.models import ApiToken, Artifact, Checkpoint, Event, Session
from django.db import connection

from tests.pgwire import round_trips

BODY = {"boundary": "context_freeze", "cursor": {"step": 1}}


def _token(api) -> ApiToken:
    return ApiToken.objects.get(key_hash=ApiToken.hash_key(api.token))


def _change_token(api, **fields) -> ApiToken:
    """Change the token's row behind the process's back (as the admin would)."""
    token = _token(api)
    for name, value in fields.items():
        setattr(token, name, value)
    token.save()
    return token


def _warm(owner, run_id: int) -> None:
    """One checkpoint: the token is looked up, and recalled from then on."""
    assert owner.post(f"/runs/{run_id}/checkpoints", BODY).status_code == 201


@pytest.mark.django_db(transaction=True)
def test_a_recalled_token_is_checked_in_the_run_lock_one_round_trip_fewer(owner, new_session, monkeypatch, settings):
    monkeypatch.setenv("NOVELFORGE_EVENT_ORDER_CHECKS", "0")  # the suite's ordering checks query too
    settings.LIVE_PG_NOTIFY = False
    s = new_session(run=True)
    _warm(owner, s["run"]["id"])
    answers = []
    # the first recalled call prepares the statement for the recalled token's parameter types
    assert owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY).status_code == 201
    trips = round_trips(lambda: answers.append(owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY)))
    assert answers[0].status_code == 201, answers[0].content
    # one statement, its own transaction (no BEGIN or COMMIT of its own), prepared on this
    # connection by the call before: executed again with Bind and Execute only, no text, no Parse
    assert len(trips) == 1, [[kind for kind, _ in trip] for trip in trips]
    assert [kind for kind, _ in trips[0]] == ["Bind", "Describe", "Execute", "Sync"] or \
        [kind for kind, _ in trips[0]] == ["Bind", "Execute", "Sync"], trips
    # the first execution on a fresh connection carries the statement: the run lock with the
    # token's check and the writes
    connection.close()
    trips = round_trips(lambda: answers.append(owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY)))
    texts = [text for trip in trips for kind, text in trip if kind in ("Parse", "Query")]
    write = [t for t in texts if "FOR UPDATE" in t]
    assert len(write) == 1 and "revoked_at IS NULL" in write[0] and "INSERT INTO" in write[0], texts
    assert not any("BEGIN" in t or "COMMIT" in t for t in texts)
    assert not any("key_hash" in t for t in texts)  # no lookup of its own
    # the typed client's default, a fresh idempotency key per call, costs the same one round trip
    trips = round_trips(lambda: answers.append(
        owner.post(f"/runs/{s['run']['id']}/checkpoints", {**BODY, "idempotency_key": "one-round-trip"})))
    assert answers[-1].status_code == 201 and len(trips) == 1, trips
    del answers[1:]
    settings.TOKEN_RECALL_SECONDS = 0  # off: looked up on every request
    auth.forget_recalled()
    _warm(owner, s["run"]["id"])
    trips = round_trips(lambda: answers.append(owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY)))
    assert answers[1].status_code == 201 and len(trips) == 2, trips
    assert "key_hash" in trips[0][0][1]


@pytest.mark.django_db
@pytest.mark.parametrize("what", ["valid", "invalid body", "no such run", "oversized cursor", "batch"])
def test_a_revoked_token_is_refused_on_the_next_request_whatever_else_it_sends(owner, new_session, what):
    s = new_session(run=True)
    run_id = s["run"]["id"]
    _warm(owner, run_id)
    assert owner.post(f"/runs/{run_id}/batch", {"items": [{"kind": "checkpoint", "checkpoint": BODY}]}).status_code == 201
    _change_token(owner, revoked_at=timezone.now())
    before = (Checkpoint.objects.count(), Event.objects.count())
    path, body = {
        "valid": (f"/runs/{run_id}/checkpoints", BODY),
        "invalid body": (f"/runs/{run_id}/checkpoints", {"boundary": "nope"}),
        "no such run": (f"/runs/{run_id + 1000}/checkpoints", BODY),
        "oversized cursor": (f"/runs/{run_id}/checkpoints", {**BODY, "cursor": {"x": "y" * 20_000}}),
        "batch": (f"/runs/{run_id}/batch", {"items": [{"kind": "checkpoint", "checkpoint": BODY}]}),
    }[what]
    resp = owner.post(path, body)
    assert resp.status_code == 401, resp.content
    assert resp.json()["error"]["code"] == "unauthorized"
    assert (Checkpoint.objects.count(), Event.objects.count()) == before


@pytest.mark.django_db
def test_a_deleted_token_is_refused(owner, new_session):
    s = new_session(run=True)
    _warm(owner, s["run"]["id"])
    _token(owner).delete()
    before = Checkpoint.objects.count()
    assert owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY).status_code == 401
    assert Checkpoint.objects.count() == before


@pytest.mark.django_db
def test_permissions_taken_away_are_in_force_at_once(owner, new_session):
    s = new_session(run=True)
    _warm(owner, s["run"]["id"])
    token = _change_token(owner, permissions=["read"])
    before = Checkpoint.objects.count()
    resp = owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY)
    assert resp.status_code == 403 and resp.json()["error"]["details"]["permission"] == "write"
    assert Checkpoint.objects.count() == before
    token.permissions = ["read", "write"]
    token.save()
    assert owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY).status_code == 201


@pytest.mark.django_db
def test_binding_the_token_to_another_session_is_in_force_at_once(owner, new_session):
    first, second = new_session(run=True), new_session()
    _warm(owner, first["run"]["id"])
    _change_token(owner, session=Session.objects.get(id=second["id"]))
    before = Checkpoint.objects.count()
    assert owner.post(f"/runs/{first['run']['id']}/checkpoints", BODY).status_code == 404  # out of its reach now
    assert Checkpoint.objects.count() == before


@pytest.mark.django_db
def test_a_renamed_token_writes_under_its_new_name(owner, new_session):
    s = new_session(run=True)
    _warm(owner, s["run"]["id"])
    token = _change_token(owner, name="renamed")
    resp = owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY)
    assert resp.status_code == 201
    event = Event.objects.filter(type="checkpoint.recorded").order_by("-id").first()
    assert event.payload["checkpoint_id"] == resp.json()["id"]
    assert event.actor == token_label("renamed", token.id)


@pytest.mark.django_db
def test_a_recalled_callers_refusal_is_the_fresh_one_and_is_logged_once(owner, new_session, caplog):
    s = new_session(run=True)
    _warm(owner, s["run"]["id"])
    assert owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed"}).status_code == 200
    with caplog.at_level(logging.INFO, logger="novelforge.api"):
        resp = owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY)
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "run_not_open"
    assert [r.getMessage() for r in caplog.records if "refused" in r.getMessage()] == [
        f"refused POST /api/v1/runs/{s['run']['id']}/checkpoints: run_not_open checkpoints are written by an open run"
    ]


@pytest.mark.django_db
def test_a_recalled_token_is_looked_up_again_once_its_time_is_up(owner, new_session, monkeypatch, settings):
    s = new_session(run=True)
    _warm(owner, s["run"]["id"])
    looked_up = []
    real = auth._look_up
    monkeypatch.setattr(auth, "_look_up", lambda key: looked_up.append(key) or real(key))
    assert owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY).status_code == 201
    assert looked_up == []  # recalled
    [(key, (until, recalled))] = auth._RECALLED.items()
    assert 0 < until - time.monotonic() <= settings.TOKEN_RECALL_SECONDS  # recalled for TOKEN_RECALL_SECONDS
    auth._RECALLED[key] = (time.monotonic() - 1, recalled)  # its time is up (no clock patched, no sleep)
    assert owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY).status_code == 201
    assert len(looked_up) == 1  # its time was up: looked up (and recalled again from then on)
    assert owner.post(f"/runs/{s['run']['id']}/checkpoints", BODY).status_code == 201
    assert len(looked_up) == 1


@pytest.mark.django_db
def test_only_the_routes_that_check_it_recall_a_token(owner, new_session, monkeypatch):
    s = new_session(run=True)
    _warm(owner, s["run"]["id"])
    looked_up = []
    real = auth._look_up
    monkeypatch.setattr(auth, "_look_up", lambda key: looked_up.append(key) or real(key))
    assert owner.get(f"/runs/{s['run']['id']}").status_code == 200
    assert owner.post(f"/runs/{s['run']['id']}/cursor", {"cursor": {"step": 2}}).status_code == 200
    assert len(looked_up) == 2


def test_the_answer_to_a_recalled_caller():
    """A success stands only when the action confirmed the token; a refusal is answered again
    with the token looked up; a success nobody confirmed is an internal error, never the success."""
    request = RequestFactory().post("/api/v1/runs/1/checkpoints")
    again = []

    def answer_again() -> HttpResponse:
        again.append(getattr(request, FRESH_TOKEN_ATTR, False))
        return HttpResponse(status=404)

    assert answered_with_a_fresh_token(request, HttpResponse(status=201), True, answer_again).status_code == 201
    assert again == []
    assert answered_with_a_fresh_token(request, HttpResponse(status=503), False, answer_again).status_code == 503
    assert again == []
    assert answered_with_a_fresh_token(request, HttpResponse(status=422), False, answer_again).status_code == 404
    assert again == [True]
    request = RequestFactory().post("/api/v1/runs/1/checkpoints")
    unconfirmed = answered_with_a_fresh_token(request, HttpResponse(status=201), False, answer_again)
    assert unconfirmed.status_code == 500 and b"internal_error" in unconfirmed.content
    assert again == [True]


# ---------------------------------------------------------------- the graph put and writes
def _graph_put(thread: str, cp: str, parent: str | None = None) -> dict:
    value = {"serde": "json", "data": base64.b64encode(f"step {cp}".encode()).decode()}
    return {"thread_id": thread, "checkpoint_id": cp, "parent_checkpoint_id": parent,
            "checkpoint": {"v": 1, "id": cp, "ts": "2026-12-01T00:00:00+00:00", "channel_versions": {"step": cp},
                           "versions_seen": {}},
            "metadata": {"source": "loop"}, "blobs": [{"channel": "step", "version": cp, "value": value}],
            "open": {"task_mode": "drafting"}}


def _graph_writes(thread: str, cp: str) -> dict:
    value = {"serde": "json", "data": base64.b64encode(f"write {cp}".encode()).decode()}
    return {"thread_id": thread, "checkpoint_id": cp, "task_id": "task", "writes": [
        {"idx": 0, "channel": "step", "value": value}]}


def _graph_rows() -> tuple[int, int, int, int]:
    return (GraphCheckpoint.objects.count(), GraphWrite.objects.count(), Checkpoint.objects.count(),
            Artifact.objects.count())


@pytest.mark.django_db(transaction=True)
def test_the_graph_put_and_writes_check_a_recalled_token_in_the_thread_lock(owner, monkeypatch, settings):
    monkeypatch.setenv("NOVELFORGE_EVENT_ORDER_CHECKS", "0")
    settings.LIVE_PG_NOTIFY = False
    looked_up = []
    real = auth._look_up
    monkeypatch.setattr(auth, "_look_up", lambda key: looked_up.append(key) or real(key))
    assert owner.post("/graph-threads/checkpoints", _graph_put("first", "0001")).status_code == 201
    assert len(looked_up) == 1  # looked up, and recalled from then on
    # A recalled caller reaching no thread yet is answered again with its token looked up (the
    # thread is opened for the looked-up caller): the put opens the thread, once.
    opened = owner.post("/graph-threads/checkpoints", _graph_put("t", "0001"))
    assert opened.status_code == 201, opened.content
    assert len(looked_up) == 2 and Session.objects.count() == 2
    del looked_up[:]
    answers = []
    connection.close()  # a fresh connection sends each statement's text (Parse)
    trips = round_trips(lambda: answers.append(owner.post("/graph-threads/writes", _graph_writes("t", "0002"))))
    trips += round_trips(lambda: answers.append(owner.post("/graph-threads/checkpoints", _graph_put("t", "0002", "0001"))))
    assert [a.status_code for a in answers] == [200, 201], [a.content for a in answers]
    assert looked_up == []  # no lookup of their own
    texts = [text for trip in trips for kind, text in trip if kind in ("Parse", "Query")]
    assert not any("key_hash" in t for t in texts), texts
    locks = [t for t in texts if "FOR UPDATE OF s" in t]
    # the one lock statement (prepared by the first request, executed again by the second)
    assert len(locks) == 1 and "revoked_at IS NULL" in locks[0], texts
    # revoked behind the process's back: refused at once on both routes, nothing written
    _change_token(owner, revoked_at=timezone.now())
    before = _graph_rows()
    for path, body in (("/graph-threads/writes", _graph_writes("t", "0003")),
                       ("/graph-threads/checkpoints", _graph_put("t", "0003", "0002")),
                       ("/graph-threads/checkpoints", _graph_put("another", "0001"))):
        resp = owner.post(path, body)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized", (path, resp.content)
    assert _graph_rows() == before and Session.objects.count() == 2


@pytest.mark.django_db
def test_a_graph_write_by_a_token_rebound_elsewhere_gets_the_fresh_answer_and_writes_nothing(owner, new_session):
    assert owner.post("/graph-threads/checkpoints", _graph_put("t", "0001")).status_code == 201
    assert owner.post("/graph-threads/checkpoints", _graph_put("t", "0002", "0001")).status_code == 201  # recalled
    other = new_session()
    _change_token(owner, session=Session.objects.get(id=other["id"]))
    before = _graph_rows()
    # out of its reach now: the thread is not found, and a bound token may not open one
    for path, body, status, code in (("/graph-threads/checkpoints", _graph_put("t", "0003", "0002"), 403, "forbidden"),
                                     ("/graph-threads/writes", _graph_writes("t", "0003"), 404, "not_found")):
        resp = owner.post(path, body)
        assert resp.status_code == status and resp.json()["error"]["code"] == code, resp.content
    assert _graph_rows() == before
