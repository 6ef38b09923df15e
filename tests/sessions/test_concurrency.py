"""Racing transitions on one session, with real threads against PostgreSQL: exactly one wins."""
from __future__ import annotations

from collections import Counter

import pytest

from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.models import Event, Run, RuntimeAttachment, Session
from tests.support.factories import caller_for, make_project, running_session
from tests.support.races import THREADS, race

pytestmark = pytest.mark.django_db(transaction=True)


def test_racing_transitions_with_expected_version_have_exactly_one_winner():
    who = caller_for(make_project("race"))
    session = running_session(who)
    targets = ["idle", "awaiting_user", "awaiting_external", "completed", "failed", "terminated", "stale"]
    before = Event.objects.filter(session_id=session.id, type="session.transitioned").count()

    results = race(lambda i: sessions.transition_session(
        who, session.id, targets[i % len(targets)], expected_version=session.version).status)

    outcomes = Counter(kind for kind, _ in results)
    assert outcomes == {"ok": 1, "error": THREADS - 1}, results
    assert {value for kind, value in results if kind == "error"} == {"version_conflict"}
    winner = next(value for kind, value in results if kind == "ok")
    session.refresh_from_db()
    assert session.status == winner and session.version == 3
    assert Event.objects.filter(session_id=session.id, type="session.transitioned").count() == before + 1


def test_racing_the_same_transition_applies_it_once():
    who = caller_for(make_project("race-same"))
    session = running_session(who)
    results = race(lambda i: sessions.transition_session(who, session.id, "completed").status)
    assert Counter(kind for kind, _ in results) == {"ok": 1, "error": THREADS - 1}, results
    assert {value for kind, value in results if kind == "error"} == {"illegal_transition"}
    assert Run.objects.get(session=session).state == "completed"
    assert Event.objects.filter(session_id=session.id, type="run.ended").count() == 1


def test_racing_run_starts_open_exactly_one_run():
    who = caller_for(make_project("race-runs"))
    s = sessions.create_session(
        who, sessions.NewSession(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli"),
        runtime=RuntimeSpec(runtime_family="cli"),
    )
    results = race(lambda i: runs.start_run(who, s.id, cursor={"thread": i}).id)
    assert Counter(kind for kind, _ in results) == {"ok": 1, "error": THREADS - 1}, results
    assert {value for kind, value in results if kind == "error"} == {"open_run_exists"}
    assert Run.objects.filter(session_id=s.id).count() == 1


def test_racing_resumes_create_exactly_one_generation():
    who = caller_for(make_project("race-resume"))
    session = running_session(who)
    sessions.close_session(who, session.id)
    from novelforge_sessions.control.resume import resume_session

    results = race(lambda i: resume_session(who, session.id, runtime=RuntimeSpec(runtime_family="cli")).run_id)
    assert Counter(kind for kind, _ in results) == {"ok": 1, "error": THREADS - 1}, results
    assert {value for kind, value in results if kind == "error"} == {"live_runtime_exists"}
    assert RuntimeAttachment.objects.filter(session=session, state="live").count() == 1
    assert Session.objects.get(id=session.id).generation == 2
