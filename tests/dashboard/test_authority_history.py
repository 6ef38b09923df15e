"""The project page's authority history lists the events that change
a project's authority — a settle and a framework change — by their exact types (no prefix
matching), and nothing else."""
from __future__ import annotations

import re

import pytest

from novelforge_sessions.control import intents
from novelforge_sessions.actions.artifacts import create_artifact
from novelforge_sessions import event_types as ev
from novelforge_sessions.models import Event, Project
from tests.support.factories import caller_for

pytestmark = pytest.mark.django_db


def history(client, project: Project) -> str:
    html = client.get(f"/projects/{project.id}/").content.decode()
    match = re.search(r'<h3 class="sub-h">History</h3>(.*?)</section>', html, re.S)
    assert match, "the authority card has no history"
    return match.group(1)


def execute(project: Project, kind: str, key: str, params: dict) -> None:
    agent = caller_for(project)
    before = intents.read_before_state(agent, kind=kind)
    intent = intents.create_intent(agent, kind=kind, idempotency_key=key, before_fingerprint=before.fingerprint,
                                   params=params).intent
    intents.approve_intent(agent, intent.id)
    intents.execute_intent(agent, intent.id)


def test_an_executed_framework_change_reaches_the_authority_history(mgr_client, project):
    assert "No authority change recorded" in history(mgr_client, project)
    execute(project, "framework.change", "fw-2", {"framework_version": "2"})
    event = Event.objects.get(type=ev.FRAMEWORK_CHANGED.name)
    part = history(mgr_client, project)
    assert f'data-id="{event.id}" data-type="framework.changed"' in part
    assert "framework 1 → 2" in part
    assert "No authority change recorded" not in part


def test_a_settle_is_listed_too_and_other_events_are_not(mgr_client, project):
    agent = caller_for(project)
    canon = create_artifact(agent, name="canon", kind="canon", content="the bible")
    execute(project, "authority.settle", "settle-1",
            {"artifacts": [{"artifact_id": canon.id, "fingerprint": canon.current_version.fingerprint}]})
    execute(project, "framework.change", "fw-2", {"framework_version": "2"})
    part = history(mgr_client, project)
    listed = re.findall(r'data-type="([^"]+)"', part)
    assert listed == [ev.FRAMEWORK_CHANGED.name, ev.AUTHORITY_SETTLED.name]  # newest first
    assert "authority v1 → v2" in part
    # write_intent.* and artifact events happened too, but are not authority changes
    assert Event.objects.filter(project=project).exclude(type__in=[e.name for e in ev.AUTHORITY_HISTORY]).exists()


def test_the_constants_are_the_types_execution_emits(project):
    execute(project, "framework.change", "fw-2", {"framework_version": "2"})
    types = set(Event.objects.filter(project=project).values_list("type", flat=True))
    assert ev.FRAMEWORK_CHANGED.name in types
    assert set(ev.AUTHORITY_HISTORY) == {ev.AUTHORITY_SETTLED, ev.FRAMEWORK_CHANGED}
