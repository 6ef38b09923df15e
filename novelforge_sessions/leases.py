"""Liveness from leases: the one predicate (docs/model.md#runtimes-and-leases).

A record saying ``live`` is an observation; the lease is the proof. A runtime is live when its
record says live *and* its lease has not run out. Every refusal, read-out and page asks these
functions (or ``RuntimeAttachment.objects.live()``, the same rule in SQL); the reconciler only
turns what they already say into records and events.

Pure: no Django, no I/O, no clock of its own (the caller passes ``now``).
"""
from __future__ import annotations

from datetime import datetime

from novelforge_sessions.lifecycles import HandoffState
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


def runtime_problem(state: str, expires_at: datetime | None, now: datetime) -> bool:
    """A lost runtime, or one still recorded live whose lease has run out."""
    return state == RuntimeState.LOST or runtime_lease_expired(state, expires_at, now)


def handoff_lease_held(state: str, expires_at: datetime | None, now: datetime) -> bool:
    """A worker holds the handoff: claimed, and the lease has not run out."""
    return state == HandoffState.CLAIMED and lease_held(expires_at, now)


def handoff_lease_expired(state: str, expires_at: datetime | None, now: datetime) -> bool:
    """Claimed, but the lease ran out: the job is claimable again."""
    return state == HandoffState.CLAIMED and not lease_held(expires_at, now)


def handoff_claimable(state: str, expires_at: datetime | None, now: datetime) -> bool:
    """Pending, or claimed with an expired lease (the claim statement's rule, in SQL there)."""
    return state == HandoffState.PENDING or handoff_lease_expired(state, expires_at, now)
