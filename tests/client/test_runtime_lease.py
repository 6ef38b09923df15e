"""The runtime context manager against a real server: it heartbeats in the background past two
lease periods (a 2 s lease; the test waits on the database's heartbeat times with a deadline,
and the reconciler run meanwhile finds nothing expired), honours abort, notices loss, and
detaches on exit — sync (a thread) and async (a task)."""
from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from novelforge_client import AsyncClient, Client
from novelforge_client import errors as E
from novelforge_sessions.actions.runtimes import reconcile_expired_runtimes
from novelforge_sessions.models import RuntimeAttachment
from tests.support.waits import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 2  # seconds (the API takes ≥ 1; 2 leaves a loaded machine room for a slow beat)
WRITER = dict(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli")


def _in_thread(fn):
    """Run ORM code from an asyncio.to_thread worker and close that thread's connection after."""
    from django.db import connection

    def run(*args):
        try:
            return fn(*args)
        finally:
            connection.close()

    return run


def _heartbeats_span_two_leases(runtime_id: int, seen: list) -> bool:
    """Poll the record: every time we look, the lease is live; done once the server acknowledged
    heartbeats over more than two lease periods after attaching."""
    row = RuntimeAttachment.objects.get(id=runtime_id)
    now = timezone.now()
    assert row.lease_expires_at > now - timedelta(milliseconds=200), "the lease ran out while the manager held it"
    assert not reconcile_expired_runtimes(now=now - timedelta(milliseconds=200)), "the reconciler found it expired"
    seen.append(row.heartbeat_at)
    return (row.heartbeat_at - row.attached_at).total_seconds() > 2 * LEASE


def test_sync_lease_heartbeats_past_two_lease_periods_and_detaches(server, token):
    nf = Client(server.url, token)
    s = nf.create_session(**WRITER)
    with nf.runtime(s.id, "cli", lease_seconds=LEASE) as rt:
        assert rt.runtime is not None and rt.runtime.lease_seconds == LEASE
        seen: list = []
        wait_until(lambda: _heartbeats_span_two_leases(rt.id, seen), "heartbeats over two lease periods")
        assert len(set(seen)) >= 3 and rt.beats >= 3 and not rt.lost.is_set()
        run = nf.start_run(s.id, cursor={"step": "still-alive"})  # the runtime is live: writes work
        nf.end_run(run.id, "completed")
    row = RuntimeAttachment.objects.get(id=rt.id)
    assert row.ended_at is not None and not nf.get_runtime(rt.id).live
    assert nf.runtime_for(s.id) is None


def test_sync_lease_honours_abort_and_loss(server, token):
    nf = Client(server.url, token)
    s = nf.create_session(**WRITER, runtime={"runtime_family": "cli", "lease_seconds": LEASE})
    aborts: list = []
    with nf.keep_alive(s.runtime_id, lease_seconds=LEASE) as rt:
        rt._state.on_abort = aborts.append
        run = nf.start_run(s.id, cursor={"step": "long"})
        Client(server.url, token).abort(s.id, "a manager said stop", runtime_id=s.runtime_id)
        assert rt.abort_requested.wait(timeout=30)
        wait_until(lambda: aborts, "on_abort")
        assert len(aborts) == 1 and aborts[0].open_run_id == run.id
        nf.end_run(run.id, "aborted")
        # the lease runs out in the database and the reconciler marks the runtime lost
        RuntimeAttachment.objects.filter(id=rt.id).update(lease_expires_at=timezone.now() - timedelta(seconds=5))
        reconcile_expired_runtimes()
        assert rt.lost.wait(timeout=30)
        assert isinstance(rt.lost_reason, E.RuntimeNotLive)
    assert len(aborts) == 1


def test_async_lease_heartbeats_past_two_lease_periods_and_detaches(server, token):
    async def scenario() -> int:
        async with AsyncClient(server.url, token) as nf:
            s = await nf.create_session(**WRITER)
            async with nf.runtime(s.id, "cli", lease_seconds=LEASE) as rt:
                seen: list = []
                deadline = time.monotonic() + 30
                while not await asyncio.to_thread(_in_thread(_heartbeats_span_two_leases), rt.id, seen):
                    assert time.monotonic() < deadline, "timed out waiting for heartbeats"
                    await asyncio.sleep(0.05)
                assert rt.beats >= 3 and not rt.lost.is_set()
                run = await nf.start_run(s.id, cursor={"step": "long"})
                await nf.abort(s.id, "stop", runtime_id=rt.id)
                await asyncio.wait_for(rt.abort_requested.wait(), timeout=30)
                await nf.end_run(run.id, "aborted")
            return rt.id

    runtime_id = asyncio.run(scenario())
    assert RuntimeAttachment.objects.get(id=runtime_id).ended_at is not None


def test_async_lease_notices_loss(server, token):
    async def scenario() -> None:
        async with AsyncClient(server.url, token) as nf:
            s = await nf.create_session(**WRITER, runtime={"runtime_family": "cli", "lease_seconds": LEASE})
            async with nf.keep_alive(s.runtime_id) as rt:
                assert rt._state.lease_seconds == LEASE  # learnt from the attachment
                await asyncio.to_thread(_in_thread(
                    lambda: (RuntimeAttachment.objects.filter(id=rt.id).update(
                        lease_expires_at=timezone.now() - timedelta(seconds=5)), reconcile_expired_runtimes())))
                await asyncio.wait_for(rt.lost.wait(), timeout=30)
                assert isinstance(rt.lost_reason, E.RuntimeNotLive)

    asyncio.run(scenario())
