"""The after-commit wake-up: sent when someone can hear it, skipped when nobody can.

The in-memory channel layer only reaches consumers of this process, so a write whose project
group has no member in it skips the send (a thread and an event loop per ``async_to_sync``).
Any other layer (channels_redis: listeners in other processes) always gets the send.
"""
from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer

from novelforge_sessions import events
from novelforge_sessions.control.checkpoints import record_checkpoint
from novelforge_sessions.actions.sessions import transition_session
from novelforge_sessions.models import Event
from tests.support.factories import make_project, running_session

# transaction=True: the wake-up runs from on_commit, which only fires on a real commit.
pytestmark = pytest.mark.django_db(transaction=True)

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


#: the session the tests wake: a writer on a drafting runtime, its run at step "start"
WRITER = {"runtime_family": "claude-code", "capabilities": ["draft"], "cursor": {"step": "start"}}


class OtherProcessLayer(InMemoryChannelLayer):
    """Stands in for channels_redis: a layer whose listeners this process cannot see."""


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
    s = running_session(project, **WRITER)
    who, session_id, run_id = s.caller, s.id, s.started_run.id
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
    s = running_session(quiet, **WRITER)
    who, session_id, run_id = s.caller, s.id, s.started_run.id
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
    s = running_session(project, **WRITER)
    who, _, run_id = s.caller, s.id, s.started_run.id
    layer = get_channel_layer()
    assert type(layer) is OtherProcessLayer
    sent = _count_sends(layer, monkeypatch)

    record_checkpoint(who, run_id, {"boundary": "context_freeze", "cursor": {"step": 1}})
    assert sent == [events.project_group(project.id)], "its listeners may live in other processes"


def test_local_hubs_are_woken_directly_and_any_other_member_still_gets_the_group_message(settings, monkeypatch):
    settings.CHANNEL_LAYERS = IN_MEMORY
    project = make_project("direct")
    s = running_session(project, **WRITER)
    who, session_id, run_id = s.caller, s.id, s.started_run.id
    layer = get_channel_layer()
    sent = _count_sends(layer, monkeypatch)
    hub = async_to_sync(layer.new_channel)()
    woken: list[tuple[int, int]] = []
    monkeypatch.setitem(events.LOCAL_WAKERS, hub, lambda project_id, max_id: woken.append((project_id, max_id)))
    async_to_sync(layer.group_add)(events.project_group(project.id), hub)

    record_checkpoint(who, run_id, {"boundary": "context_freeze", "cursor": {"step": 1}})
    last = Event.objects.filter(project_id=project.id).latest("id")
    assert woken == [(project.id, last.id)], "the hub's waker, called in the writer's thread"
    assert sent == [], "no group message: nobody else listens"

    # A member that is not a local hub (here a spy channel): the group message, as before.
    spy = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(events.project_group(project.id), spy)
    transition_session(who, session_id, "awaiting_user")
    last = Event.objects.filter(project_id=project.id).latest("id")
    assert sent == [events.project_group(project.id)]
    assert _receive(layer, spy)["max_id"] == last.id
    assert len(woken) == 1, "with another member the hub hears it through the layer"
    assert _receive(layer, hub)["max_id"] == last.id


def test_sends_through_another_layer_run_on_one_long_lived_loop(settings, monkeypatch):
    """channels_redis keeps a connection per event loop: ``async_to_sync`` per commit meant a
    new thread, a new loop and a Redis connect per commit. Every send now runs on the process's
    one sender loop, and the writer returns after its send has gone out."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.OtherProcessLayer"}}
    project = make_project("one-loop")
    s = running_session(project, **WRITER)
    who, session_id, run_id = s.caller, s.id, s.started_run.id
    layer = get_channel_layer()
    seen: list[tuple[str, int]] = []
    real = layer.group_send

    async def spy(group: str, message: dict) -> None:
        seen.append((threading.current_thread().name, id(asyncio.get_running_loop())))
        await real(group, message)

    monkeypatch.setattr(layer, "group_send", spy)
    record_checkpoint(who, run_id, {"boundary": "context_freeze", "cursor": {"step": 1}})
    transition_session(who, session_id, "awaiting_user")
    assert len(seen) == 2, "each commit's send had gone out when the write returned"
    assert seen[0] == seen[1] and seen[0][0] == "novelforge-wakeup-sender"


def test_a_send_that_hangs_does_not_hold_the_writer_past_the_timeout(settings, monkeypatch, caplog):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.OtherProcessLayer"}}
    monkeypatch.setattr(events, "SEND_TIMEOUT_SECONDS", 0.2)
    project = make_project("hangs")
    s = running_session(project, **WRITER)
    who, _, run_id = s.caller, s.id, s.started_run.id
    layer = get_channel_layer()

    async def never(group: str, message: dict) -> None:
        await asyncio.Event().wait()  # a layer that never answers (Redis stalled)

    monkeypatch.setattr(layer, "group_send", never)
    checkpoint = record_checkpoint(who, run_id, {"boundary": "context_freeze", "cursor": {"step": 1}})
    assert checkpoint is not None  # committed and returned; the wake-up is lost (the sweep reads it)
    assert Event.objects.filter(project_id=project.id, type="checkpoint.recorded").count() == 1
    assert any("event wake-up for project" in r.getMessage() for r in caplog.records)
