"""Handoffs: frozen jobs, claims under leases, fencing tokens (docs/model.md#handoffs)."""
from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from novelforge_sessions.control import handoffs as actions
from novelforge_sessions.errors import HandoffNotClaimable
from novelforge_sessions.control.models import Handoff, ResultDelivery
from novelforge_sessions.models import Event, Run, Session
from tests.support.factories import caller_for, make_project
from tests.control.conftest import Statements, claim, deliver, make_handoff
from tests.support.races import oks, race
from tests.support.responses import ok, refused

pytestmark = pytest.mark.django_db


def expire(handoff_id: int) -> None:
    """Time passes: the lease runs out (set in the database, no sleeping)."""
    Handoff.objects.filter(id=handoff_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


# ---- creation -----------------------------------------------------------------------------------------
def test_handing_off_freezes_the_job_and_waits(owner, frozen):
    h = frozen["handoff"]
    art = frozen["artifact"]
    inputs = [{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}]
    expected = "sha256:" + hashlib.sha256(json.dumps(
        {"inputs": inputs, "params": {"task": "check continuity"}, "result_schema": {"verdict": "string"}},
        sort_keys=True, separators=(",", ":"),
    ).encode()).hexdigest()
    assert h["job_fingerprint"] == expected  # server-computed over the frozen refs
    assert h["state"] == "pending" and h["attempt"] == 0 and h["fencing_token"] == 0
    assert h["inputs"] == inputs and h["required_capabilities"] == ["continuity"] and h["timeout_seconds"] == 60
    session = Session.objects.get(id=frozen["session"]["id"])
    assert session.status == "awaiting_external"
    run = Run.objects.get(id=frozen["run"]["id"])
    assert run.state == "open" and run.pending_external == ["chapter-1/continuity"]
    types = list(Event.objects.filter(session_id=session.id).order_by("id").values_list("type", flat=True))
    assert types[-2:] == ["handoff.created", "session.transitioned"]


def test_a_logical_id_of_the_declared_maximum_hands_off(owner, running):
    """A declared-valid 200-character logical id (path-like, as workers name jobs): the session's
    reason ("waiting on handoff <id>") is longer than its column and is stored cut to fit, never
    a 500 (182 characters and up once failed in the database)."""
    logical_id = ("chapter-3/continuity-check/" * 8)[:199] + "z"
    assert len(logical_id) == 200
    h = make_handoff(owner, running["run"]["id"], logical_id)
    assert h["logical_id"] == logical_id and Handoff.objects.filter(logical_id=logical_id).count() == 1
    session = Session.objects.get(id=running["id"])
    assert session.status == "awaiting_external"
    assert session.status_reason == f"waiting on handoff {logical_id}"[:200] and len(session.status_reason) == 200
    event = Event.objects.filter(session_id=session.id, type="session.transitioned").latest("id")
    assert event.payload["reason"] == session.status_reason  # the event says what was stored
    assert Run.objects.get(id=running["run"]["id"]).pending_external == [logical_id]


def test_a_second_handoff_while_waiting_keeps_waiting(owner, frozen):
    second = make_handoff(owner, frozen["run"]["id"], "chapter-1/style")
    assert second["state"] == "pending"
    assert Session.objects.get(id=frozen["session"]["id"]).status == "awaiting_external"
    assert Run.objects.get(id=frozen["run"]["id"]).pending_external == ["chapter-1/continuity", "chapter-1/style"]


def test_an_identical_replay_returns_the_first_handoff(owner, frozen):
    h = frozen["handoff"]
    body = {
        "logical_id": h["logical_id"], "inputs": h["inputs"], "params": h["params"], "result_schema": h["result_schema"],
        "required_capabilities": h["required_capabilities"], "timeout_seconds": 60,
    }
    again = ok(owner.post(f"/runs/{frozen['run']['id']}/handoffs", body), 200)
    assert again["id"] == h["id"]
    assert Handoff.objects.count() == 1


def test_a_logical_id_names_one_job_per_project(owner, frozen, new_session):
    other = new_session(run=True)
    err = refused(owner.post(f"/runs/{other['run']['id']}/handoffs", {"logical_id": "chapter-1/continuity"}), 409, "logical_id_taken")
    assert err["details"]["handoff_id"] is None  # another session's job is not revealed
    assert Handoff.objects.count() == 1
    assert Session.objects.get(id=other["id"]).status == "running"


def test_a_different_job_under_the_same_logical_id_is_refused(owner, frozen):
    refused(owner.post(f"/runs/{frozen['run']['id']}/handoffs",
                       {"logical_id": "chapter-1/continuity", "params": {"task": "other"}}), 409, "logical_id_taken")


def test_same_logical_id_in_another_project_is_independent(owner, outsider, frozen):
    s = ok(outsider.post("/sessions", {"role": "writer", "memory_policy": "bounded", "task_mode": "drafting",
                                       "runtime_family": "codex", "runtime": {"runtime_family": "codex"}}), 201)
    run = ok(outsider.post(f"/sessions/{s['id']}/runs", {}), 201)
    assert make_handoff(outsider, run["id"], "chapter-1/continuity")["id"] != frozen["handoff"]["id"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"logical_id": " spaced"}, "logical_id"),
        ({"logical_id": "ok", "inputs": [{"artifact_id": 1, "fingerprint": "md5:x"}]}, "inputs[0].fingerprint"),
        ({"logical_id": "ok", "result_schema": {"x": "date"}}, "result_schema.x"),
        ({"logical_id": "ok", "required_capabilities": ["Bad Cap"]}, "required_capabilities"),
        ({"logical_id": "ok", "timeout_seconds": 0}, "timeout_seconds"),
        ({"logical_id": "ok", "colour": "blue"}, "colour"),
    ],
)
def test_bad_jobs_are_typed_422_and_write_nothing(owner, running, body, field):
    err = refused(owner.post(f"/runs/{running['run']['id']}/handoffs", body), 422, "validation_error")
    assert err["details"]["field"] == field
    assert Handoff.objects.count() == 0
    assert Session.objects.get(id=running["id"]).status == "running"


def test_inputs_must_name_real_versions(owner, running):
    err = refused(owner.post(f"/runs/{running['run']['id']}/handoffs", {
        "logical_id": "j", "inputs": [{"artifact_id": 999, "fingerprint": "sha256:" + "0" * 64}]}), 422, "unknown_artifact_version")
    assert err["details"]["missing"] == [{"artifact_id": 999, "fingerprint": "sha256:" + "0" * 64}]


def test_only_an_open_run_of_a_running_session_hands_off(owner, new_session):
    s = new_session(run=True)
    ok(owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed"}))
    refused(owner.post(f"/runs/{s['run']['id']}/handoffs", {"logical_id": "late"}), 409, "run_not_open")
    waiting = new_session(run=True)
    ok(owner.post(f"/sessions/{waiting['id']}/transition", {"to": "awaiting_user"}))
    refused(owner.post(f"/runs/{waiting['run']['id']}/handoffs", {"logical_id": "x"}), 409, "session_not_running")


def test_writing_a_handoff_needs_write(reader, worker, running, outsider):
    refused(reader.post(f"/runs/{running['run']['id']}/handoffs", {"logical_id": "x"}), 403, "forbidden")
    refused(worker.post(f"/runs/{running['run']['id']}/handoffs", {"logical_id": "x"}), 403, "forbidden")
    refused(outsider.post(f"/runs/{running['run']['id']}/handoffs", {"logical_id": "x"}), 404, "not_found")


# ---- claims --------------------------------------------------------------------------------------------
def test_a_worker_claims_a_matching_handoff_with_a_lease(worker, frozen):
    got = claim(worker, ["continuity", "style"], worker="w-a")
    assert got["id"] == frozen["handoff"]["id"]
    assert got["state"] == "claimed" and got["attempt"] == 1 and got["fencing_token"] == 1
    assert got["lease_holder"] == "w-a" and got["lease_expired"] is False
    h = Handoff.objects.get(id=got["id"])
    assert timedelta(seconds=59) < h.lease_expires_at - h.claimed_at <= timedelta(seconds=60)
    ev = Event.objects.filter(type="handoff.claimed").get()
    assert ev.payload["fencing_token"] == 1 and ev.payload["reclaimed_after_expiry"] is False


def test_capabilities_must_cover_the_job(worker, frozen):
    assert claim(worker, ["style"]) is None
    assert Handoff.objects.get().state == "pending"
    err = refused(worker.post("/handoffs/claim", {"worker": "w", "capabilities": ["style"],
                                                  "handoff_id": frozen["handoff"]["id"]}), 409, "handoff_not_claimable")
    assert err["details"]["missing_capabilities"] == ["continuity"]


def test_claiming_needs_the_work_permission(writer, reader, frozen):
    refused(writer.post("/handoffs/claim", {"worker": "w", "capabilities": ["continuity"]}), 403, "forbidden")
    refused(reader.post("/handoffs/claim", {"worker": "w", "capabilities": ["continuity"]}), 403, "forbidden")
    assert Handoff.objects.get().state == "pending"


def test_a_held_lease_is_not_claimable(worker, frozen):
    claim(worker, ["continuity"])
    assert claim(worker, ["continuity"], worker="w2") is None
    err = refused(worker.post("/handoffs/claim", {"worker": "w2", "capabilities": ["continuity"],
                                                  "handoff_id": frozen["handoff"]["id"]}), 409, "handoff_not_claimable")
    assert err["details"]["lease_held"] is True


def test_an_expired_lease_is_reclaimed_with_attempt_plus_one(worker, frozen):
    first = claim(worker, ["continuity"], worker="w-a")
    expire(first["id"])
    assert ok(worker.get(f"/handoffs/{first['id']}"))["lease_expired"] is True
    second = claim(worker, ["continuity"], worker="w-b")
    assert second["id"] == first["id"]
    assert (second["attempt"], second["fencing_token"], second["lease_holder"]) == (2, 2, "w-b")
    ev = Event.objects.filter(type="handoff.claimed").order_by("-id").first()
    assert ev.payload["reclaimed_after_expiry"] is True and ev.payload["previous_holder"] == "w-a"


def test_an_old_fencing_token_is_refused_everywhere(worker, frozen):
    first = claim(worker, ["continuity"], worker="w-a")
    expire(first["id"])
    second = claim(worker, ["continuity"], worker="w-b")
    err = refused(worker.post(f"/handoffs/{first['id']}/heartbeat", {"fencing_token": 1}), 409, "stale_lease")
    assert err["details"]["current_fencing_token"] == 2
    err = refused(deliver(worker, first, {"verdict": "fine"}, token=1), 409, "stale_lease")
    h = Handoff.objects.get()
    assert h.state == "claimed" and h.lease_holder == "w-b"
    assert list(ResultDelivery.objects.values_list("outcome", "fencing_token")) == [("stale_lease", 1)]
    # the current holder is unaffected
    ok(worker.post(f"/handoffs/{second['id']}/heartbeat", {"fencing_token": 2}))
    assert ok(deliver(worker, second, {"verdict": "fine"}))["outcome"] == "consumed"


def test_heartbeat_extends_the_lease(worker, frozen):
    got = claim(worker, ["continuity"])
    Handoff.objects.filter(id=got["id"]).update(lease_expires_at=timezone.now() + timedelta(seconds=5))
    lease = ok(worker.post(f"/handoffs/{got['id']}/heartbeat", {"fencing_token": 1}))
    h = Handoff.objects.get()
    assert h.lease_expires_at > timezone.now() + timedelta(seconds=50)
    assert lease["attempt"] == 1 and lease["fencing_token"] == 1


def test_heartbeat_of_an_unknown_or_unclaimed_handoff(worker, outsider, frozen):
    refused(worker.post(f"/handoffs/{frozen['handoff']['id']}/heartbeat", {"fencing_token": 0}), 422, "validation_error")
    refused(worker.post(f"/handoffs/{frozen['handoff']['id']}/heartbeat", {"fencing_token": 1}), 409, "stale_lease")
    refused(outsider.post(f"/handoffs/{frozen['handoff']['id']}/heartbeat", {"fencing_token": 1}), 404, "not_found")


def test_claims_skip_handoffs_of_terminated_sessions(owner, worker, frozen):
    ok(owner.post(f"/sessions/{frozen['session']['id']}/transition", {"to": "terminated"}))
    assert claim(worker, ["continuity"]) is None


def test_claim_and_heartbeat_query_counts(worker, frozen, project, django_assert_max_num_queries):
    who = caller_for(project, ["read", "work"])
    with Statements() as claimed:
        got = actions.claim_handoff(who, worker="w", capabilities=["continuity"])
    # the candidate's session with its ordering lock, the claiming UPDATE … RETURNING, its event
    assert len(claimed) == 3, claimed.sql
    with django_assert_max_num_queries(1):  # one conditional UPDATE, no transaction
        actions.heartbeat_handoff(who, got.id, fencing_token=got.fencing_token)


def test_cancel_a_waiting_handoff_resumes_the_run(owner, frozen):
    done = ok(owner.post(f"/handoffs/{frozen['handoff']['id']}/cancel", {"reason": "not needed"}))
    assert done["state"] == "cancelled"
    assert Session.objects.get(id=frozen["session"]["id"]).status == "running"
    assert Run.objects.get(id=frozen["run"]["id"]).pending_external == []


# ---- races --------------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_two_racing_claims_leave_one_holder():
    from novelforge_sessions.actions.runs import start_run
    from novelforge_sessions.actions.runtimes import RuntimeSpec
    from novelforge_sessions.actions.sessions import NewSession, create_session

    project = make_project("race")
    who = caller_for(project)
    rounds = 10
    for i in range(rounds):
        s = create_session(who, NewSession("writer", "bounded", "drafting", "codex"), runtime=RuntimeSpec("codex"))
        run = start_run(who, s.id)
        h = actions.create_handoff(who, run.id, logical_id=f"race-{i}").handoff
        results = race(lambda n: actions.claim_handoff(who, worker=f"w{n}", capabilities=[], handoff_id=h.id), 2)
        # the loser is refused as not claimable; nothing else may happen to either
        assert all(kind == "ok" or value == HandoffNotClaimable.code for kind, value in results), results
        got = [(f"w{n}", value if kind == "ok" else None) for n, (kind, value) in enumerate(results)]
        winners = [(name, c) for name, c in got if c is not None]
        assert len(winners) == 1
        fresh = Handoff.objects.get(id=h.id)
        assert fresh.attempt == 1 and fresh.fencing_token == 1 and fresh.lease_holder == winners[0][0]
    assert Event.objects.filter(type="handoff.claimed").count() == rounds


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("sessions", [1, 6])  # 6: claims that lose a session retry the next (no deadlock)
def test_a_pool_of_workers_claims_every_queued_handoff_exactly_once(sessions):
    from novelforge_sessions.actions.runs import start_run
    from novelforge_sessions.actions.runtimes import RuntimeSpec
    from novelforge_sessions.actions.sessions import NewSession, create_session

    project = make_project("pool")
    who = caller_for(project)
    queued = []
    for n in range(sessions):
        s = create_session(who, NewSession("writer", "bounded", "drafting", "codex"), runtime=RuntimeSpec("codex"))
        run = start_run(who, s.id)
        queued += [actions.create_handoff(who, run.id, logical_id=f"q-{n}-{i}").handoff.id for i in range(24 // sessions)]
    def work(n: int) -> list[int]:
        claimed = []
        while (got := actions.claim_handoff(who, worker=f"w{n}", capabilities=[])) is not None:
            claimed.append(got.id)
        return claimed

    claims = [(f"w{n}", h) for n, ids in enumerate(oks(race(work, 8))) for h in ids]
    assert sorted(h for _, h in claims) == sorted(queued)  # every job once, none twice
    assert set(Handoff.objects.values_list("attempt", "fencing_token", "state")) == {(1, 1, "claimed")}
    holders = dict(Handoff.objects.values_list("id", "lease_holder"))
    assert all(holders[h] == name for name, h in claims)


def test_claiming_a_handoff_id_beyond_bigint_is_404_not_500(worker, frozen):
    """The claim's raw SQL casts the id to bigint: a larger one names no row, as the ORM would say."""
    refused(worker.post("/handoffs/claim", {"worker": "w", "handoff_id": 2**70}), 404, "not_found")
    assert Handoff.objects.get().state == "pending"


def test_a_handoff_id_must_be_a_json_integer(worker, frozen):
    err = refused(worker.post("/handoffs/claim", {"worker": "w", "handoff_id": True}), 422, "validation_error")
    assert err["details"]["field"] == "handoff_id"
    assert Handoff.objects.get().state == "pending"
