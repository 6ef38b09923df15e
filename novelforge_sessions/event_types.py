"""The event catalog: every event type the service appends, with its declared payload fields.

Pure (no Django, no I/O). Each constant is the one constructor of its event type: calling it
with keyword arguments checks them against the declared fields and returns the payload, so an
event with a missing or unknown field is a programming error caught by the first test that
reaches it — never a silently different shape on the websocket. ``events.append`` and
``Outbox.add`` accept only these constants, and readers (pages, the live feed, history lists)
select events by these constants or by :attr:`EventType.family`, never by matching strings.

Events carry ids, fingerprints and states — never packet content, calibration material,
verdict decisions or transcript text (anything in the log can reach a websocket subscriber).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EventType:
    name: str
    required: frozenset[str]
    optional: frozenset[str] = field(default_factory=frozenset)

    @property
    def family(self) -> str:
        """What the event is about: ``session``, ``run``, ``runtime``, ``handoff``, …"""
        return self.name.split(".", 1)[0]

    @property
    def fields(self) -> frozenset[str]:
        return self.required | self.optional

    def __call__(self, **payload: Any) -> dict[str, Any]:
        return self.filled_by_statement(frozenset(), **payload)

    def filled_by_statement(self, filled: frozenset[str], **payload: Any) -> dict[str, Any]:
        """The payload without ``filled``: fields the writing statement itself supplies (ids it
        draws, numbers it counts), checked as ``__call__`` checks a whole one. ``filled`` must
        be declared fields the payload does not carry."""
        if not filled <= self.fields or filled & payload.keys():
            raise TypeError(f"event {self.name}: {sorted(filled)} cannot be filled by the statement")
        missing = self.required - payload.keys() - filled
        unknown = payload.keys() - self.fields
        if missing or unknown:
            raise TypeError(
                f"event {self.name}: missing {sorted(missing)}, unknown {sorted(unknown)} (declared: {sorted(self.fields)})"
            )
        return payload

    def __str__(self) -> str:
        return self.name


CATALOG: dict[str, EventType] = {}


def _declare(name: str, required: str, optional: str = "") -> EventType:
    event = EventType(name, frozenset(required.split()), frozenset(optional.split()))
    assert name not in CATALOG, name
    CATALOG[name] = event
    return event


# ---- sessions -------------------------------------------------------------------------------------
SESSION_CREATED = _declare("session.created", "role memory_policy task_mode runtime_family status")
SESSION_TRANSITIONED = _declare("session.transitioned", "from to reason version")
SESSION_RESUMED = _declare("session.resumed", "generation checkpoint_id reason pending_external carried_over")
SESSION_FORGOTTEN = _declare("session.forgotten", "status runs")
SESSION_BINDING_INVALIDATED = _declare("session.binding_invalidated", "checkpoint_id bound changed status")
TRANSCRIPT_APPENDED = _declare("transcript.appended", "seq role")

# ---- runtimes -------------------------------------------------------------------------------------
RUNTIME_ATTACHED = _declare("runtime.attached", "runtime_id generation runtime_family capabilities")
RUNTIME_CLOSED = _declare("runtime.closed", "runtime_id generation reason")
RUNTIME_LOST = _declare("runtime.lost", "runtime_id generation reason")

# ---- runs and checkpoints ---------------------------------------------------------------------------
RUN_STARTED = _declare("run.started", "seq generation task_mode cursor resumed_from_checkpoint")
RUN_CURSOR_ADVANCED = _declare("run.cursor_advanced", "seq cursor")
RUN_ENDED = _declare("run.ended", "seq state reason")
RUN_ABORT_REQUESTED = _declare("run.abort_requested", "seq reason")
CHECKPOINT_RECORDED = _declare("checkpoint.recorded", "checkpoint_id seq boundary cursor")

# ---- graph threads (the LangGraph checkpointer, control/graphs.py) ---------------------------------------
#: A thread's session opened as a copy of another thread's history (``copy_thread``): on the new session.
GRAPH_THREAD_COPIED = _declare("graph.thread_copied", "thread_id source_thread_id source_session_id checkpoints writes")
#: Graph checkpoints removed from a thread (``prune``: ``strategy``; ``delete_for_runs``: ``run_ids``), with what
#: went: checkpoints, pending writes, channel versions no kept checkpoint names.
GRAPH_PRUNED = _declare("graph.pruned", "thread_id strategy checkpoints writes channel_versions")
GRAPH_RUNS_DELETED = _declare("graph.runs_deleted", "thread_id run_ids checkpoints writes channel_versions")

# ---- artifacts ------------------------------------------------------------------------------------
ARTIFACT_CREATED = _declare("artifact.created", "artifact_id name version fingerprint")
ARTIFACT_VERSION_ADDED = _declare("artifact.version_added", "artifact_id version fingerprint")

# ---- handoffs and results (docs/model.md#results-and-idempotent-delivery) -----------------------------
HANDOFF_CREATED = _declare(
    "handoff.created", "handoff_id logical_id job_fingerprint required_capabilities timeout_seconds inputs purpose"
)
HANDOFF_CLAIMED = _declare(
    "handoff.claimed",
    "handoff_id logical_id attempt fencing_token worker lease_expires_at reclaimed_after_expiry previous_holder",
)
HANDOFF_CANCELLED = _declare("handoff.cancelled", "handoff_id logical_id reason")
HANDOFF_RESULT_CONSUMED = _declare(
    "handoff.result_consumed", "handoff_id logical_id delivery_id receipt_id result_hash attempt"
)
HANDOFF_RESULT_INVALID = _declare("handoff.result_invalid", "handoff_id logical_id delivery_id result_hash errors")
HANDOFF_RESULT_CONFLICT = _declare(
    "handoff.result_conflict",
    "handoff_id logical_id consumed_hash conflicting_hash receipt_id delivery_id session_status open_conflict",
)
#: A handoff has waited for its result longer than ``HANDOFF_LONG_WAIT_SECONDS`` (written once per
#: handoff by the webhook sender's pass: control/long_waits.py).
HANDOFF_WAITING_LONG = _declare("handoff.waiting_long", "handoff_id logical_id state waited_seconds threshold_seconds")
HANDOFF_CONFLICT_RESOLVED = _declare("handoff.conflict_resolved", "handoff_id logical_id resolution open_conflict")

# ---- write intents and authority (docs/model.md#write-intents-and-authority) ----------------------------
WRITE_INTENT_CREATED = _declare(
    "write_intent.created", "intent_id kind artifact_id params before_fingerprint idempotency_key requires_approval"
)
WRITE_INTENT_APPROVED = _declare("write_intent.approved", "intent_id approval_id authority_version reapproval")
WRITE_INTENT_REJECTED = _declare("write_intent.rejected", "intent_id approval_id note")
WRITE_INTENT_APPROVAL_REVOKED = _declare("write_intent.approval_revoked", "intent_id revoked note")
WRITE_INTENT_EXECUTED = _declare("write_intent.executed", "intent_id kind before after postcondition")
WRITE_INTENT_REFUSED = _declare(
    "write_intent.refused", "intent_id code stated current current_state", "settled_artifacts_not_current"
)
ARTIFACT_CURRENT_CHANGED = _declare("artifact.current_changed", "intent_id before after params")
AUTHORITY_SETTLED = _declare("authority.settled", "intent_id before after params")
FRAMEWORK_CHANGED = _declare("framework.changed", "intent_id before after params")

# ---- review (docs/model.md#reviews-and-independence) ---------------------------------------------------
REVIEW_GATE_OPENED = _declare(
    "review.gate_opened",
    "gate_id packet_id route required_verdicts candidate_version_id candidate_fingerprint packet_fingerprint state",
)
REVIEW_PACKET_CLAIMED = _declare(
    "review.packet_claimed", "gate_id packet_id assignment_id reviewer_session_id state handoff_id attempt"
)
REVIEW_VERDICT_BOUND = _declare(
    "review.verdict_bound",
    "gate_id packet_id verdict_id assignment_id packet_fingerprint artifact_fingerprint verdict_fingerprint "
    "bound_verdicts required_verdicts",
)
REVIEW_GATE_COMPLETED = _declare("review.gate_completed", "gate_id state")
REVIEW_GATE_CANCELLED = _declare("review.gate_cancelled", "gate_id state")

#: The project's authority history: what changed Canon or the framework (the project page).
AUTHORITY_HISTORY: tuple[EventType, ...] = (AUTHORITY_SETTLED, FRAMEWORK_CHANGED)


def family_of(type_name: str) -> str:
    """The family of a stored event's type (``session``, ``handoff``, …); unknown names → ``other``."""
    event = CATALOG.get(type_name)
    return event.family if event is not None else "other"
