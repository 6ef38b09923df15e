"""Graceful shutdown under daphne: SIGTERM drains instead of cutting (installed by ``server.patches``).

What daphne does by itself (4.x, ``daphne/server.py``): Twisted's SIGTERM handler stops the
reactor; a "before shutdown" trigger, ``Server.kill_all_applications``, *cancels* every running
application instance at once. An HTTP request in flight is cut (the client sees the connection
drop; its transaction may still commit in the worker thread) and every websocket drops without a
close frame (browsers see 1006). daphne has no ASGI lifespan support, so an application cannot
hook the shutdown through ASGI.

``server.patches.install()`` (called by ``novelforge_sessions.asgi`` when it is loaded by daphne)
replaces that trigger (``Server.kill_all_applications``) with :func:`drain_then_kill`, in this order:

1. stop listening (new connections are refused, so a proxy such as nginx moves them to another
   upstream; ``proxy_next_upstream error`` retries a refused connection even for a POST);
2. close every open websocket with **1012 (service restart)** — the dashboard treats any code but
   its final 44xx codes as "reconnect with backoff", and resumes each subscription ``after`` its
   cursor (replayed from the event table), so nothing is missed;
3. wait for every HTTP request in flight to finish and send its response, and for the
   websockets' close handshakes (bounded by
   ``SHUTDOWN_GRACE_SECONDS``, default 20 — below the usual 30 s a supervisor waits before
   SIGKILL);
4. only then cancel whatever is left (nothing, unless the grace ran out), as daphne's own
   ``kill_all_applications`` would — but without its KeyError on an entry that has no
   application instance (a request upgraded to a websocket, not yet reaped).

A response is sent only after its transaction committed, so every write a client saw a 2xx for
is in the database; a request cut by an expired grace got no 2xx (it may or may not have
committed — the idempotency key exists for that retry).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

logger = logging.getLogger(__name__)

#: The close code sent to websockets on shutdown: 1012 "Service Restart" (RFC 6455 registry):
#: the server is going away for a moment; reconnect (to this address, another process serves).
SHUTDOWN_CLOSE_CODE = 1012
POLL_SECONDS = 0.05


def grace_seconds() -> float:
    """``SHUTDOWN_GRACE_SECONDS`` (default 20): a malformed or negative value stops start-up."""
    from django.core.exceptions import ImproperlyConfigured

    raw = os.environ.get("SHUTDOWN_GRACE_SECONDS", "20").strip()
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ImproperlyConfigured(f"SHUTDOWN_GRACE_SECONDS must be a number of seconds >= 0, got {raw!r}")
    return value


#: The grace the drain waits, read (and validated) by ``server.patches.install`` at start-up.
GRACE = {"seconds": 20.0}


def drain_then_kill(server: Any) -> Any:  # a daphne.server.Server; returns a Deferred
    """The "before shutdown" trigger: returns a Deferred Twisted waits for."""
    from twisted.internet import defer, reactor
    from twisted.internet.interfaces import IListeningPort

    from daphne.ws_protocol import WebSocketProtocol

    for reader in list(reactor.getReaders()):
        if IListeningPort.providedBy(reader):
            reader.stopListening()
    closed = 0
    for protocol, details in list(server.connections.items()):
        if isinstance(protocol, WebSocketProtocol) and "disconnected" not in details:
            if protocol.state == protocol.STATE_OPEN:
                protocol.sendCloseFrame(code=SHUTDOWN_CLOSE_CODE, reasonUtf8=b"server restarting")
                closed += 1
    # INFO only when there was something to drain: an idle process exits silently.
    logger.log(logging.INFO if closed else logging.DEBUG,
               "shutdown: stopped listening, closed %d websocket(s) with %d", closed, SHUTDOWN_CLOSE_CODE)

    done = defer.Deferred()
    deadline = time.monotonic() + GRACE["seconds"]

    def in_flight() -> int:
        count = 0
        for protocol, details in list(server.connections.items()):
            if isinstance(protocol, WebSocketProtocol):
                # Closed above: wait for the close handshake (autobahn drops a silent peer
                # after its closeHandshakeTimeout); its consumer ends on websocket.disconnect.
                count += "disconnected" not in details
                continue
            instance = details.get("application_instance")
            if instance is not None and not instance.done():
                count += 1
        return count

    def check() -> None:
        left = in_flight()
        if left and time.monotonic() < deadline:
            reactor.callLater(POLL_SECONDS, check)
            return
        if left:
            logger.warning("shutdown: grace ran out with %d request(s) in flight", left)
        _cancel_the_rest(server).chainDeferred(done)

    check()
    return done


def _cancel_the_rest(server: Any) -> Any:
    """daphne's ``kill_all_applications``, minus its KeyError: a request that was upgraded to a
    websocket stays in ``server.connections`` without an ``application_instance`` until the
    next reap, and daphne's version indexes it (raised inside this drain, the shutdown would
    never complete)."""
    import asyncio

    from twisted.internet import defer

    pending = []
    for details in list(server.connections.values()):
        instance = details.get("application_instance")
        if instance is not None and not instance.done():
            instance.cancel()
            pending.append(instance)
    logger.log(logging.INFO if pending else logging.DEBUG,
               "shutdown: cancelled %d application instance(s) left", len(pending))
    waiting = defer.Deferred.fromFuture(asyncio.gather(*pending, return_exceptions=True))
    waiting.addErrback(lambda _failure: None)
    return waiting
