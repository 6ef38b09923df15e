"""The after-commit wake-up: sent when someone can hear it, skipped when nobody can.

The in-memory channel layer only reaches consumers of this process, so a write whose project
group has no member in it skips the send (a thread and an event loop per ``async_to_sync``).
Any other layer (channels_redis: listeners in other processes) always gets the send.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer

from novelforge_sessions import events
from novelforge_sessions.control.checkpoints import record_checkpoint
from novelforge_sessions.actions.runs import start_run
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.sessions import NewSession, create_session, transition_session
from novelforge_sessions.models import Event
from tests.conftest import caller_for, make_project

# transaction=True: the wake-up runs from on_commit, which only fires on a real commit.
pytestmark = pytest.mark.django_db(transaction=True)

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


class OtherProcessLayer(InMemoryChannelLayer):
    """Stands in for channels_redis: a layer whose listeners this process cannot see."""


def _running_session(project) -> tuple[Any, int, int]:
    who = caller_for(project)
    spec = NewSession(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="claude-code")
    session = create_session(who, spec, runtime=RuntimeSpec(runtime_family="claude-code", capabilities=["draft"]))
    run = start_run(who, session.id, cursor={"step": "start"})
    return who, session.id, run.id


def _count_sends(layer, monkeypatch) -> list[str]:
    """Spy on the layer's group_send (the real one still runs)."""
    groups: list[str] = []
    real = layer.group_send

    async def spy(group: str, message: dict) -> None:
        groups.append(group)
        await real(group, message)

    monkeypatch.setattr(layer, "group_send", spy)
    return groups


def _receive(layer, channel: str) -> dict:
    async def go() -> dict:
        return await asyncio.wait_for(layer.receive(channel), timeout=5)

    return async_to_sync(go)()


def test_a_listener_in_this_process_gets_the_wakeup_with_the_last_id(settings, monkeypatch):
    settings.CHANNEL_LAYERS = IN_MEMORY
    project = make_project("heard")
    who, session_id, run_id = _running_session(project)
    layer = get_channel_layer()
    sent = _count_sends(layer, monkeypatch)
    listener = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(events.project_group(project.id), listener)

    record_checkpoint(who, run_id, {"boundary": "context_freeze", "cursor": {"step": 1}})
    last = Event.objects.filter(project_id=project.id).latest("id")
    assert last.type == "checkpoint.recorded"
    assert _receive(layer, listener) == {"type": "events.wakeup", "project_id": project.id, "max_id": last.id}

    transition_session(who, session_id, "awaiting_user")
    last = Event.objects.filter(project_id=project.id).latest("id")
    assert last.type == "session.transitioned"
    assert _receive(layer, listener) == {"type": "events.wakeup", "project_id": project.id, "max_id": last.id}
    assert sent == [events.project_group(project.id)] * 2


def test_no_listener_for_the_project_in_this_process_skips_the_send(settings, monkeypatch):
    settings.CHANNEL_LAYERS = IN_MEMORY
    quiet, busy = make_project("quiet"), make_project("busy")
    who, session_id, run_id = _running_session(quiet)
    layer = get_channel_layer()
    sent = _count_sends(layer, monkeypatch)
    # Someone listens, but to another project's group: this project's group stays empty.
    other = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(events.project_group(busy.id), other)

    record_checkpoint(who, run_id, {"boundary": "context_freeze", "cursor": {"step": 1}})
    transition_session(who, session_id, "awaiting_user")
    assert Event.objects.filter(project_id=quiet.id, type="checkpoint.recorded").count() == 1
    assert sent == [], "nobody in this process can hear it: no send"

    # A member that joins later (and left empty) is heard again from the next commit on.
    listener = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(events.project_group(quiet.id), listener)
    transition_session(who, session_id, "running")
    assert sent == [events.project_group(quiet.id)]
    assert _receive(layer, listener)["max_id"] == Event.objects.filter(project_id=quiet.id).latest("id").id


def test_a_layer_other_than_the_in_memory_one_always_gets_the_send(settings, monkeypatch):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.OtherProcessLayer"}}
    project = make_project("elsewhere")
    who, _, run_id = _running_session(project)
    layer = get_channel_layer()
    assert type(layer) is OtherProcessLayer
    sent = _count_sends(layer, monkeypatch)

    record_checkpoint(who, run_id, {"boundary": "context_freeze", "cursor": {"step": 1}})
    assert sent == [events.project_group(project.id)], "its listeners may live in other processes"
