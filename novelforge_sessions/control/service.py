"""The control plane's ONE public interface (docs/model.md#the-control-plane).

Apps built on the control plane — ``reviews`` first, resume next — use only this module (plus
``errors`` and ``control.models`` for types and rows): never its SQL, its private
helpers or the action modules behind it (``control/handoffs.py``, ``control/results.py``,
which may move under ``control/``; these signatures stay). Every function takes keyword
arguments only and answers with a typed, frozen dataclass (or a model row).

Two kinds of function:

* **own transaction** — :func:`claim` and :func:`renew` are single statements that are
  safe inside or outside the caller's transaction;
* **inside the caller's transaction** — :func:`create_job`, :func:`bind`, :func:`cancel` and
  :func:`settle` expect ``transaction.atomic()`` and the session row lock
  (``actions.lifecycle.lock_session``: the global lock order is session, then run, then
  handoff rows), write their rows, and put their events in the caller's ``Outbox`` — the
  caller flushes it last, in the same transaction.

Scope: ``project_ids`` (the caller's projects) and ``session_id`` (a token bound to one
session sees only that session's handoffs; ``None``: any session of those projects).

Purpose (docs/model.md#handoffs): every handoff is a ``job`` (plain ``/handoffs`` routes, any
``work`` worker) or a ``review`` slot (only the review routes, an eligible reviewer). Each
lease function takes the ``purpose`` its route serves and never touches a handoff of the
other purpose; a plain route naming a review slot gets 409 ``review_route_required``.

Functions::

    create_job(*, session, run, logical_id, inputs, params, result_schema, required_capabilities,
               timeout_seconds, purpose, actor, outbox) -> Job
    claim(*, project_ids, session_id=None, handoff_id=None, capabilities, holder, purpose,
          token_id=None, actor, now=None, eligible=None) -> Claimed | None
    renew(*, handoff_id, fencing_token, project_ids, session_id=None, purpose) -> Lease
    lease_refusal(*, handoff_id, fencing_token, project_ids, session_id=None, purpose) -> ServiceError
    stale_lease(*, handoff, fencing_token, message=...) -> StaleLease
    bind(*, session, handoff, fencing_token, result, actor, outbox) -> Bound
    cancel(*, session, handoffs, reason, outbox, settle_reason=None) -> Cancelled
    settle(*, session, run_id, reason, outbox) -> Settled

What a run waits on (``control/waits.py``): handoffs are one wait kind; other apps register
theirs (``reviews`` registers review gates) with :func:`register_wait_kind`, giving a
``WaitKind`` that resolves checkpoint refs (``WriteScope``), lists what a run waits on,
revalidates on resume (``ResumeScope`` → ``WaitCheck`` with a ``Repair`` route), carries
the waits over to the resumed run and says which of them hold the session (``Hold``: the run
may not continue past it nor complete); a kind served through handoffs of its own purpose
(``reviews``: ``review`` slots) also says who may claim one now (``claimants``), which resume's
``capabilities`` step asks instead of matching declared capabilities::

    register_wait_kind(kind: WaitKind) -> None
    waiting_on(session, run) -> dict[str, list[dict]]
    holding(session, run) -> list[Hold]
    waiting_for_sessions(session_ids) -> dict[int, list[Waited]]   (read-outs: the overview)
"""
from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from novelforge_sessions.control import handoffs as _handoffs
from novelforge_sessions.control import results as _results
from novelforge_sessions.actions.lifecycle import Outbox
from novelforge_sessions.control.models import Handoff, HandoffPurpose
from novelforge_sessions.control.waits import (
    Hold, Repair, ResumeScope, WaitCheck, Waited, WaitKind, WriteScope, holding, waiting_for_sessions, waiting_on,
)
from novelforge_sessions.control.waits import register as register_wait_kind
from novelforge_sessions.errors import ServiceError, StaleLease
from novelforge_sessions.models import Run, Session
from novelforge_sessions.session_runtime import SessionStatus

__all__ = [
    "RESULTS_BOUND_REASON", "Bound", "Cancelled", "Claimed", "Eligibility", "HandoffPurpose", "Job", "Lease", "Settled",
    "bind", "cancel", "claim", "create_job", "lease_refusal", "renew", "settle", "stale_lease",
    "Hold", "Repair", "ResumeScope", "WaitCheck", "WaitKind", "WriteScope", "holding", "register_wait_kind", "waiting_on",
    "Waited", "waiting_for_sessions",
]

#: The status reason :func:`settle` records when the last awaited result of a run was bound.
RESULTS_BOUND_REASON = _handoffs.RESULTS_BOUND_REASON


# ---- results ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """A handoff inserted by :func:`create_job`."""

    handoff: Handoff

    @property
    def handoff_id(self) -> int:
        return self.handoff.id


@dataclass(frozen=True)
class Claimed:
    """A lease taken by :func:`claim`: the claimed row (state, attempt, fencing token and
    expiry already updated) and who held the lease before (``None``: a first claim)."""

    handoff: Handoff
    previous_holder: str | None
    outcome: Any = None  # what the claim's ``Eligibility.on_claim`` returned

    @property
    def handoff_id(self) -> int:
        return self.handoff.id

    @property
    def attempt(self) -> int:
        return self.handoff.attempt

    @property
    def fencing_token(self) -> int:
        return self.handoff.fencing_token

    @property
    def lease_expires_at(self) -> datetime:
        return self.handoff.lease_expires_at

    @property
    def reclaimed_after_expiry(self) -> bool:
        return self.handoff.attempt > 1


#: A renewed lease (:func:`renew`): ``handoff_id``, ``attempt``, ``fencing_token``, ``lease_expires_at``.
Lease = _handoffs.Lease

#: An app's own rule on top of claimability (:func:`claim`'s ``eligible``).
Eligibility = _handoffs.Eligibility


@dataclass(frozen=True)
class Bound:
    """A result bound by :func:`bind`: the consume-once receipt and the consumed delivery."""

    receipt_id: int
    delivery_id: int
    result_hash: str


@dataclass(frozen=True)
class Cancelled:
    """What :func:`cancel` withdrew (handoffs already bound, conflicted or cancelled are skipped)."""

    handoff_ids: tuple[int, ...]
    settled_runs: tuple[int, ...]


@dataclass(frozen=True)
class Settled:
    """A run after :func:`settle`: what it still waits on, and whether the session moved
    ``awaiting_external → running`` (with no live runtime it goes ``failed`` instead:
    ``session_status`` says so)."""

    run_id: int
    pending: tuple[str, ...]
    session_status: str
    resumed: bool


# ---- creating ---------------------------------------------------------------------------------------------
def create_job(
    *, session: Session, run: Run, logical_id: str, inputs: list[dict[str, Any]], params: dict[str, Any],
    result_schema: dict[str, str], required_capabilities: list[str], timeout_seconds: int,
    purpose: HandoffPurpose = HandoffPurpose.JOB, actor: str, outbox: Outbox,
) -> Job:
    """Freeze a job and hand it off from the open ``run`` of a locked ``running`` /
    ``awaiting_external`` ``session`` (inside the caller's transaction).

    Validates the job (422 naming the field), computes its fingerprint, inserts the handoff
    (409 ``logical_id_taken``, ``already_consumed``; 422 ``unknown_artifact_version``), lists
    the logical id in the run's ``pending_external``, adds ``handoff.created`` (and the
    session's ``running → awaiting_external`` transition) to ``outbox``.
    """
    spec = _handoffs.validate_job(
        logical_id=logical_id, inputs=inputs, params=params, result_schema=result_schema,
        required_capabilities=required_capabilities, timeout_seconds=timeout_seconds,
    )
    # Its callers resolve the inputs in their own caller's reach (a review gate's candidate:
    # ``reviews.actions.open_gate``), so the inputs are checked to exist, not reach (``reach=None``).
    return Job(_handoffs.insert_handoff(session, run, spec, actor=actor, outbox=outbox, reach=None, purpose=purpose))


# ---- leases -------------------------------------------------------------------------------------------------
def claim(
    *, project_ids: Collection[int], session_id: int | None = None, handoff_id: int | None = None,
    capabilities: list[str], holder: str, purpose: HandoffPurpose, token_id: int | None = None, actor: str,
    now: datetime | None = None, eligible: Eligibility | None = None,
) -> Claimed | None:
    """Claim the oldest claimable handoff of ``purpose`` in scope (or only ``handoff_id``).

    Claimable: pending, or claimed with an expired lease; ``required_capabilities`` ⊆
    ``capabilities``; its session neither terminated nor stale. One statement (``FOR UPDATE
    SKIP LOCKED``): of racing claims exactly one gets the row; attempt and fencing token
    advance by one, the lease lasts the handoff's ``timeout_seconds``. Appends
    ``handoff.claimed`` (actor ``actor``, worker ``holder``) in the current transaction, or,
    called outside one, in transactions of its own: a claim that lost its candidate's session
    to racing claimers then tries the next session (``events.claim_in_oldest_session``).
    ``None``: nothing claimable — no explanation (the caller's route words its own).

    ``eligible``: an app's own rule for its purpose's handoffs (:class:`Eligibility`: an SQL
    condition on the candidate row, its own locks before the row's, its own writes with the
    claim, whose result is ``Claimed.outcome``), within the same statement and transaction.
    """
    claimed = _handoffs.claim_row(
        project_ids=project_ids, session_id=session_id, handoff_id=handoff_id, capabilities=list(capabilities),
        holder=holder, token_id=token_id, purpose=purpose, now=now or timezone.now(), actor=actor, eligible=eligible,
    )
    if claimed is None:
        return None
    handoff = claimed.handoff
    return Claimed(handoff, getattr(handoff, "previous_holder", None) or None, claimed.outcome)


def renew(
    *, handoff_id: int, fencing_token: int, project_ids: Collection[int], session_id: int | None = None,
    purpose: HandoffPurpose,
) -> Lease:
    """Extend the lease of the current token holder (one conditional UPDATE, no event).

    Refusals (raised, nothing written) are :func:`lease_refusal`'s.
    """
    return _handoffs.renew_lease(handoff_id=handoff_id, fencing_token=fencing_token, project_ids=project_ids,
                                 session_id=session_id, purpose=purpose)


def lease_refusal(
    *, handoff_id: int, fencing_token: int, project_ids: Collection[int], session_id: int | None = None,
    purpose: HandoffPurpose,
) -> ServiceError:
    """Explain why a lease write (renew, a fenced result) on ``handoff_id`` matched nothing,
    the most fundamental reason first: 404 ``not_found`` (not in scope), 409
    ``review_route_required`` (a review slot on a plain route), 409 ``stale_lease`` (a later
    claim superseded ``fencing_token``), 409 ``handoff_not_claimable`` (not claimed) or 409
    ``handoff_closed`` (bound, conflicted or cancelled). Returned for the caller to raise."""
    return _handoffs.lease_refusal(handoff_id=handoff_id, fencing_token=fencing_token, project_ids=project_ids,
                                   session_id=session_id, purpose=purpose)


def stale_lease(
    *, handoff: Handoff, fencing_token: int,
    message: str = "this fencing token was superseded by a later claim; nothing was stored",
) -> StaleLease:
    """The 409 ``stale_lease`` for a write carrying a superseded ``fencing_token``."""
    return StaleLease(message, handoff_id=handoff.id, fencing_token=fencing_token,
                      current_fencing_token=handoff.fencing_token, attempt=handoff.attempt)


# ---- binding, cancelling, settling (inside the caller's transaction) ---------------------------------
def bind(
    *, session: Session, handoff: Handoff, fencing_token: int, result: dict[str, Any], actor: str, outbox: Outbox,
) -> Bound:
    """Consume ``result`` as the handoff's result: the ``consumed`` delivery row, its
    validation, the consume-once receipt, ``handoff.result_consumed`` in ``outbox``.

    The caller holds the session and handoff row locks, has checked the fencing token and
    validated ``result`` against its own typed schema (e.g. a review verdict); the binding
    UPDATE is fenced again (409 ``stale_lease`` / ``handoff_not_claimable`` /
    ``handoff_closed`` if it matches nothing). Does not settle: call :func:`settle` after.
    """
    receipt = _results.consume_locked(session, handoff, fencing_token=fencing_token, result=result, actor=actor,
                                   outbox=outbox)
    return Bound(receipt.id, receipt.delivery_id, receipt.result_hash)


def cancel(
    *, session: Session, handoffs: Iterable[Handoff], reason: str, outbox: Outbox, settle_reason: str | None = None,
) -> Cancelled:
    """Withdraw the still-unbound ``handoffs`` of the locked ``session`` (rows locked by the
    caller, e.g. ``select_for_update``): each becomes ``cancelled`` with a
    ``handoff.cancelled`` event carrying ``reason``; then each run they belonged to is
    settled with ``settle_reason`` (default ``"handoff <logical id> cancelled"``).
    Any purpose: the caller decides who may cancel (the review app: the gate's owner)."""
    done = _handoffs.cancel_locked(session, list(handoffs), reason=reason, outbox=outbox, settle_reason=settle_reason)
    return Cancelled(tuple(h.id for h in done), tuple(dict.fromkeys(h.run_id for h in done)))


def settle(*, session: Session, run_id: int, reason: str, outbox: Outbox) -> Settled:
    """A handoff of ``run_id`` stopped waiting (bound or cancelled): refresh the run's
    ``pending_external``; when nothing of the open run is pending any more, a session that
    was ``awaiting_external`` returns to ``running`` with ``reason`` as its status reason
    (and in the ``session.transitioned`` event) — say why: :data:`RESULTS_BOUND_REASON`,
    ``"handoff X cancelled"``, ``"review gate N bound"``… — if a runtime is live to run it;
    with none (closed, lost, or its lease ran out) it goes ``failed / runtime_lost``, its run
    interrupted, and resume is the way back."""
    before = session.status
    remaining = _handoffs.settle_waiting_run(session, run_id, outbox, reason=reason)
    resumed = before != session.status and session.status == SessionStatus.RUNNING
    return Settled(run_id, tuple(remaining), session.status, resumed)
