"""Keep a runtime alive while code runs: attach (or take an attached runtime), heartbeat in the
background, notice abort and loss, detach on exit.

    with nf.runtime(session_id, "claude-code", lease_seconds=60) as rt:      # attaches
        run = nf.start_run(session_id, cursor={"step": "outline"})
        for step in steps:
            if rt.abort_requested.is_set():   # a manager asked the run to stop
                nf.end_run(run.id, "aborted"); break
            ...
    # detached here (the session's generation ended cleanly)

    s = nf.create_session(..., runtime={"runtime_family": "cli", "lease_seconds": 60})
    with nf.keep_alive(s.runtime_id, lease_seconds=60) as rt: ...

The heartbeat runs every ``lease_seconds × fraction`` (default a third of the lease, so two
beats can fail before the lease runs out). Each answer's ``abort_requested`` is honoured: the
lease sets :attr:`abort_requested` (a ``threading.Event`` / ``asyncio.Event``) and calls
``on_abort`` once. A heartbeat refused because the runtime is no longer live (the reconciler
found its lease expired, a newer generation superseded it, the session was closed) sets
:attr:`lost` and stops beating: the work must stop, it can no longer write. Network failures
are retried by the client; a beat that still fails is tried again at the next interval.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable

from novelforge_client.errors import NotFound, NovelForgeError, RuntimeNotLive, StaleRuntime, TransportError

if TYPE_CHECKING:
    from novelforge_client.client import AsyncClient, Client
    from novelforge_client.models import HeartbeatOut, RuntimeOut

log = logging.getLogger("novelforge_client.runtime")

#: Refusals that mean this runtime will never be live again.
LOST = (RuntimeNotLive, StaleRuntime, NotFound)
DEFAULT_LEASE = 60


class _LeaseState:
    def __init__(self, runtime_id: int, lease_seconds: int | None, fraction: float,
                 on_abort: Callable[[HeartbeatOut], Any] | None, detach: bool) -> None:
        if not 0 < fraction < 1:
            raise ValueError("fraction must be between 0 and 1")
        self.runtime_id = runtime_id
        self.lease_seconds = lease_seconds
        self.fraction = fraction
        self.on_abort = on_abort
        self.detach_on_exit = detach
        self.beats = 0
        self.last: HeartbeatOut | None = None
        self.lost_reason: NovelForgeError | None = None
        self.runtime: RuntimeOut | None = None

    @property
    def interval(self) -> float:
        return max(0.05, (self.lease_seconds or DEFAULT_LEASE) * self.fraction)

    def record(self, beat: HeartbeatOut, abort_event: Any) -> bool:
        """Record a beat; True when it newly signalled abort."""
        self.beats += 1
        self.last = beat
        if beat.abort_requested and not abort_event.is_set():
            abort_event.set()
            return True
        return False


class _LeaseView:
    """What the work reads of a lease, sync or async."""

    _state: _LeaseState

    # ---- what the work reads ----------------------------------------------------------------
    @property
    def id(self) -> int:
        return self._state.runtime_id

    @property
    def runtime(self) -> RuntimeOut | None:
        """The attachment as ``attach`` answered it (``None`` for :meth:`Client.keep_alive`)."""
        return self._state.runtime

    @property
    def beats(self) -> int:
        """Heartbeats the server acknowledged so far."""
        return self._state.beats

    @property
    def last_heartbeat(self) -> HeartbeatOut | None:
        return self._state.last

    @property
    def lost_reason(self) -> NovelForgeError | None:
        return self._state.lost_reason


class RuntimeLease(_LeaseView):
    """Sync: a daemon thread heartbeats; see the module doc."""

    def __init__(self, client: Client, runtime_id: int, *, lease_seconds: int | None = None, fraction: float = 1 / 3,
                 on_abort: Callable[[HeartbeatOut], Any] | None = None, detach: bool = True) -> None:
        self.client = client
        self._state = _LeaseState(runtime_id, lease_seconds, fraction, on_abort, detach)
        self.abort_requested = threading.Event()
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def attaching(cls, client: Client, session_id: int, runtime_family: str, *, capabilities: list[str] | None = None,
                  provider_metadata: dict[str, Any] | None = None, lease_seconds: int | None = None,
                  fraction: float = 1 / 3, on_abort: Callable[[HeartbeatOut], Any] | None = None,
                  detach: bool = True) -> RuntimeLease:
        runtime = client.attach(session_id, runtime_family, capabilities=capabilities,
                                provider_metadata=provider_metadata, lease_seconds=lease_seconds)
        lease = cls(client, runtime.id, lease_seconds=lease_seconds, fraction=fraction, on_abort=on_abort, detach=detach)
        lease._state.runtime = runtime
        lease._state.lease_seconds = runtime.lease_seconds
        return lease

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> RuntimeLease:
        if self._state.lease_seconds is None:  # beat at the lease the runtime was attached with
            self._state.lease_seconds = self.client.get_runtime(self.id).lease_seconds
        self._beat()  # at once: the lease starts fresh and an abort already requested is seen
        self._thread = threading.Thread(target=self._loop, name=f"novelforge-heartbeat-{self.id}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop beating and detach (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self._state.detach_on_exit and not self.lost.is_set():
            with contextlib.suppress(*LOST):
                self.client.detach(self.id)
            self._state.detach_on_exit = False

    def abandon(self) -> None:
        """Stop beating *without* detaching, as a crashed process would: the lease runs out and
        the reconciler marks the runtime lost (the session ``failed / runtime_lost``, resumable)."""
        self._state.detach_on_exit = False
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _beat(self) -> None:
        try:
            beat = self.client.heartbeat(self.id, lease_seconds=self._state.lease_seconds)
        except LOST as exc:
            self._state.lost_reason = exc
            self.lost.set()
            self._stop.set()
            log.warning("runtime %s is no longer live: %s", self.id, exc.code)
            return
        except TransportError as exc:
            log.warning("heartbeat of runtime %s failed (will retry): %s", self.id, exc)
            return
        if self._state.record(beat, self.abort_requested) and self._state.on_abort is not None:
            self._state.on_abort(beat)

    def _loop(self) -> None:
        while not self._stop.wait(self._state.interval):
            self._beat()


class AsyncRuntimeLease(_LeaseView):
    """Async: an asyncio task heartbeats; see the module doc."""

    def __init__(self, client: AsyncClient, runtime_id: int, *, lease_seconds: int | None = None,
                 fraction: float = 1 / 3, on_abort: Callable[[HeartbeatOut], Any] | None = None,
                 detach: bool = True) -> None:
        self.client = client
        self._state = _LeaseState(runtime_id, lease_seconds, fraction, on_abort, detach)
        self.abort_requested = asyncio.Event()
        self.lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._attach: dict[str, Any] | None = None

    @classmethod
    def attaching(cls, client: AsyncClient, session_id: int, runtime_family: str, *,
                  capabilities: list[str] | None = None, provider_metadata: dict[str, Any] | None = None,
                  lease_seconds: int | None = None, fraction: float = 1 / 3,
                  on_abort: Callable[[HeartbeatOut], Any] | None = None, detach: bool = True) -> AsyncRuntimeLease:
        lease = cls(client, 0, lease_seconds=lease_seconds, fraction=fraction, on_abort=on_abort, detach=detach)
        lease._attach = {"session_id": session_id, "runtime_family": runtime_family, "capabilities": capabilities,
                         "provider_metadata": provider_metadata, "lease_seconds": lease_seconds}
        return lease

    async def __aenter__(self) -> AsyncRuntimeLease:
        if self._attach is not None:  # attaching is a request: it happens here, awaited
            spec = self._attach
            runtime = await self.client.attach(spec.pop("session_id"), spec.pop("runtime_family"), **spec)
            self._state.runtime = runtime
            self._state.runtime_id = runtime.id
            self._state.lease_seconds = runtime.lease_seconds
            self._attach = None
        if self._state.lease_seconds is None:
            self._state.lease_seconds = (await self.client.get_runtime(self.id)).lease_seconds
        await self._beat()
        self._task = asyncio.create_task(self._loop(), name=f"novelforge-heartbeat-{self.id}")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._state.detach_on_exit and not self.lost.is_set():
            with contextlib.suppress(*LOST):
                await self.client.detach(self.id)
            self._state.detach_on_exit = False

    async def abandon(self) -> None:
        """Stop beating without detaching (see :meth:`RuntimeLease.abandon`)."""
        self._state.detach_on_exit = False
        await self.stop()

    async def _beat(self) -> None:
        try:
            beat = await self.client.heartbeat(self.id, lease_seconds=self._state.lease_seconds)
        except LOST as exc:
            self._state.lost_reason = exc
            self.lost.set()
            log.warning("runtime %s is no longer live: %s", self.id, exc.code)
            return
        except TransportError as exc:
            log.warning("heartbeat of runtime %s failed (will retry): %s", self.id, exc)
            return
        if self._state.record(beat, self.abort_requested) and self._state.on_abort is not None:
            result = self._state.on_abort(beat)
            if asyncio.iscoroutine(result):
                await result

    async def _loop(self) -> None:
        while not self.lost.is_set():
            await asyncio.sleep(self._state.interval)
            await self._beat()
