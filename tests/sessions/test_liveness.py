"""Liveness is derived from the lease, never stored (docs/model.md#runtimes-and-leases).

A runtime whose record still says ``live`` after its lease ran out is not live: it blocks no
resume, attach or forget (each tidies it inline, as the reconciler would), starts no run, reads
out ``live: false, lease_expired: true`` and shows "lease expired" on the session page. One
reconciler pass drains every lease expired when it started. Attaching to a session that can
never run again is refused by the lifecycle first.
"""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.control.resume import resume_session
from novelforge_sessions.actions.runtimes import RuntimeSpec, reconcile_expired_runtimes
from novelforge_sessions.models import Event, Run, RuntimeAttachment, Session

from tests.support.factories import RUNTIME, caller_for, make_project
from tests.dashboard.conftest import logged_in, make_user
from tests.support.snapshots import snapshot
from tests.support.races import oks, race

S = rt.SessionStatus
LIVE, LOST, CLOSED = rt.RuntimeState.LIVE, rt.RuntimeState.LOST, rt.RuntimeState.CLOSED


def expire(session_id: int) -> RuntimeAttachment:
    """The runtime stopped heartbeating a second ago; no reconciler has run."""
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {RuntimeAttachment._meta.db_table} SET lease_expires_at = now() - interval '1 second' "
            "WHERE session_id = %s AND state = %s",
            [session_id, LIVE.value],
        )
        assert cur.rowcount == 1
    return RuntimeAttachment.objects.get(session_id=session_id, state=LIVE)


def put_in(owner, new_session, status: S) -> dict:
    """A session with a live runtime (generation 1) in ``status``."""
    s = new_session(run=status is not S.CREATED)
    if status is S.IDLE:
        assert owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed"}).status_code == 200
    elif status in (S.AWAITING_USER, S.AWAITING_EXTERNAL):
        assert owner.post(f"/sessions/{s['id']}/transition", {"to": status.value}).status_code == 200
    got = owner.get(f"/sessions/{s['id']}").json()
    assert got["status"] == status
    return {**got, "run": s.get("run")}


def types_for(session_id: int) -> list[str]:
    return list(Event.objects.filter(session_id=session_id).order_by("id").values_list("type", flat=True))


# ---- an expired record blocks nothing -----------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("status", [S.RUNNING, S.IDLE, S.AWAITING_USER])
def test_an_expired_runtime_does_not_block_resume(owner, new_session, status):
    s = put_in(owner, new_session, status)
    old = expire(s["id"])
    resp = owner.post(f"/sessions/{s['id']}/resume", {"runtime": RUNTIME})
    assert resp.status_code == 200, resp.content
    assert resp.json()["ok"] is True and resp.json()["generation"] == 2
    old.refresh_from_db()
    assert (old.state, old.end_reason) == (LOST, "runtime_lost")
    new = RuntimeAttachment.objects.get(session_id=s["id"], state=LIVE)
    assert new.generation == 2 and new.live
    session = Session.objects.get(id=s["id"])
    assert session.status == S.RUNNING and session.generation == 2
    kinds = types_for(s["id"])
    assert kinds.count("runtime.lost") == 1 and kinds.index("runtime.lost") < kinds.index("session.resumed")
    lost = Event.objects.get(session_id=s["id"], type="runtime.lost")
    assert lost.payload == {"runtime_id": old.id, "generation": 1, "reason": "runtime_lost"}
    transitions = [
        (e.payload["from"], e.payload["to"], e.payload["reason"])
        for e in Event.objects.filter(session_id=s["id"], type="session.transitioned", id__gt=lost.id).order_by("id")
    ]
    if status is S.RUNNING:
        # tidied exactly as the reconciler would: running → failed / runtime_lost, then resumed
        assert transitions == [("running", "failed", "runtime_lost"), ("failed", "running", "run started")]
        assert Run.objects.filter(session_id=s["id"], state=rt.RunState.INTERRUPTED).count() == 1
    else:
        assert transitions == [(status.value, "running", "run started")]


@pytest.mark.django_db
def test_a_dry_run_resume_past_an_expired_runtime_writes_nothing(owner, new_session):
    s = put_in(owner, new_session, S.RUNNING)
    expire(s["id"])
    before = snapshot()
    resp = owner.post(f"/sessions/{s['id']}/resume", {"runtime": RUNTIME, "dry_run": True})
    assert resp.status_code == 200, resp.content
    assert resp.json()["ok"] is True and resp.json()["dry_run"] is True and resp.json()["generation"] is None
    assert snapshot() == before, "a dry run tidies nothing, records no event"
    # ... and the real resume then does what the dry run reported.
    assert owner.post(f"/sessions/{s['id']}/resume", {"runtime": RUNTIME}).json()["generation"] == 2


@pytest.mark.django_db
def test_a_refused_resume_leaves_the_expired_record_as_it_was(owner, new_session):
    s = _never_running(owner, new_session, S.COMPLETED, expired=True)
    before = snapshot()
    resp = owner.post(f"/sessions/{s['id']}/resume", {"runtime": RUNTIME})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "illegal_transition"
    assert snapshot() == before


@pytest.mark.django_db
def test_a_runtime_still_live_by_its_lease_still_blocks_resume_attach_and_forget(owner, new_session):
    s = put_in(owner, new_session, S.IDLE)
    before = snapshot()
    for method, path, body in [
        ("post", f"/sessions/{s['id']}/resume", {"runtime": RUNTIME}),
        ("post", f"/sessions/{s['id']}/runtimes", RUNTIME),
        ("delete", f"/sessions/{s['id']}", None),
    ]:
        resp = owner.post(path, body) if method == "post" else owner.delete(path)
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "live_runtime_exists", (path, resp.content)
    assert snapshot() == before


@pytest.mark.django_db
def test_an_expired_runtime_does_not_block_forget(owner, new_session):
    s = put_in(owner, new_session, S.RUNNING)
    old = expire(s["id"])
    resp = owner.delete(f"/sessions/{s['id']}")
    assert resp.status_code == 204, resp.content
    assert not Session.objects.filter(id=s["id"]).exists() and not RuntimeAttachment.objects.filter(id=old.id).exists()
    kinds = types_for(s["id"])
    assert kinds[-4:] == ["runtime.lost", "run.ended", "session.transitioned", "session.forgotten"], kinds


@pytest.mark.django_db
@pytest.mark.parametrize("status", [S.RUNNING, S.IDLE, S.CREATED])
def test_an_expired_runtime_does_not_block_attach(owner, new_session, status):
    s = put_in(owner, new_session, status)
    old = expire(s["id"])
    resp = owner.post(f"/sessions/{s['id']}/runtimes", RUNTIME)
    assert resp.status_code == 201, resp.content
    assert resp.json()["generation"] == 2 and resp.json()["live"] is True and resp.json()["lease_expired"] is False
    old.refresh_from_db()
    assert (old.state, old.end_reason) == (LOST, "runtime_lost")
    session = Session.objects.get(id=s["id"])
    # the reconciler's rule: only a running session fails; the others keep their state
    expected = (S.FAILED, "runtime_lost") if status is S.RUNNING else (status, s["status_reason"])
    assert (session.status, session.status_reason) == expected
    tail = ["runtime.lost", "session.transitioned", "run.ended"] if status is S.RUNNING else ["runtime.lost"]
    assert sorted(types_for(s["id"])[-len(tail) - 1:-1]) == sorted(tail) and types_for(s["id"])[-1] == "runtime.attached"
    assert RuntimeAttachment.objects.filter(session_id=s["id"], state=LIVE).count() == 1


@pytest.mark.django_db
def test_an_expired_runtime_starts_no_run(owner, new_session):
    s = put_in(owner, new_session, S.CREATED)
    expire(s["id"])
    before = snapshot()
    resp = owner.post(f"/sessions/{s['id']}/runs", {"cursor": {"step": "start"}})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "no_live_runtime"
    assert snapshot() == before


@pytest.mark.django_db
def test_a_heartbeat_on_an_expired_lease_stays_refused(owner, new_session):
    s = put_in(owner, new_session, S.RUNNING)
    old = expire(s["id"])
    before = snapshot()
    resp = owner.post(f"/runtimes/{old.id}/heartbeat", {})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "runtime_not_live"
    assert resp.json()["error"]["details"]["lease_expired"] is True
    assert snapshot() == before


@pytest.mark.django_db
def test_runtime_read_outs_derive_live_and_lease_expired(owner, new_session):
    fresh, stale, closed = new_session(), new_session(), new_session()
    old = expire(stale["id"])
    owner.post(f"/sessions/{closed['id']}/close")

    def flags(body: dict) -> tuple:
        return body["state"], body["live"], body["lease_expired"]

    assert flags(owner.get(f"/runtimes/{old.id}").json()) == ("live", False, True)
    listed = owner.get(f"/sessions/{stale['id']}/runtimes").json()["items"]
    assert [flags(r) for r in listed] == [("live", False, True)]
    assert [flags(r) for r in owner.get(f"/sessions/{fresh['id']}/runtimes").json()["items"]] == [("live", True, False)]
    assert [flags(r) for r in owner.get(f"/sessions/{closed['id']}/runtimes").json()["items"]] == [("closed", False, False)]
    schema = owner.client.get("/api/openapi.json").json()["components"]["schemas"]["RuntimeOut"]
    assert {"live", "lease_expired"} <= set(schema["required"])
    # routing offers only runtimes live by their lease
    routed = owner.get("/routing/runtimes", capability="draft").json()
    assert sorted(r["session_id"] for r in routed) == sorted([fresh["id"]])


@pytest.mark.django_db
def test_the_session_page_shows_lease_expired_not_live(project, owner, new_session):
    s = put_in(owner, new_session, S.RUNNING)
    client = logged_in(make_user("watcher", project))
    page = client.get(f"/sessions/{s['id']}/").content.decode()
    assert 'data-field="runtime-state" data-lease-expires=' in page and ">live</span>" in page
    expire(s["id"])
    page = client.get(f"/sessions/{s['id']}/").content.decode()
    assert ">lease expired</span>" in page
    assert ">live</span>" not in page, "no green live badge for a runtime whose lease ran out"
    assert "No runtime is live." in page, "close is not offered for a runtime that is gone"
    assert f'href="/sessions/{s["id"]}/resume/"' in page, "resume is: it records the loss first"
    dry = client.get(f"/sessions/{s['id']}/resume/")
    assert dry.status_code == 200 and "generation 2" in dry.content.decode()
    assert RuntimeAttachment.objects.get(session_id=s["id"]).state == LIVE, "the page's dry run wrote nothing"
    overview = client.get("/").content.decode()
    assert "lease expired" in overview
    panels = client.get(f"/sessions/{s['id']}/panels/").json()["panels"]
    assert ">lease expired</span>" in panels["runtimes"] and ">live</span>" not in panels["identity"]
    reconcile_expired_runtimes()
    page = client.get(f"/sessions/{s['id']}/").content.decode()
    assert ">lost</span>" in page and "runtime_lost" in page and 'data-state="failed"' in page


# ---- one pass drains -------------------------------------------------------------------
@pytest.mark.django_db
def test_one_reconciler_pass_drains_every_expired_lease(capsys):
    who = caller_for(make_project("drain"))
    spec = sessions.NewSession(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli")
    running, idle = 250, 20
    ids = []
    for i in range(running + idle):
        s = sessions.create_session(who, spec, runtime=RuntimeSpec(runtime_family="cli"))
        if i < running:
            runs.start_run(who, s.id, cursor={"step": i})
        ids.append(s.id)
    healthy = sessions.create_session(who, spec, runtime=RuntimeSpec(runtime_family="cli"))
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {RuntimeAttachment._meta.db_table} SET lease_expires_at = now() - interval '1 second' "
            "WHERE session_id = ANY(%s)", [ids],
        )
        assert cur.rowcount == running + idle
    last_event = Event.objects.order_by("-id").values_list("id", flat=True).first()

    call_command("reconcile_runtimes")  # one pass, no --loop

    out = capsys.readouterr().out
    assert out.count("lost; session is failed") == running and out.count("lost; session is created") == idle
    assert RuntimeAttachment.objects.filter(state=LIVE, lease_expires_at__lte=timezone.now()).count() == 0
    assert RuntimeAttachment.objects.filter(state=LOST, end_reason="runtime_lost").count() == running + idle
    assert list(RuntimeAttachment.objects.filter(state=LIVE).values_list("session_id", flat=True)) == [healthy.id]
    assert Session.objects.filter(status=S.FAILED, status_reason="runtime_lost").count() == running
    assert Session.objects.filter(status=S.RUNNING).count() == 0
    assert Session.objects.filter(status=S.CREATED).count() == idle + 1
    assert Run.objects.filter(state=rt.RunState.INTERRUPTED).count() == running
    new = Event.objects.filter(id__gt=last_event)
    assert new.filter(type="runtime.lost").count() == running + idle
    assert new.filter(type="session.transitioned").count() == running
    assert new.filter(type="run.ended").count() == running
    assert new.count() == running * 3 + idle


@pytest.mark.django_db
def test_a_pass_reads_in_batches_and_takes_only_leases_expired_when_it_started():
    who = caller_for(make_project("batches"))
    spec = sessions.NewSession(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli")
    made = [sessions.create_session(who, spec, runtime=RuntimeSpec(runtime_family="cli", lease_seconds=30)).id
            for _ in range(23)]
    cut = timezone.now() + timedelta(seconds=60)
    # three leases run out only after the pass's start: not this pass's business
    RuntimeAttachment.objects.filter(session_id__in=made[-3:]).update(lease_expires_at=cut + timedelta(seconds=5))
    done = reconcile_expired_runtimes(now=cut, batch_size=4)
    assert sorted(d.session_id for d in done) == sorted(made[:-3])
    assert RuntimeAttachment.objects.filter(state=LIVE).count() == 3
    assert reconcile_expired_runtimes(now=cut, batch_size=4) == []


# ---- the lifecycle refuses first ----------------------------------------------
def _never_running(owner, new_session, status: S, *, expired: bool) -> dict:
    s = put_in(owner, new_session, S.RUNNING)
    if status is S.TERMINATED:
        assert owner.post(f"/sessions/{s['id']}/transition", {"to": "terminated"}).status_code == 200
    else:
        assert owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed", "session_status": "completed"}).status_code == 200
        if status is S.STALE:
            assert owner.post(f"/sessions/{s['id']}/transition", {"to": "stale"}).status_code == 200
    if expired and status is not S.TERMINATED:
        expire(s["id"])
    return owner.get(f"/sessions/{s['id']}").json()


@pytest.mark.django_db
@pytest.mark.parametrize("expired", [False, True], ids=["lease-held", "lease-expired"])
@pytest.mark.parametrize("status", [S.COMPLETED, S.STALE, S.TERMINATED])
def test_attach_to_a_session_that_can_never_run_is_an_illegal_transition(owner, new_session, status, expired):
    s = _never_running(owner, new_session, status, expired=expired)
    assert s["status"] == status
    before = snapshot()
    resp = owner.post(f"/sessions/{s['id']}/runtimes", RUNTIME)
    assert resp.status_code == 409, resp.content
    error = resp.json()["error"]
    assert error["code"] == "illegal_transition"
    assert error["details"] == {
        "record": "session", "from": status.value, "to": "running",
        "allowed": sorted(t.value for t in lc.SESSION.table[status]),
    }
    assert snapshot() == before, "nothing written, not even the tidying of an expired lease"


@pytest.mark.django_db
@pytest.mark.parametrize("status", [S.IDLE, S.FAILED, S.CREATED])
def test_sessions_that_can_still_run_take_a_new_runtime(owner, new_session, status):
    s = put_in(owner, new_session, S.RUNNING if status is S.FAILED else status)
    if status is S.FAILED:
        owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "failed"})
    owner.post(f"/sessions/{s['id']}/close")
    assert owner.get(f"/sessions/{s['id']}").json()["status"] == status
    resp = owner.post(f"/sessions/{s['id']}/runtimes", RUNTIME)
    assert resp.status_code == 201 and resp.json()["generation"] == 2, resp.content


@pytest.mark.django_db
@pytest.mark.parametrize("status", [S.AWAITING_USER, S.AWAITING_EXTERNAL])
@pytest.mark.parametrize("gone", ["closed", "lease ran out"])
def test_a_waiting_session_whose_runtime_is_gone_takes_no_new_one(owner, new_session, status, gone):
    """Its open run continues under a new runtime only through resume: the attach is refused,
    nothing written, and resume, as the refusal says, works from the waiting state (the waiting
    run ends superseded, a new run of generation 2 continues). Left to the wait instead:
    tests/control/test_wake_without_runtime.py."""
    s = put_in(owner, new_session, status)
    if gone == "closed":
        owner.post(f"/sessions/{s['id']}/close")
    else:
        expire(s["id"])
    before = snapshot()
    resp = owner.post(f"/sessions/{s['id']}/runtimes", RUNTIME)
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "open_run_exists", resp.content
    assert resp.json()["error"]["details"] == {"run_id": s["run"]["id"], "status": status.value}
    assert "resume the session" in resp.json()["error"]["message"]
    assert snapshot() == before
    report = owner.post(f"/sessions/{s['id']}/resume", {"runtime": RUNTIME})
    assert report.status_code == 200 and report.json()["ok"] is True and report.json()["generation"] == 2, report.content
    assert Run.objects.get(id=s["run"]["id"]).state == "interrupted"
    assert Run.objects.get(id=report.json()["run_id"]).state == "open"
    assert Session.objects.get(id=s["id"]).status == S.RUNNING


# ---- races: inline tidying and the reconciler agree -------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_resume_racing_the_reconciler_over_one_expired_lease_loses_it_once():
    who = caller_for(make_project("race-tidy"))
    spec = sessions.NewSession(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli")
    rounds = 8
    for _ in range(rounds):
        s = sessions.create_session(who, spec, runtime=RuntimeSpec(runtime_family="cli"))
        runs.start_run(who, s.id, cursor={"step": 1})
        expire(s.id)
        resumed, reconciled = oks(race([lambda: resume_session(who, s.id, runtime=RuntimeSpec("cli")).ok,
                                        lambda: len(reconcile_expired_runtimes())]))
        assert resumed is True and reconciled in (0, 1), (resumed, reconciled)
        assert Event.objects.filter(session_id=s.id, type="runtime.lost").count() == 1
        assert RuntimeAttachment.objects.filter(session_id=s.id, state=LOST).count() == 1
        live = RuntimeAttachment.objects.get(session_id=s.id, state=LIVE)
        assert live.generation == 2 and Session.objects.get(id=s.id).status == S.RUNNING
