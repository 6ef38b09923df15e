"""The consumer in this process (channels' WebsocketCommunicator, in-memory layer): here a
wake-up from a commit in the test reaches the socket directly, so a rolled-back transaction
that *did* wake anyone would show up."""
from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import transaction

from novelforge_sessions import events
from novelforge_sessions.event_types import EventType
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.models import Event

#: Test-only event types (not in the catalog: production code emits only catalog constants).
DOOMED, KEPT, UNANNOUNCED = (EventType(f"test.{n}", frozenset()) for n in ("doomed", "kept", "unannounced"))
from tests.support.factories import make_project

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def local_settings(settings):
    settings.CHANNEL_LAYERS = IN_MEMORY  # whatever REDIS_URL says: this test is about one process
    settings.ALLOWED_HOSTS = ["localhost", "testserver"]
    # One process: no LISTEN for other processes (its connection would outlive the test's loop).
    settings.LIVE_PG_NOTIFY = False
    return settings


def _project_with_token() -> tuple[int, str]:
    project = make_project("inproc")
    _, raw = create_token(project, name="agent", permissions=ALL_PERMISSIONS)
    return project.id, raw


def _rolled_back(project_id: int) -> int:
    """Append an event inside a transaction that then fails; return the id it had drawn."""
    drawn = []
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            drawn.append(events.append(project_id=project_id, type=DOOMED))
            raise RuntimeError("roll back")
    return drawn[0]


def _committed(project_id: int) -> int:
    with transaction.atomic():
        return events.append(project_id=project_id, type=KEPT)


async def _frame(comm: WebsocketCommunicator) -> dict:
    return json.loads(await comm.receive_from(timeout=5))


async def test_a_rolled_back_transaction_emits_nothing(local_settings):
    from novelforge_sessions.asgi import application

    project_id, token = await database_sync_to_async(_project_with_token)()
    layer = get_channel_layer()
    spy = await layer.new_channel()
    await layer.group_add(events.project_group(project_id), spy)
    comm = WebsocketCommunicator(
        application, "/ws/events/", headers=[(b"origin", b"http://localhost"), (b"host", b"localhost"), (b"authorization", f"Bearer {token}".encode())]
    )
    connected, _ = await comm.connect()
    assert connected
    await comm.send_json_to({"type": "subscribe", "project_id": project_id, "after": 0})
    assert (await _frame(comm))["type"] == "subscribed"
    assert (await _frame(comm))["type"] == "caught_up"

    doomed = await database_sync_to_async(_rolled_back)(project_id)
    kept = await database_sync_to_async(_committed)(project_id)
    assert kept > doomed

    # The first wake-up the group ever gets is the committed one: none was sent for the rollback.
    assert await layer.receive(spy) == {"type": "events.wakeup", "project_id": project_id, "max_id": kept}
    # And the socket's first event is the committed one; the rolled-back id never exists.
    frame = await _frame(comm)
    assert frame["type"] == "event" and frame["event"]["id"] == kept and frame["event"]["type"] == "test.kept"
    assert not await sync_to_async(Event.objects.filter(id=doomed).exists)()
    await comm.disconnect()


async def test_an_unauthenticated_socket_is_closed_after_the_auth_deadline(local_settings):
    from novelforge_sessions.asgi import application

    local_settings.LIVE_AUTH_TIMEOUT_SECONDS = 0.2
    comm = WebsocketCommunicator(application, "/ws/events/", headers=[(b"origin", b"http://localhost"), (b"host", b"localhost")])
    connected, _ = await comm.connect()
    assert connected
    frame = await _frame(comm)
    assert frame["error"]["code"] == "unauthorized"
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}
    await comm.disconnect()


async def test_the_sweep_delivers_an_event_whose_wake_up_was_lost(local_settings):
    """The channel layer is at-most-once: an event whose wake-up never came still arrives."""
    from novelforge_sessions.asgi import application

    local_settings.LIVE_SWEEP_SECONDS = 0.2
    project_id, token = await database_sync_to_async(_project_with_token)()
    comm = WebsocketCommunicator(
        application, "/ws/events/", headers=[(b"origin", b"http://localhost"), (b"host", b"localhost"), (b"authorization", f"Bearer {token}".encode())]
    )
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "project_id": project_id, "after": 0})
    assert (await _frame(comm))["type"] == "subscribed"
    assert (await _frame(comm))["type"] == "caught_up"

    def commit_without_wakeup() -> int:
        with transaction.atomic():
            event_id = events.append(project_id=project_id, type=UNANNOUNCED)
            transaction.get_connection().run_on_commit.clear()  # the wake-up is "lost"
        return event_id

    event_id = await database_sync_to_async(commit_without_wakeup)()
    frame = await _frame(comm)
    assert frame["type"] == "event" and frame["event"]["id"] == event_id
    await comm.disconnect()


def _manager_login(project_id: int) -> tuple[str, int]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from novelforge_sessions.models import Membership

    user = get_user_model().objects.create_user(f"mgr{project_id}", password="pw-123456789")
    Membership.objects.create(user=user, project_id=project_id, role=Membership.Role.MANAGER)
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value, user.id


async def _subscribed(headers: list[tuple[bytes, bytes]], project_id: int) -> WebsocketCommunicator:
    from novelforge_sessions.asgi import application

    comm = WebsocketCommunicator(application, "/ws/events/", headers=[(b"origin", b"http://localhost"), (b"host", b"localhost"), *headers])
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "project_id": project_id, "after": 0})
    assert (await _frame(comm))["type"] == "subscribed"
    assert (await _frame(comm))["type"] == "caught_up"
    return comm


async def _closed_with(comm: WebsocketCommunicator) -> tuple[int, str]:
    frame = await _frame(comm)
    close = await comm.receive_output(timeout=5)
    await comm.disconnect()
    return close["code"], frame["error"]["code"]


async def test_a_revoked_token_stops_the_stream(local_settings):
    from django.utils import timezone

    from novelforge_sessions.models import ApiToken

    local_settings.LIVE_SWEEP_SECONDS = 0.2
    project_id, token = await database_sync_to_async(_project_with_token)()
    comm = await _subscribed([(b"authorization", f"Bearer {token}".encode())], project_id)
    await sync_to_async(ApiToken.objects.filter(project_id=project_id).update)(revoked_at=timezone.now())
    assert await _closed_with(comm) == (4401, "unauthorized")


async def test_a_lost_membership_stops_the_stream(local_settings):
    from novelforge_sessions.models import Membership

    local_settings.LIVE_SWEEP_SECONDS = 0.2
    project_id, _ = await database_sync_to_async(_project_with_token)()
    cookie, user_id = await database_sync_to_async(_manager_login)(project_id)
    comm = await _subscribed([(b"cookie", f"sessionid={cookie}".encode())], project_id)
    await sync_to_async(Membership.objects.filter(user_id=user_id).delete)()
    assert await _closed_with(comm) == (4403, "forbidden")


async def test_logging_out_stops_the_stream(local_settings):
    from django.contrib.sessions.models import Session as LoginSession

    local_settings.LIVE_SWEEP_SECONDS = 0.2
    project_id, _ = await database_sync_to_async(_project_with_token)()
    cookie, _ = await database_sync_to_async(_manager_login)(project_id)
    comm = await _subscribed([(b"cookie", f"sessionid={cookie}".encode())], project_id)
    await sync_to_async(LoginSession.objects.filter(session_key=cookie).delete)()
    assert await _closed_with(comm) == (4401, "unauthorized")


def _deactivate(user_id: int) -> None:
    from django.contrib.auth import get_user_model

    get_user_model().objects.filter(id=user_id).update(is_active=False)


def _change_password(user_id: int) -> None:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.get(id=user_id)
    user.set_password("a-new-pw-987654321")  # the usual way to kick out a stolen cookie
    user.save()


@pytest.mark.parametrize("change", [_deactivate, _change_password], ids=["deactivated", "password-changed"])
async def test_an_account_that_could_no_longer_log_in_stops_the_stream(local_settings, change):
    """The sweep only checked that the login session row existed and rebuilt the
    caller from the user cached at connect, so a deactivated account or a changed password kept
    streaming. The sweep now resolves the user from the session as Django's auth does (active,
    session auth hash) and closes with 4401."""
    local_settings.LIVE_SWEEP_SECONDS = 0.2
    project_id, _ = await database_sync_to_async(_project_with_token)()
    cookie, user_id = await database_sync_to_async(_manager_login)(project_id)
    comm = await _subscribed([(b"cookie", f"sessionid={cookie}".encode())], project_id)
    await database_sync_to_async(change)(user_id)
    assert await _closed_with(comm) == (4401, "unauthorized")


async def test_the_sweep_keeps_a_login_that_still_stands(local_settings):
    """The control: the same socket, nothing changed, is still streaming after several sweeps."""
    local_settings.LIVE_SWEEP_SECONDS = 0.05
    project_id, _ = await database_sync_to_async(_project_with_token)()
    cookie, _ = await database_sync_to_async(_manager_login)(project_id)
    comm = await _subscribed([(b"cookie", f"sessionid={cookie}".encode())], project_id)
    assert await comm.receive_nothing(timeout=0.5)  # ten sweeps: no error frame, no close
    kept = await database_sync_to_async(_committed)(project_id)
    frame = await _frame(comm)
    assert frame["type"] == "event" and frame["event"]["id"] == kept
    await comm.disconnect()


async def test_a_commit_in_a_writer_thread_wakes_the_hub_directly_without_a_group_send(local_settings, monkeypatch):
    """In-memory layer, the hub the only member of the group: the after-commit hook hands the
    wake-up to the hub's loop (``call_soon_threadsafe``), no ``group_send`` (no thread and no
    event loop per commit), and the socket gets the event."""
    project_id, token = await database_sync_to_async(_project_with_token)()
    comm = await _subscribed([(b"authorization", f"Bearer {token}".encode())], project_id)
    layer = get_channel_layer()
    members = list(layer.groups[events.project_group(project_id)])
    assert len(members) == 1 and members[0] in events.LOCAL_WAKERS  # the hub's channel
    sent: list[str] = []

    async def spy(group: str, message: dict) -> None:
        sent.append(group)

    monkeypatch.setattr(layer, "group_send", spy)
    kept = await database_sync_to_async(_committed)(project_id)  # committed in asgiref's worker thread
    frame = await _frame(comm)
    assert frame["type"] == "event" and frame["event"]["id"] == kept
    assert sent == []
    await comm.disconnect()
    # The hub stopped with its last socket: its channel is no longer a local waker.
    assert members[0] not in events.LOCAL_WAKERS


async def test_the_streams_frames_skip_the_session_wrapper_of_send(local_settings, monkeypatch):
    """``RawSendMiddleware``: text frames go to the server's own send; channels' session wrapper
    (which acts only on ``http.response.start``) sees the accept, not the frames."""
    from channels.sessions import InstanceSessionWrapper

    seen: list[str] = []
    real = InstanceSessionWrapper.send

    async def spy(self, message):
        seen.append(message["type"])
        return await real(self, message)

    monkeypatch.setattr(InstanceSessionWrapper, "send", spy)
    project_id, token = await database_sync_to_async(_project_with_token)()
    comm = await _subscribed([(b"authorization", f"Bearer {token}".encode())], project_id)  # subscribed, caught_up
    kept = await database_sync_to_async(_committed)(project_id)
    frame = await _frame(comm)
    assert frame["type"] == "event" and frame["event"]["id"] == kept
    assert seen == ["websocket.accept"]
    await comm.disconnect()


def _committed_many(project_id: int, n: int) -> list[int]:
    with transaction.atomic():
        return [events.append(project_id=project_id, type=KEPT) for _ in range(n)]


async def _batched_frames(comm: WebsocketCommunicator, until: int) -> list[list[int]]:
    """The event ids of each ``events`` frame, until one carries ``until``."""
    frames: list[list[int]] = []
    while not frames or frames[-1][-1] < until:
        frame = await _frame(comm)
        if frame["type"] == "caught_up":
            continue
        assert frame["type"] == "events" and frame["sub"] == f"project:{frame['events'][0]['project_id']}", frame
        frames.append([e["id"] for e in frame["events"]])
    return frames


@pytest.mark.parametrize("cap", ["events", "bytes"])
async def test_a_batched_subscription_gets_every_event_once_in_frames_within_the_caps(local_settings, monkeypatch, cap):
    """The backlog (read from the log) and a live burst (from the feed's buffer) come several
    events to a frame, in id order, each once; a frame holds at most BATCH_MAX_EVENTS events
    and, past its first event, BATCH_MAX_BYTES of JSON (an event larger than that goes alone)."""
    from novelforge_sessions.asgi import application
    from novelforge_sessions.live import consumers

    if cap == "events":
        monkeypatch.setattr(consumers, "BATCH_MAX_EVENTS", 3)
    else:
        monkeypatch.setattr(consumers, "BATCH_MAX_BYTES", 1)  # every event is larger: one per frame
    project_id, token = await database_sync_to_async(_project_with_token)()
    backlog = await database_sync_to_async(_committed_many)(project_id, 7)
    comm = WebsocketCommunicator(application, "/ws/events/", headers=[
        (b"origin", b"http://localhost"), (b"host", b"localhost"), (b"authorization", f"Bearer {token}".encode())])
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "project_id": project_id, "after": 0, "batch": True})
    assert (await _frame(comm))["type"] == "subscribed"
    got = await _batched_frames(comm, backlog[-1])
    assert (await _frame(comm))["type"] == "caught_up"
    burst = await database_sync_to_async(_committed_many)(project_id, 5)  # one wake-up, five events
    got += await _batched_frames(comm, burst[-1])
    await comm.disconnect()

    every = await database_sync_to_async(
        lambda: list(Event.objects.filter(project_id=project_id).order_by("id").values_list("id", flat=True)))()
    assert [i for frame in got for i in frame] == every == backlog + burst
    if cap == "events":
        assert max(map(len, got)) == 3 and len(got) < len(every)  # several to a frame, never more than 3
    else:
        assert all(len(frame) == 1 for frame in got)
