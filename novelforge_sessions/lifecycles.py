"""Every record's lifecycle, declared once as data (docs/model.md#record-lifecycles).

The pure core of the service, below :mod:`novelforge_sessions.session_runtime` (the payload
validators). Each record that has states — session, run, runtime
attachment, handoff, write intent, review gate, review assignment, webhook delivery — declares here its states
(an enum), its initial state and its table of legal transitions. Nothing else in the service
spells a state name: models take their choices and constraints from these enums, actions
check every status write with :meth:`Lifecycle.check` (through one transition helper,
``actions.lifecycle.move`` / ``apply_transition`` for sessions), and raw SQL receives state
values as parameters taken from the enums.

No Django import and no I/O: every table is validated in microseconds by
:func:`validate_all` (every state has a row, the initial state reaches every state, terminal
states have no exit) and the same input always yields the same result or the same typed
:class:`IllegalTransition`, whose details are always ``record``, ``from``, ``to`` and ``allowed``.

Self-transitions are listed explicitly where a record legitimately re-enters its state (a
handoff re-claimed after its lease ran out, a review slot handed to the next reviewer).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


# ---- the pure refusals (the service maps them onto its catalog: ``errors.from_rule_error``) ------
class RuntimeRuleError(Exception):
    """A deterministic refusal: the same input always produces the same code and details."""

    code = "rule_violation"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class IllegalTransition(RuntimeRuleError):
    code = "illegal_transition"


class InvalidPayload(RuntimeRuleError):
    code = "validation_error"


# ---- the states ----------------------------------------------------------------------------
class SessionStatus(StrEnum):
    CREATED = "created"
    RUNNING = "running"
    IDLE = "idle"
    AWAITING_USER = "awaiting_user"
    AWAITING_EXTERNAL = "awaiting_external"
    COMPLETED = "completed"
    FAILED = "failed"
    TERMINATED = "terminated"
    STALE = "stale"


class RunState(StrEnum):
    OPEN = "open"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"
    INTERRUPTED = "interrupted"
    TERMINATED = "terminated"


class RuntimeState(StrEnum):
    LIVE = "live"
    CLOSED = "closed"
    LOST = "lost"


class HandoffState(StrEnum):
    PENDING = "pending"  # frozen, waiting for a worker
    CLAIMED = "claimed"  # a worker holds the lease (it may have run out: then it is claimable again)
    BOUND = "bound"  # a valid result was consumed and bound to the frozen job
    CONFLICTED = "conflicted"  # a different result arrived for the consumed logical id: hard stop
    CANCELLED = "cancelled"


class IntentState(StrEnum):
    PROPOSED = "proposed"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXECUTED = "executed"
    REFUSED = "refused"  # the compare-and-swap found a stale before-state: terminal


class GateState(StrEnum):
    PENDING = "pending"
    COMPLETE = "complete"
    CANCELLED = "cancelled"


class AssignmentState(StrEnum):
    OPEN = "open"  # an unclaimed agent slot
    ASSIGNED = "assigned"
    SUBMITTED = "submitted"


class DeliveryState(StrEnum):
    PENDING = "pending"  # due now, or after its backoff
    DELIVERED = "delivered"  # the endpoint answered 2xx
    FAILED = "failed"  # no 2xx within its retry window (docs/webhooks.md#retries)


@dataclass(frozen=True)
class Lifecycle:
    """One record's states and legal transitions. ``field`` is the model column holding it."""

    record: str
    states: type[StrEnum]
    initial: StrEnum
    table: Mapping[StrEnum, frozenset[StrEnum]]
    field: str = "state"

    def state(self, value: str | StrEnum) -> StrEnum:
        try:
            return self.states(value)
        except ValueError:
            raise InvalidPayload(
                f"{value!r} is not a {self.record} state", field=self.field, allowed=self.values()
            ) from None

    def values(self) -> list[str]:
        return [s.value for s in self.states]

    def targets(self, current: str | StrEnum) -> frozenset[StrEnum]:
        return self.table[self.state(current)]

    def is_legal(self, current: str | StrEnum, target: str | StrEnum) -> bool:
        return self.state(target) in self.targets(current)

    def check(self, current: str | StrEnum, target: str | StrEnum) -> StrEnum:
        """The target state if ``current → target`` is in the table; else ``IllegalTransition``."""
        src, dst = self.state(current), self.state(target)
        if dst not in self.table[src]:
            raise IllegalTransition(
                f"{src.value} → {dst.value} is not a legal {self.record} transition",
                record=self.record,
                **{"from": src.value, "to": dst.value, "allowed": sorted(t.value for t in self.table[src])},
            )
        return dst

    def sources(self, target: str | StrEnum) -> list[str]:
        """Every state from which ``target`` is legal, sorted: the ``WHERE state IN (...)`` of a
        conditional UPDATE that moves rows to ``target``."""
        dst = self.state(target)
        return sorted(s.value for s, targets in self.table.items() if dst in targets)

    @property
    def terminal(self) -> frozenset[StrEnum]:
        return frozenset(s for s, targets in self.table.items() if not targets)

    def validate(self) -> None:
        """Structural checks: raise ``LifecycleTableError`` naming what is wrong."""
        states = set(self.states)
        if set(self.table) != states:
            raise LifecycleTableError(f"{self.record}: rows missing for {sorted(states - set(self.table))}")
        for src, targets in self.table.items():
            if not set(targets) <= states:
                raise LifecycleTableError(f"{self.record}: {src} leads outside the states")
        if self.initial not in states:
            raise LifecycleTableError(f"{self.record}: initial state {self.initial} is not a state")
        reachable, frontier = {self.initial}, [self.initial]
        while frontier:
            for nxt in self.table[frontier.pop()]:
                if nxt not in reachable:
                    reachable.add(nxt)
                    frontier.append(nxt)
        if reachable != states:
            raise LifecycleTableError(f"{self.record}: unreachable from {self.initial}: {sorted(states - reachable)}")
        if not self.terminal:
            raise LifecycleTableError(f"{self.record}: no terminal state")


class LifecycleTableError(AssertionError):
    """A declared table is malformed (a programming error, caught by the tests)."""


def _table(rows: Mapping[StrEnum, Iterable[StrEnum]]) -> dict[StrEnum, frozenset[StrEnum]]:
    return {state: frozenset(targets) for state, targets in rows.items()}


S, R, T, H, I, G, A = SessionStatus, RunState, RuntimeState, HandoffState, IntentState, GateState, AssignmentState

#: The session table (docs/model.md#session-lifecycle), exactly. Anything not listed is illegal; it lists
#: no self-transition
#: (a "no-op" transition would hide a client's confused state).
SESSION = Lifecycle("session", SessionStatus, S.CREATED, _table({
    S.CREATED: {S.RUNNING},
    S.RUNNING: {S.IDLE, S.AWAITING_USER, S.AWAITING_EXTERNAL, S.COMPLETED, S.FAILED, S.TERMINATED, S.STALE},
    S.IDLE: {S.RUNNING, S.COMPLETED, S.TERMINATED, S.STALE},
    S.AWAITING_USER: {S.RUNNING, S.FAILED, S.TERMINATED, S.STALE},
    S.AWAITING_EXTERNAL: {S.RUNNING, S.FAILED, S.TERMINATED, S.STALE},
    S.FAILED: {S.RUNNING, S.TERMINATED, S.STALE},
    S.COMPLETED: {S.STALE},
    S.STALE: {S.TERMINATED},
    S.TERMINATED: (),
}), field="status")

#: Session statuses that hold an open run (the run is executing or waiting inside the session).
RUN_HOLDING_STATES: frozenset[SessionStatus] = frozenset({S.RUNNING, S.AWAITING_USER, S.AWAITING_EXTERNAL})

#: A run is open until it ends, once (docs/model.md#runs). Which end follows which session move is
#: ``RUN_END_ON_STATUS``.
RUN = Lifecycle("run", RunState, R.OPEN, _table({
    R.OPEN: {R.COMPLETED, R.FAILED, R.ABORTED, R.INTERRUPTED, R.TERMINATED},
    R.COMPLETED: (), R.FAILED: (), R.ABORTED: (), R.INTERRUPTED: (), R.TERMINATED: (),
}))

#: One generation of a runtime: live until closed (close, detach, terminate) or lost (its
#: lease ran out). Liveness itself is derived (``leases``): a record saying live is an observation.
RUNTIME = Lifecycle("runtime", RuntimeState, T.LIVE, _table({
    T.LIVE: {T.CLOSED, T.LOST},
    T.CLOSED: (), T.LOST: (),
}))

#: A frozen external job (docs/model.md#handoffs). ``claimed → claimed`` is a re-claim after the lease ran
#: out (attempt + 1, new fencing token); ``conflicted → bound`` is a manager's resolution (the
#: consumed result stands).
HANDOFF = Lifecycle("handoff", HandoffState, H.PENDING, _table({
    H.PENDING: {H.CLAIMED, H.CANCELLED},
    H.CLAIMED: {H.CLAIMED, H.BOUND, H.CANCELLED},
    H.BOUND: {H.CONFLICTED},
    H.CONFLICTED: {H.BOUND},
    H.CANCELLED: (),
}))

#: A consequential write (docs/model.md#write-intents-and-authority). Revoking an approval returns it to ``proposed``; a
#: project that needs no approval executes (or refuses) a proposed intent directly.
#: ``approved → approved``: a re-approval supersedes a standing approval that went stale (the
#: project's authority moved since; resume's "re-approve" repair route).
WRITE_INTENT = Lifecycle("write intent", IntentState, I.PROPOSED, _table({
    I.PROPOSED: {I.APPROVED, I.REJECTED, I.EXECUTED, I.REFUSED},
    I.APPROVED: {I.PROPOSED, I.APPROVED, I.REJECTED, I.EXECUTED, I.REFUSED},
    I.REJECTED: (), I.EXECUTED: (), I.REFUSED: (),
}))

#: A review gate waits for its required verdicts, or is withdrawn.
REVIEW_GATE = Lifecycle("review gate", GateState, G.PENDING, _table({
    G.PENDING: {G.COMPLETE, G.CANCELLED},
    G.COMPLETE: (), G.CANCELLED: (),
}))

#: One reviewer slot. ``assigned → assigned``: an agent slot whose claim ran out moves to the
#: next eligible reviewer. Human slots are created ``assigned``.
REVIEW_ASSIGNMENT = Lifecycle("review assignment", AssignmentState, A.OPEN, _table({
    A.OPEN: {A.ASSIGNED},
    A.ASSIGNED: {A.ASSIGNED, A.SUBMITTED},
    A.SUBMITTED: (),
}))

#: One event's delivery to one webhook endpoint (docs/webhooks.md). ``pending → pending``: a
#: failed attempt waits for its retry; ``failed → pending``: redelivered on request.
WEBHOOK_DELIVERY = Lifecycle("webhook delivery", DeliveryState, DeliveryState.PENDING, _table({
    DeliveryState.PENDING: {DeliveryState.PENDING, DeliveryState.DELIVERED, DeliveryState.FAILED},
    DeliveryState.DELIVERED: (),  # redelivering it makes a new delivery (same webhook-id)
    DeliveryState.FAILED: {DeliveryState.PENDING},
}))

ALL: tuple[Lifecycle, ...] = (SESSION, RUN, RUNTIME, HANDOFF, WRITE_INTENT, REVIEW_GATE, REVIEW_ASSIGNMENT, WEBHOOK_DELIVERY)

#: When a session leaves the run-holding states, its open run ends with this state.
RUN_END_ON_STATUS: Mapping[SessionStatus, RunState] = {
    S.IDLE: R.COMPLETED,
    S.COMPLETED: R.COMPLETED,
    S.FAILED: R.FAILED,
    S.TERMINATED: R.TERMINATED,
    S.STALE: R.INTERRUPTED,
}


def validate_all() -> None:
    for lifecycle in ALL:
        lifecycle.validate()


# ---- predicates shared by actions and edges ------------------------------------------------
# What actions refuse and pages/API read-outs show are decided by the same functions, so no
# route, page or consumer re-derives a domain rule. (Lease predicates: ``leases``.)

#: Ending a run: outcome (the run's end state) → (the session's default next status, the
#: statuses the session may go to instead). The API's ``outcome``/``session_status`` choices.
#: An aborted run may also leave its session ``failed``: the only way an aborted run of a
#: *waiting* session can end, since the table has no ``awaiting_* → idle`` (``run_end_status``).
RUN_OUTCOMES: Mapping[RunState, tuple[SessionStatus, frozenset[SessionStatus]]] = {
    R.COMPLETED: (S.IDLE, frozenset({S.IDLE, S.COMPLETED})),
    R.ABORTED: (S.IDLE, frozenset({S.IDLE, S.FAILED})),
    R.FAILED: (S.FAILED, frozenset({S.FAILED})),
}

#: Session statuses that take no more external work (docs/model.md#session-lifecycle: they can only end, or never run
#: again on their old bindings): entering one withdraws what the session waits on — its unbound
#: handoffs and pending review gates are cancelled in the same transaction
#: (``actions.lifecycle.apply_transition``) — no worker claims its jobs, and a late result,
#: lease renewal or verdict is refused.
WORK_CLOSED_STATUSES: frozenset[SessionStatus] = frozenset({S.TERMINATED, S.STALE})

#: Session statuses a manager should look at (the overview highlights them).
ATTENTION_STATUSES: frozenset[SessionStatus] = frozenset({S.FAILED, S.STALE})

#: Session statuses that wait on something outside the session (a person, a worker, a review):
#: the overview says what (``control.waits.waiting_for_sessions``) and since when.
AWAITING_STATUSES: frozenset[SessionStatus] = frozenset({S.AWAITING_USER, S.AWAITING_EXTERNAL})

#: Session statuses that can never run again: the table has no way back to ``running`` from them
#: (``completed``, ``stale``, ``terminated``). A session in one does no more work of its own: an
#: agent reviewer in one claims no review slot and binds no verdict (``can_work``).
def _reaches_running(status: SessionStatus) -> bool:
    reachable, frontier = set(), [status]
    while frontier:
        for nxt in SESSION.table[frontier.pop()]:
            if nxt not in reachable:
                reachable.add(nxt)
                frontier.append(nxt)
    return S.RUNNING in reachable


CLOSED_STATUSES: frozenset[SessionStatus] = frozenset(s for s in S if not _reaches_running(s))

#: Handoffs still waiting for their result (a worker may still claim or answer them).
HANDOFF_WAITING: tuple[HandoffState, ...] = (H.PENDING, H.CLAIMED)
#: Handoffs whose result was consumed (a consume-once receipt exists).
HANDOFF_CONSUMED: tuple[HandoffState, ...] = (H.BOUND, H.CONFLICTED)


def holds_run(status: str | StrEnum) -> bool:
    """The session holds an open run (executing, or waiting inside the session)."""
    return SESSION.state(status) in RUN_HOLDING_STATES


def passes_waits(source: str | StrEnum, target: str | StrEnum) -> bool:
    """The move takes the open run past what it waits on: an awaiting session continues
    (``→ running``), or the run ends ``completed`` (``running → idle | completed``). A run that
    still waits on something that holds it (a pending review gate: ``control.waits``) may do
    neither; failing, terminating or going stale stay open to it."""
    src, dst = SESSION.state(source), SESSION.state(target)
    if not holds_run(src):
        return False
    return dst is S.RUNNING or (not holds_run(dst) and RUN_END_ON_STATUS.get(dst) is R.COMPLETED)


def status_after_runtime_loss(status: str | StrEnum) -> SessionStatus:
    """What a session becomes when its runtime's lease ran out: ``running`` fails (reason
    ``runtime_lost``, resumable); idle and waiting sessions keep their state (they wait on a
    person or a worker, not on the runtime)."""
    current = SESSION.state(status)
    return S.FAILED if current is S.RUNNING else current  # type: ignore[return-value]


#: Where a ``running`` session goes on a manager's (or the service's) judgement rather than as its
#: runtime's own work: ended for good, or its bindings declared outdated. These stay open to a token
#: after the runtime is gone; every other move out of ``running`` is the runtime's (``runtime_move``).
MANAGER_EXITS: frozenset[SessionStatus] = frozenset({S.TERMINATED, S.STALE})


def runtime_move(source: str | StrEnum, target: str | StrEnum) -> bool:
    """A move the session's runtime makes as its own work: ``running`` → idle, a wait, completed
    or failed. Made on a runtime's behalf, it needs that runtime live (``actions.lifecycle.
    require_live_runtime``): a runtime whose lease ran out is gone, reconciled or not."""
    return SESSION.state(source) is S.RUNNING and SESSION.state(target) not in MANAGER_EXITS


def run_end_status(
    outcome: str | StrEnum, source: str | StrEnum, requested: str | StrEnum | None = None,
) -> SessionStatus:
    """Where a session in ``source`` goes when its open run ends with ``outcome``
    (``RUN_OUTCOMES``): ``requested`` if the caller named one (it checked it is one of the
    outcome's statuses), else the outcome's default — unless the table forbids the default from
    ``source`` and exactly one other status of the outcome is legal from there: an aborted run of
    a waiting session ends it ``failed`` (``awaiting_* → idle`` is not in the table). Otherwise the
    default, which the caller's lifecycle check then refuses (a waiting run cannot end
    ``completed``)."""
    default, allowed = RUN_OUTCOMES[RUN.state(outcome)]  # type: ignore[index]
    if requested is not None:
        return SESSION.state(requested)  # type: ignore[return-value]
    if SESSION.is_legal(source, default):
        return default
    legal = [s for s in SessionStatus if s in allowed and SESSION.is_legal(source, s)]
    return legal[0] if len(legal) == 1 else default


def resumable(status: str | StrEnum, *, runtime_lease_expired: bool = False) -> bool:
    """The table allows ``→ running`` — once a runtime whose lease ran out is recorded lost."""
    current = status_after_runtime_loss(status) if runtime_lease_expired else SESSION.state(status)
    return SESSION.is_legal(current, S.RUNNING)


def needs_attention(status: str | StrEnum, *, open_conflict: str | bool, runtime_problem: bool) -> bool:
    """What the overview highlights: a failed or stale session, a lost runtime (or one whose
    lease ran out), or an open conflict nobody resolved yet."""
    return SESSION.state(status) in ATTENTION_STATUSES or runtime_problem or bool(open_conflict)


def can_work(status: str | StrEnum) -> bool:
    """The session may still do work of its own: it runs, or the table lets it run again
    (not in ``CLOSED_STATUSES``). Its runtime is a separate question (the lease). A session that
    cannot is refused ``illegal_transition`` before anything is said about its runtimes (attach,
    resume: the most fundamental refusal first)."""
    return SESSION.state(status) not in CLOSED_STATUSES


def awaiting(status: str | StrEnum) -> bool:
    """The session waits on something outside itself (``AWAITING_STATUSES``)."""
    return SESSION.state(status) in AWAITING_STATUSES


def handoff_waiting(state: str | StrEnum) -> bool:
    return HANDOFF.state(state) in HANDOFF_WAITING


def handoff_consumed(state: str | StrEnum) -> bool:
    return HANDOFF.state(state) in HANDOFF_CONSUMED


def conflict_open(state: str | StrEnum) -> bool:
    """A different result arrived after one was consumed, and no manager resolved it yet."""
    return HANDOFF.state(state) is H.CONFLICTED


def intent_open(state: str | StrEnum) -> bool:
    """The intent may still be approved, refused or executed (not in a terminal state)."""
    return WRITE_INTENT.state(state) not in WRITE_INTENT.terminal


__all__ = [
    "ALL", "ATTENTION_STATUSES", "IllegalTransition", "InvalidPayload", "RUN_END_ON_STATUS", "RUN_HOLDING_STATES",
    "RuntimeRuleError", "AWAITING_STATUSES", "awaiting", "CLOSED_STATUSES", "can_work", "HANDOFF_CONSUMED",
    "HANDOFF_WAITING", "MANAGER_EXITS", "RUN_OUTCOMES", "WORK_CLOSED_STATUSES", "conflict_open", "run_end_status",
    "runtime_move",
    "handoff_consumed", "handoff_waiting", "holds_run", "passes_waits", "intent_open", "needs_attention", "resumable",
    "status_after_runtime_loss", "AssignmentState", "GateState", "HANDOFF", "HandoffState", "IntentState", "Lifecycle",
    "LifecycleTableError", "REVIEW_ASSIGNMENT", "REVIEW_GATE", "RUN", "RUNTIME", "RunState", "RuntimeState",
    "SESSION", "SessionStatus", "WRITE_INTENT", "validate_all",
]
