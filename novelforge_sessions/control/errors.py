"""Typed refusals of the control plane, in the service's one error hierarchy (``errors.py``)."""
from __future__ import annotations

from novelforge_sessions.errors import Conflict, ServiceError


class StaleLease(Conflict):
    """A write carried a fencing token that a later claim superseded."""

    code = "stale_lease"


class HandoffNotClaimable(Conflict):
    code = "handoff_not_claimable"


class HandoffClosed(Conflict):
    """The handoff takes no more lease traffic (bound, conflicted or cancelled)."""

    code = "handoff_closed"


class LogicalIdTaken(Conflict):
    code = "logical_id_taken"


class AlreadyConsumed(Conflict):
    """A *new* handoff for a logical id whose result was consumed before (deliveries of a
    consumed result are answered 200 ``already_consumed`` instead)."""

    code = "already_consumed"


class ConflictingResult(Conflict):
    code = "conflicting_result"


class InvalidResult(ServiceError):
    """The delivery was logged, but its result is not a valid result of the frozen job."""

    code, http_status = "invalid_result", 422


class StalePrecondition(Conflict):
    code = "stale_precondition"


class ApprovalRequired(Conflict):
    code = "approval_required"


class IntentNotExecutable(Conflict):
    code = "intent_not_executable"


class IdempotencyKeyReused(Conflict):
    code = "idempotency_key_reused"


class PostconditionFailed(ServiceError):
    code, http_status = "postcondition_failed", 500


class ReviewRouteRequired(Conflict):
    """409: the handoff is an agent-review slot (``purpose = review``). The plain handoff
    routes never claim, renew, answer or cancel it — only the review routes do
    (``/review-packets/claim``, ``…/heartbeat``, ``…/verdicts``; a gate is withdrawn with
    ``/review-gates/{id}/cancel``). Nothing is written."""

    code = "review_route_required"
