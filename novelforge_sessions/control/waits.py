"""What a run waits on: a registry of *wait kinds* (docs/model.md#waits).

A run can wait on several kinds of things — external results (handoffs), review gates, … —
and a checkpoint names what its cursor waits on under ``pending``, one key per kind. The
control plane does not know every kind: an app that adds one (``reviews`` adds review gates)
registers it here, and checkpoints and resume work through this interface only. The control
plane imports nothing from those apps.

A :class:`WaitKind` has

* ``name`` and ``pending_key`` — the checkpoint ``pending`` key it resolves (``"handoffs"``);
* ``resolve(scope, refs, field)`` — at checkpoint write: type and resolve the refs the client
  wrote; return the normalized refs to store, or raise the typed 422 (``ValidationFailed``)
  naming the field path (``pending.gates[0]``). Nothing is written on a refusal;
* ``waiting(session, run)`` — what ``run`` (typically the session's open run) waits on now;
* ``revalidate(scope)`` — for resume: a :class:`WaitCheck` (ok / failed + detail + data +
  repair route), reported as the resume step ``step`` (placed after ``results``). Optional:
  the handoff kind's checks are resume's own ``capabilities``/``results``/``consumed`` steps;
* ``waiting_many(session_ids)`` — optional, for read-outs (the overview's "waiting for"
  column): what each of these sessions waits on now, ``{session_id: [{"id", "label",
  "since"}]}``, in one query whatever the number of sessions;
* ``carry_over(session, run)`` — on resume: hand what is still awaited to the new run, so
  that whatever settles it later settles the run that now continues the cursor;
* ``handoff_purpose`` and ``claimants(handoff)`` — optional: the handoff purpose this kind's
  waits are served through (review gates: ``review`` slots) and who may claim one of those
  handoffs now by the kind's own rules, as the live runtimes of the eligible sessions. Resume's
  ``capabilities`` step asks :func:`claimants` for such a handoff instead of matching declared
  capabilities, and never counts the resumed runtime: it runs the session that waits on it;
* ``holds(session, run)`` — optional: what ``run`` waits on that *holds* the session, as
  :class:`Hold` (with the awaiting state it keeps the session in). While anything holds it,
  the run may not continue past it (a plain ``→ running``) nor end ``completed``
  (409 ``wait_outstanding``), and resume leaves the continuing run in that awaiting state.
  Review gates hold (a person's gate keeps the session ``awaiting_user``);
  handoffs do not: a run may go on with other work while a worker has its job, and a result
  bound later settles whichever run waits on it.
* ``withdraw(session, outbox, reason)`` — optional: cancel everything of this kind the session
  still waits on, each through the kind's own cancel mechanism (its rows, its events into
  ``outbox``). Called when the session enters a status that takes no more external work
  (``lifecycles.WORK_CLOSED_STATUSES``: terminated, stale), through the hook the control app
  installs at start-up (``actions.lifecycle.withdraw_waits``).

Every function runs inside the caller's transaction: ``resolve`` with the writing run locked
(``record_checkpoint``), ``revalidate`` and ``carry_over`` with the session row locked (``resume_session``),
``holds`` with the session row locked (``transition_session``, ``end_run``, ``resume_session``),
``withdraw`` with the session row locked, after its move (``apply_transition``).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q, QuerySet

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.actions.lifecycle import Hold, Outbox
from novelforge_sessions.control.handoffs import cancel_locked
from novelforge_sessions.control.models import UNBOUND_STATES, Handoff, HandoffPurpose
from novelforge_sessions.errors import ValidationFailed
from novelforge_sessions.models import Checkpoint, Project, RuntimeAttachment, Run, Session


class Repair:
    """The repair routes a failed resume step names (docs/model.md#resume)."""

    REFREEZE = "re-freeze"
    REREVIEW = "re-review"
    REAPPROVE = "re-approve"
    TERMINATE_AS_STALE = "terminate-as-stale"
    ATTACH_CAPABLE_RUNTIME = "attach-capable-runtime"
    RESOLVE_CONFLICT = "resolve-conflict"


@dataclass(frozen=True)
class WriteScope:
    """Where a checkpoint is being written (its run in the caller's reach; its refs are resolved before
    the write statement locks the run, and it decides after them: control/checkpoints.py)."""

    project_id: int
    session_id: int
    run_id: int


@dataclass(frozen=True)
class ResumeScope:
    """What a kind's revalidation sees: the session being resumed (locked), its project, the
    checkpoint resumed from (or None) and that checkpoint's refs under this kind's key."""

    session: Session
    project: Project
    checkpoint: Checkpoint | None
    refs: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class WaitCheck:
    ok: bool
    detail: str  # English; a phrase (``novelforge_sessions.phrases``), so the resume page can say it in its language
    data: dict[str, Any] = field(default_factory=dict)
    repair: str | None = None


Resolve = Callable[[WriteScope, list[Any], str], list[dict[str, Any]]]
Waiting = Callable[[Session, Run], list[dict[str, Any]]]
WaitingMany = Callable[[Sequence[int]], dict[int, list[dict[str, Any]]]]
Revalidate = Callable[[ResumeScope], WaitCheck]
CarryOver = Callable[[Session, Run], list[Any]]
Holds = Callable[[Session, Run], list[Hold]]
Withdraw = Callable[[Session, Outbox, str], None]
Claimants = Callable[[Handoff], QuerySet[RuntimeAttachment]]


@dataclass(frozen=True)
class WaitKind:
    name: str
    pending_key: str
    resolve: Resolve
    waiting: Waiting
    carry_over: CarryOver
    revalidate: Revalidate | None = None
    #: the resume report step of ``revalidate``
    step: str | None = None
    waiting_many: WaitingMany | None = None
    #: what of the run's waits holds the session (None: this kind never holds it)
    holds: Holds | None = None
    #: cancel what the session still waits on of this kind (None: nothing to withdraw)
    withdraw: Withdraw | None = None
    #: the handoff purpose this kind's waits are served through, and who may claim such a handoff now
    handoff_purpose: str | None = None
    claimants: Claimants | None = None

    def __post_init__(self) -> None:
        if (self.revalidate is None) != (self.step is None):
            raise ValueError("a wait kind reports a resume step exactly when it revalidates")
        if (self.handoff_purpose is None) != (self.claimants is None):
            raise ValueError("a wait kind names its handoff purpose exactly when it says who may claim those handoffs")
        if self.handoff_purpose == HandoffPurpose.JOB:
            raise ValueError("job handoffs are claimed by any worker declaring their capabilities: no kind owns them")


_KINDS: dict[str, WaitKind] = {}


def register(kind: WaitKind) -> WaitKind:
    """Register (or re-register, by name: idempotent across app reloads) a wait kind."""
    for other in _KINDS.values():
        if other.name != kind.name and (other.pending_key == kind.pending_key or (kind.step and other.step == kind.step)
                                         or (kind.handoff_purpose and other.handoff_purpose == kind.handoff_purpose)):
            raise ValueError(f"wait kind {kind.name!r} clashes with {other.name!r}")
    _KINDS[kind.name] = kind
    return kind


def kinds() -> tuple[WaitKind, ...]:
    """Registered kinds, in registration order."""
    return tuple(_KINDS.values())


def kind_for(pending_key: str) -> WaitKind | None:
    return next((k for k in _KINDS.values() if k.pending_key == pending_key), None)


def pending_keys() -> frozenset[str]:
    return frozenset(k.pending_key for k in _KINDS.values())


def resolve_pending(scope: WriteScope, pending: Mapping[str, list[Any]]) -> dict[str, list[dict[str, Any]]]:
    """Resolve every key of a checkpoint's ``pending`` with its kind (no query for an empty list)."""
    resolved: dict[str, list[dict[str, Any]]] = {}
    for key, refs in pending.items():
        kind = kind_for(key)
        if kind is None:
            raise ValidationFailed(f"unknown pending key {key!r}", field=f"pending.{key}", allowed=sorted(pending_keys()))
        resolved[key] = kind.resolve(scope, refs, f"pending.{key}") if refs else []
    return resolved


def waiting_on(session: Session, run: Run) -> dict[str, list[dict[str, Any]]]:
    """What ``run`` waits on, per pending key (kinds with nothing awaited are left out)."""
    found = {k.pending_key: k.waiting(session, run) for k in _KINDS.values()}
    return {key: items for key, items in found.items() if items}


def claimants(handoff: Handoff) -> QuerySet[RuntimeAttachment] | None:
    """Who may claim ``handoff`` now, for a purpose other than ``job``: the live runtimes the kind
    owning that purpose names (``WaitKind.claimants``; nobody when no kind owns it). ``None``
    for a job: any live runtime declaring its required capabilities may serve it."""
    if handoff.purpose == HandoffPurpose.JOB:
        return None
    kind = next((k for k in _KINDS.values() if k.handoff_purpose == handoff.purpose), None)
    return RuntimeAttachment.objects.none() if kind is None or kind.claimants is None else kind.claimants(handoff)


def holding(session: Session, run: Run) -> list[Hold]:
    """What ``run`` waits on that holds ``session``, by every kind that can hold (one query per
    such kind), by kind then id. Installed into the session actions at start-up (``apps.py``)."""
    found = [hold for kind in _KINDS.values() if kind.holds is not None for hold in kind.holds(session, run)]
    return sorted(found, key=lambda h: (h.kind, h.id))


def awaiting_status(held: Sequence[Hold]) -> rt.SessionStatus | None:
    """The awaiting state these holds keep the session in: ``awaiting_user`` while any waits on a
    person (docs/model.md#waits), else the one they name (``awaiting_external``); None when nothing holds."""
    states = {h.awaits for h in held}
    if rt.SessionStatus.AWAITING_USER in states:
        return rt.SessionStatus.AWAITING_USER
    return min(states) if states else None  # min: one deterministic answer should a kind add another


@dataclass(frozen=True)
class Waited:
    """One thing a session waits on, for read-outs: its kind, what it is, since when."""

    kind: str
    id: int
    label: str
    since: Any


def waiting_for_sessions(session_ids: Sequence[int]) -> dict[int, list[Waited]]:
    """What each of these sessions waits on now, by every kind that can say so in bulk
    (``waiting_many``): one query per kind, oldest first. Sessions waiting on nothing are left out."""
    found: dict[int, list[Waited]] = {}
    if not session_ids:
        return found
    for kind in _KINDS.values():
        if kind.waiting_many is None:
            continue
        for session_id, items in kind.waiting_many(session_ids).items():
            found.setdefault(session_id, []).extend(Waited(kind.name, i["id"], i["label"], i["since"]) for i in items)
    for items in found.values():
        items.sort(key=lambda w: (w.since, w.kind, w.id))
    return found


def withdraw(session: Session, outbox: Outbox, reason: str) -> None:
    """Cancel everything ``session`` still waits on, kind by kind, newest registration first:
    an app's kind withdraws its own records together with the handoffs they made (a review gate
    its review slots), then the control plane's own kind cancels whatever is still unbound.
    Installed into the session actions at start-up (``apps.py``)."""
    for kind in reversed(_KINDS.values()):
        if kind.withdraw is not None:
            kind.withdraw(session, outbox, reason)


def carry_over(session: Session, run: Run) -> dict[str, list[Any]]:
    """Hand everything the session still waits on to ``run`` (resume's new run)."""
    moved = {k.pending_key: k.carry_over(session, run) for k in _KINDS.values()}
    return {key: items for key, items in moved.items() if items}


# ---- the control plane's own kind: handoffs (external results) ----------------------------------
def _resolve_handoffs(scope: WriteScope, refs: list[Any], where: str) -> list[dict[str, Any]]:
    """``pending.handoffs``: ``"logical-id" | {"logical_id"} | {"handoff_id"}``, each a handoff
    of this session. Stored as ``{"handoff_id", "logical_id"}``. One query."""
    wanted: list[tuple[str, str | int]] = []
    for index, ref in enumerate(refs):
        at = f"{where}[{index}]"
        if isinstance(ref, Mapping):
            if len(ref) != 1 or not ({"logical_id", "handoff_id"} & set(ref)):
                raise ValidationFailed("a handoff ref is a logical id, {logical_id} or {handoff_id}", field=at)
            key, value = next(iter(ref.items()))
            at = f"{at}.{key}"
        elif isinstance(ref, str):
            key, value = "logical_id", ref
        else:
            raise ValidationFailed("a handoff ref is a logical id, {logical_id} or {handoff_id}", field=at)
        ok = (isinstance(value, str) and 0 < len(value) <= 200) if key == "logical_id" else (
            isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63)
        if not ok:
            raise ValidationFailed(f"{key} must be {'a logical id string' if key == 'logical_id' else 'a positive integer'}",
                                   field=at)
        wanted.append((at, value if key == "handoff_id" else str(value)))
    ids = [v for _, v in wanted if isinstance(v, int)]
    names = [v for _, v in wanted if isinstance(v, str)]
    rows = list(
        Handoff.objects.filter(session_id=scope.session_id).filter(Q(id__in=ids) | Q(logical_id__in=names))
        .values_list("id", "logical_id")
    )
    by_id = dict(rows)
    by_name = {name: hid for hid, name in rows}
    resolved: list[dict[str, Any]] = []
    seen: set[int] = set()
    for at, value in wanted:
        handoff_id = (value if value in by_id else None) if isinstance(value, int) else by_name.get(value)
        if handoff_id is None:
            raise ValidationFailed("no handoff of this session has this reference", field=at)
        if handoff_id in seen:
            raise ValidationFailed("each handoff is referenced once", field=at)
        seen.add(handoff_id)
        resolved.append({"handoff_id": handoff_id, "logical_id": by_id[handoff_id]})
    return resolved


def _waiting_handoffs(session: Session, run: Run) -> list[dict[str, Any]]:
    return list(
        Handoff.objects.filter(session=session, run=run, state__in=UNBOUND_STATES).order_by("id")
        .values("id", "logical_id", "state")
    )


def _waiting_handoffs_many(session_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
    found: dict[int, list[dict[str, Any]]] = {}
    rows = (Handoff.objects.filter(session_id__in=list(session_ids), state__in=UNBOUND_STATES)
            .order_by("id").values("id", "session_id", "logical_id", "state", "created_at"))
    for row in rows:
        found.setdefault(row["session_id"], []).append(
            {"id": row["id"], "label": f"handoff {row['logical_id']} ({row['state']})", "since": row["created_at"]})
    return found


def _carry_handoffs(session: Session, run: Run) -> list[str]:
    """Unbound handoffs follow the new run; its ``pending_external`` lists them."""
    unbound = Handoff.objects.filter(session=session, state__in=UNBOUND_STATES)
    waiting_for = list(unbound.order_by("id").values_list("logical_id", flat=True))
    if waiting_for:
        unbound.update(run=run)
        run.pending_external = waiting_for
        run.save(update_fields=["pending_external"])
    return waiting_for


def _withdraw_handoffs(session: Session, outbox: Outbox, reason: str) -> None:
    """Cancel every still-unbound handoff of the session, whichever run it belongs to (a job
    outlives the run that completed while a worker had it), as ``cancel_handoff`` does."""
    # Locked after the session (the global lock order): a racing claim, renewal or delivery
    # waits here and then finds the handoff cancelled.
    unbound = list(
        Handoff.objects.select_for_update(of=("self",)).filter(session=session, state__in=UNBOUND_STATES).order_by("id")
    )
    cancel_locked(session, unbound, reason=reason, outbox=outbox, settle_reason=reason)


HANDOFFS = register(WaitKind(
    name="handoff", pending_key="handoffs", resolve=_resolve_handoffs, waiting=_waiting_handoffs,
    carry_over=_carry_handoffs, waiting_many=_waiting_handoffs_many, withdraw=_withdraw_handoffs,
))

__all__ = [
    "HANDOFFS", "Hold", "awaiting_status", "claimants", "holding", "ResumeScope", "WaitCheck", "WaitKind", "WriteScope",
    "carry_over", "kind_for", "kinds", "pending_keys", "register", "resolve_pending", "waiting_on", "Waited",
    "waiting_for_sessions", "withdraw",
]
