"""The live event stream (``/ws/events/``) as an iterator that survives reconnects.

    for event in EventStream(url, token, session_id=12, after=0):   # or project_id=…
        print(event["id"], event["type"])

Protocol (novelforge_sessions/live/consumers.py): the socket authenticates with an
``Authorization: Bearer`` header, subscribes with ``{"type": "subscribe", "session_id" | "project_id",
"after", "batch": true}``, gets every event after the cursor from the event table in id order, then
live events as they commit, several to a frame where one delivery found several (``batch``); the
iterator yields them one by one. The handshake's ``Origin`` must be the server's own origin (scheme, host and port): the
stream sends the base URL's. The stream keeps the cursor (the last event id it yielded); when the
connection drops — a network failure, or the server restarting (close code 1012) — it reconnects
with backoff and subscribes again *after that cursor*, so nothing is missed and nothing repeats.
Refusals are final: 4401 (token not valid) raises :class:`~novelforge_client.errors.Unauthorized`,
4403 (not visible) :class:`~novelforge_client.errors.Forbidden`, 4400/4413 :class:`BadRequest`.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin

from novelforge_client.errors import BadRequest, Forbidden, NovelForgeError, Unauthorized

log = logging.getLogger("novelforge_client.stream")

FATAL = {4401: Unauthorized, 4403: Forbidden, 4400: BadRequest, 4413: BadRequest}


def ws_url(base_url: str) -> tuple[str, str]:
    """The socket address and the Origin to present for a server's base URL."""
    parts = urlsplit(base_url.rstrip("/"))
    scheme = "wss" if parts.scheme == "https" else "ws"
    return f"{scheme}://{parts.netloc}/ws/events/", f"{parts.scheme}://{parts.netloc}"


class EventStream:
    """Iterate events (dicts, as ``EventOut`` on the wire) from a session or a whole project.

    ``after``: the last event id already seen (``None``: from now on). ``on_status`` is called
    with ``"connected"``, ``"caught_up"`` and ``"reconnecting"`` (for a CLI to say so).
    """

    def __init__(self, base_url: str, token: str, *, session_id: int | None = None, project_id: int | None = None,
                 after: int | None = None, reconnect: bool = True, max_backoff: float = 5.0,
                 on_status: Any = None, open_timeout: float = 10.0) -> None:
        if (session_id is None) == (project_id is None):
            raise ValueError("subscribe to exactly one of session_id or project_id")
        self.url, self.origin = ws_url(base_url)
        self.token = token
        self.target = {"session_id": session_id} if session_id is not None else {"project_id": project_id}
        self.cursor = after
        self.reconnect = reconnect
        self.max_backoff = max_backoff
        self.on_status = on_status or (lambda status, **info: None)
        self.open_timeout = open_timeout
        self.reconnects = 0
        self._closed = False
        self._socket: Any = None

    def close(self) -> None:
        self._closed = True
        if self._socket is not None:
            self._socket.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        backoff = 0.1
        while not self._closed:
            try:
                for event in self._one_connection():
                    backoff = 0.1
                    yield event
                if self._closed:
                    return
            except NovelForgeError:
                raise
            except (ConnectionClosed, InvalidHandshake, OSError, TimeoutError) as exc:
                if isinstance(exc, InvalidStatus) and exc.response.status_code in (401, 403):
                    raise Forbidden(f"the server refused the websocket handshake ({exc.response.status_code}): "
                                    "check the URL's origin and the token") from None
                if not self.reconnect or self._closed:
                    raise
                log.info("event stream dropped (%s); reconnecting after cursor %s", exc, self.cursor)
            if not self.reconnect:
                return
            self.reconnects += 1
            self.on_status("reconnecting", cursor=self.cursor, delay=backoff)
            time.sleep(backoff)
            backoff = min(self.max_backoff, backoff * 2)

    def _one_connection(self) -> Iterator[dict[str, Any]]:
        with connect(self.url, origin=Origin(self.origin), additional_headers={"Authorization": f"Bearer {self.token}"},
                     open_timeout=self.open_timeout) as ws:
            self._socket = ws
            # batch: the events one delivery found come in one frame ({"type": "events"}), in id order.
            subscribe: dict[str, Any] = {"type": "subscribe", "batch": True, **self.target}
            if self.cursor is not None:
                subscribe["after"] = self.cursor
            ws.send(json.dumps(subscribe))
            try:
                for raw in ws:
                    frame = json.loads(raw)
                    kind = frame.get("type")
                    if kind == "subscribed":
                        if self.cursor is None:
                            self.cursor = frame.get("after")
                        self.on_status("connected", cursor=self.cursor)
                    elif kind in ("events", "event"):
                        for event in frame["events"] if kind == "events" else [frame["event"]]:
                            if self.cursor is not None and event["id"] <= self.cursor:
                                continue  # never twice, even across reconnects
                            self.cursor = event["id"]
                            yield event
                    elif kind == "caught_up":
                        self.on_status("caught_up", cursor=frame.get("cursor"))
                    elif kind == "error":
                        err = frame.get("error", {})
                        log.info("event stream refused: %s", err)
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                if code in FATAL:
                    reason = exc.rcvd.reason if exc.rcvd is not None else ""
                    raise FATAL[code](reason or f"the event stream closed with {code}", code=None) from None
                raise
            finally:
                self._socket = None
            if self._closed:
                return
            # The server ended the iteration without a close frame we could read: reconnect.
            raise ConnectionError("the event stream ended")
