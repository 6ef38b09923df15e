"""A deeply nested frame closes the socket with 4400, like every malformed frame.

On the original code ``json.loads`` raised ``RecursionError`` (a 4 KiB frame nests ~2,000 levels,
past Python's recursion limit) out of ``receive``: the socket closed with 1011 and the server
logged a traceback — even before authentication.
"""
from __future__ import annotations

import json

import pytest
from channels.testing import WebsocketCommunicator

from tests.live.test_access import two_projects  # noqa: F401  (fixture)

NESTED = [
    "[" * 2000 + "]" * 2000,
    "[" * 1200 + '{"type": "ping"}' + "]" * 1200,
    '{"type": "subscribe", "project_id": ' + "[" * 1800 + "]" * 1800 + "}",
]
IDS = ["lists", "an-object-inside", "inside-a-subscribe"]


def _log_tail(server, start: int) -> str:
    return server.log_path.read_bytes()[start:].decode("utf-8", "replace")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("frame", NESTED, ids=IDS)
@pytest.mark.parametrize("authenticated", [False, True], ids=["before-auth", "after-auth"])
def test_a_real_socket_closes_a_nested_frame_with_4400_and_logs_no_traceback(
    ws_server, open_socket, two_projects, frame, authenticated  # noqa: F811
):
    assert len(frame.encode()) <= 4096  # under the frame limit: the parser, not the size check, sees it
    _, _, token_a, _ = two_projects
    start = ws_server.log_path.stat().st_size
    sock = open_socket(ws_server, token=token_a) if authenticated else open_socket(ws_server)
    sock.send(frame)
    code, frames = sock.closed_with()
    assert code == 4400, (code, frames)
    assert frames[-1]["type"] == "error" and frames[-1]["error"]["code"] == "malformed_frame"
    # The server is still serving sockets, and its log has no traceback for this.
    other = open_socket(ws_server, token=token_a)
    other.send({"type": "ping"})
    assert other.recv() == {"type": "pong"}
    tail = _log_tail(ws_server, start)
    assert "Traceback" not in tail and "RecursionError" not in tail, tail[-3000:]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("frame", NESTED, ids=IDS)
async def test_in_process_a_nested_frame_is_4400_before_authentication(settings, caplog, frame):
    from novelforge_sessions.asgi import application

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.ALLOWED_HOSTS = ["localhost"]
    settings.LIVE_PG_NOTIFY = False  # one process: no LISTEN (it would outlive the test's loop)
    comm = WebsocketCommunicator(application, "/ws/events/", headers=[(b"origin", b"http://localhost"),
                                                                     (b"host", b"localhost")])
    connected, _ = await comm.connect()
    assert connected
    await comm.send_to(text_data=frame)
    error = json.loads(await comm.receive_from(timeout=5))
    assert error["error"]["code"] == "malformed_frame"
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4400}
    await comm.disconnect()
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("token", ["\\ud800", "nfs_\\udfff", "nfs_caf\\u00e9"], ids=["lone-surrogate", "nfs-surrogate", "not-ascii"])
async def test_an_auth_frame_whose_token_is_not_ascii_is_4401_like_any_bad_token(settings, caplog, token):
    """A token holding an unpaired surrogate (a JSON escape in the auth
    frame) could not be hashed (``str.encode``): the consumer crashed with 1011 and a traceback.
    Every token the service issues is ASCII, so anything else is simply not a valid token."""
    from novelforge_sessions.asgi import application

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.ALLOWED_HOSTS = ["localhost"]
    settings.LIVE_PG_NOTIFY = False  # one process: no LISTEN (it would outlive the test's loop)
    comm = WebsocketCommunicator(application, "/ws/events/", headers=[(b"origin", b"http://localhost"),
                                                                     (b"host", b"localhost")])
    connected, _ = await comm.connect()
    assert connected
    await comm.send_to(text_data='{"type": "auth", "token": "%s"}' % token)
    error = json.loads(await comm.receive_from(timeout=5))
    assert error["type"] == "error" and error["error"]["code"] == "unauthorized"
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}
    await comm.disconnect()
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
