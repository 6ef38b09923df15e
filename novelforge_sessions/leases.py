"""Liveness from leases: the one predicate (DESIGN §13; seed 003).

A record saying ``live`` is an observation; the lease is the proof. A runtime is live when its
record says live *and* its lease has not run out. Every refusal, read-out and page asks these
functions (or ``RuntimeAttachment.objects.live()``, the same rule in SQL); the reconciler only
turns what they already say into records and events.

Pure: no Django, no I/O, no clock of its own (the caller passes ``now``).
"""
from __future__ import annotations

from datetime import datetime

from novelforge_sessions.session_runtime import RuntimeState


def lease_expired(expires_at: datetime | None, now: datetime) -> bool:
    """A lease has run out when its expiry is not after ``now``. No lease (``None``) never expires."""
    return expires_at is not None and expires_at <= now


def lease_held(expires_at: datetime | None, now: datetime) -> bool:
    """A lease is held while its expiry is after ``now`` (handoff leases: with their claim)."""
    return expires_at is not None and not lease_expired(expires_at, now)


def runtime_is_live(state: str, expires_at: datetime | None, now: datetime) -> bool:
    """Live: the record says live and the lease has not run out."""
    return state == RuntimeState.LIVE and lease_held(expires_at, now)


def runtime_lease_expired(state: str, expires_at: datetime | None, now: datetime) -> bool:
    """The record still says live, but its lease ran out: the runtime is gone, the record not yet tidied."""
    return state == RuntimeState.LIVE and lease_expired(expires_at, now)
