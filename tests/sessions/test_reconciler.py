"""The reconciler: an expired lease means the runtime is gone (docs/model.md#runtimes-and-leases: `running` is not liveness)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec, reconcile_expired_runtimes
from novelforge_sessions.models import Event, Run, RuntimeAttachment, Session

from tests.support.factories import RUNTIME

pytestmark = pytest.mark.django_db

LATER = timedelta(seconds=120)


def make(caller, *, run: bool, wait: str | None = None) -> Session:
    s = sessions.create_session(
        caller, sessions.NewSession(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli"),
        runtime=RuntimeSpec(runtime_family="cli", lease_seconds=30),
    )
    if run:
        runs.start_run(caller, s.id, cursor={"step": "a"})
    if wait:
        sessions.transition_session(caller, s.id, wait)
    return Session.objects.get(id=s.id)


def test_an_expired_lease_fails_a_running_session_with_runtime_lost(caller, owner):
    s = make(caller, run=True)
    assert reconcile_expired_runtimes() == [], "nothing is expired yet"
    done = reconcile_expired_runtimes(now=timezone.now() + LATER)
    assert [(d.session_id, d.session_status) for d in done] == [(s.id, "failed")]
    s.refresh_from_db()
    assert (s.status, s.status_reason) == ("failed", "runtime_lost")
    assert RuntimeAttachment.objects.get(session=s).state == "lost"
    assert Run.objects.get(session=s).state == "interrupted"
    assert {"runtime.lost", "session.transitioned"} <= set(Event.objects.filter(session_id=s.id).values_list("type", flat=True))
    # failed/runtime_lost is resumable: a new generation continues.
    resumed = owner.post(f"/sessions/{s.id}/resume", {"runtime": RUNTIME})
    assert resumed.status_code == 200 and resumed.json()["generation"] == 2


def test_idle_and_waiting_sessions_only_lose_their_runtime(caller):
    idle = make(caller, run=False)
    waiting = make(caller, run=True, wait="awaiting_user")
    reconcile_expired_runtimes(now=timezone.now() + LATER)
    idle.refresh_from_db()
    waiting.refresh_from_db()
    assert idle.status == "created" and waiting.status == "awaiting_user"
    assert RuntimeAttachment.objects.filter(state="lost").count() == 2
    assert Run.objects.get(session=waiting).state == "open", "the wait is on a person, not the runtime"


def test_reconciling_twice_changes_nothing_more(caller):
    make(caller, run=True)
    later = timezone.now() + LATER
    assert len(reconcile_expired_runtimes(now=later)) == 1
    count = Event.objects.count()
    assert reconcile_expired_runtimes(now=later) == []
    assert Event.objects.count() == count


def test_a_lost_runtime_cannot_heartbeat_back_to_life(caller, owner):
    s = make(caller, run=True)
    runtime = RuntimeAttachment.objects.get(session=s)
    RuntimeAttachment.objects.filter(id=runtime.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    resp = owner.post(f"/runtimes/{runtime.id}/heartbeat", {})
    assert resp.status_code == 409 and resp.json()["error"]["details"]["lease_expired"] is True
    runtime.refresh_from_db()
    assert runtime.lease_expires_at < timezone.now()


def test_management_command_reconciles(caller, capsys):
    s = make(caller, run=True)
    RuntimeAttachment.objects.filter(session=s).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    call_command("reconcile_runtimes")
    assert f"session {s.id} lost; session is failed" in capsys.readouterr().out
    assert Session.objects.get(id=s.id).status == "failed"
