"""Typed exceptions of the NovelForge client: one class per error code of the service.

The service answers every refusal as ``{"error": {"code", "message", "details"}}`` with a code
from its closed catalog; :func:`error_for` turns that into the class below registered for the
code (``tests/client/test_errors.py`` checks every catalog code has one, with the same HTTP
status). A code this client does not know (a newer server) becomes the class for its status, or
:class:`NovelForgeError` itself. Transport failures that outlived the retries are
:class:`TransportError` (``maybe_committed`` says whether the server may have acted). A runtime
lease the client held and found no longer live is :class:`LeaseLost`; a graph run a manager asked
to stop is :class:`RunAborted`.
"""
from __future__ import annotations

from typing import Any


class NovelForgeError(Exception):
    """Base of everything this client raises for the service's answers."""

    code: str = "error"
    status: int = 0

    def __init__(self, message: str = "", *, code: str | None = None, status: int | None = None,
                 details: dict[str, Any] | None = None) -> None:
        self.code = code or type(self).code
        self.status = status if status is not None else type(self).status
        self.message = message
        self.details: dict[str, Any] = details or {}
        super().__init__(f"{self.status} {self.code}: {message}" if self.status else f"{self.code}: {message}")


class TransportError(NovelForgeError):
    """The request failed on the network (after the retries that were safe).

    ``maybe_committed`` is true when the request may have reached the server: a write without a
    logical id or idempotency key is then not retried, because repeating it could act twice.
    """

    code = "transport_error"

    def __init__(self, message: str, *, maybe_committed: bool) -> None:
        super().__init__(message)
        self.maybe_committed = maybe_committed


class LeaseLost(NovelForgeError):
    """The runtime this client held for a session is no longer live: a heartbeat was refused
    (``runtime_not_live``: the lease ran out and the reconciler marked it lost, or the session was
    closed or failed; ``stale_runtime``: a newer generation took over; ``not_found``: the session
    was forgotten). Raised by the client itself, not a code of the service's catalog:
    ``details`` names ``thread_id``, ``runtime_id`` and the refusal's ``cause`` code, and the
    refusal is the exception's ``__cause__``. The work can no longer write as that runtime:
    resume the session (generation N+1) to continue."""

    code = "lease_lost"

    def __init__(self, message: str, *, thread_id: str, runtime_id: int, cause: NovelForgeError) -> None:
        super().__init__(message, details={"thread_id": thread_id, "runtime_id": runtime_id, "cause": cause.code})
        self.thread_id, self.runtime_id, self.cause = thread_id, runtime_id, cause


class RunAborted(NovelForgeError):
    """A manager asked the graph thread's run to stop (``POST /sessions/{id}/abort``, the dashboard's
    abort): the saver learned it from a heartbeat, ended the run with outcome ``aborted`` and
    raises this from the thread's next put or write instead of sending it. Raised by the client
    itself, not a code of the service's catalog: ``details`` names ``thread_id`` and ``run_id``.
    The runtime stays live; to go on, release the thread and resume it (generation N+1, a new run)."""

    code = "run_aborted"

    def __init__(self, message: str, *, thread_id: str, run_id: int) -> None:
        super().__init__(message, details={"thread_id": thread_id, "run_id": run_id})
        self.thread_id, self.run_id = thread_id, run_id


class BadRequest(NovelForgeError):
    code, status = "bad_request", 400


class Conflict(NovelForgeError):
    """Every 409: the request is valid but the current state refuses it (nothing was written)."""

    code, status = "conflict", 409


class IntentNotExecutable(Conflict):
    code = "intent_not_executable"


class Unauthorized(NovelForgeError):
    code, status = "unauthorized", 401


class Forbidden(NovelForgeError):
    code, status = "forbidden", 403


class NotFound(NovelForgeError):
    code, status = "not_found", 404


class PayloadTooLarge(NovelForgeError):
    code, status = "payload_too_large", 413


class ValidationFailed(NovelForgeError):
    code, status = "validation_error", 422


class CheckpointNotBounded(NovelForgeError):
    code, status = "checkpoint_not_bounded", 422


class MethodNotAllowed(NovelForgeError):
    code, status = "method_not_allowed", 405


class UnsupportedMediaType(NovelForgeError):
    """The body was sent with a Content-Type other than application/json (this client always sends JSON)."""

    code, status = "unsupported_media_type", 415


class OtherHttpError(NovelForgeError):
    """An HTTP-level refusal of the framework that no class above names."""

    code, status = "http_error", 400


class InternalError(NovelForgeError):
    """An unexpected exception: logged, answered in the one shape, never an HTML page."""

    code, status = "internal_error", 500


class DatabaseUnavailable(NovelForgeError):
    """PostgreSQL went away under the request; nothing it wrote survives unless it had committed.
    Keyed and idempotent calls are retried by the client (a 503); others are yours to read back."""

    code, status = "database_unavailable", 503


class InvalidResult(NovelForgeError):
    """The delivery was logged, but its result is not a valid result of the frozen job."""

    code, status = "invalid_result", 422


class PostconditionFailed(NovelForgeError):
    code, status = "postcondition_failed", 500


class MalformedBody(BadRequest):
    """The request body is not JSON, or nests deeper than the API accepts."""

    code = "malformed_body"


class HostNotAllowed(BadRequest):
    """The base URL's host is not one the server answers to (its ``ALLOWED_HOSTS``)."""

    code = "disallowed_host"


class IllegalTransition(Conflict):
    code = "illegal_transition"


class VersionConflict(Conflict):
    code = "version_conflict"


class LiveRuntimeExists(Conflict):
    code = "live_runtime_exists"


class NoLiveRuntime(Conflict):
    code = "no_live_runtime"


class RuntimeNotLive(Conflict):
    code = "runtime_not_live"


class OpenRunExists(Conflict):
    code = "open_run_exists"


class NoOpenRun(Conflict):
    code = "no_open_run"


class RunNotOpen(Conflict):
    code = "run_not_open"


class StaleAuthority(Conflict):
    code = "stale_authority"


class TranscriptFull(Conflict):
    code = "transcript_full"


class OpenConflict(Conflict):
    """The session carries an open conflict (a conflicting result): no new work until a manager resolves it."""

    code = "open_conflict"


class WaitOutstanding(Conflict):
    """The open run still waits on a pending review gate (``details.waiting_on``): it may not
    continue past it nor end ``completed`` until the verdicts are bound or the gate is cancelled."""

    code = "wait_outstanding"


class SessionTerminated(Conflict):
    code = "session_terminated"


class StaleRuntime(Conflict):
    """The write names a runtime that is not the session's live one (superseded, closed or lost)."""

    code = "stale_runtime"


class RuntimeRequired(Conflict):
    """An unnamed token write to a session that has had more than one runtime generation."""

    code = "runtime_required"


class SessionNotRunning(Conflict):
    """The write needs a running session (a handoff, a review gate)."""

    code = "session_not_running"


class UnknownArtifactVersion(ValidationFailed):
    """A reference names no version of this project's artifacts."""

    code = "unknown_artifact_version"


class ArtifactExists(Conflict):
    code = "artifact_exists"


class ResumeRefused(Conflict):
    """A resume step failed; ``details.report`` is the step report. Nothing changed."""

    code = "resume_refused"


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
    """A *new* handoff for a logical id whose result was consumed before (deliveries of a consumed result are answered 200 ``already_consumed`` instead)."""

    code = "already_consumed"


class ConflictingResult(Conflict):
    code = "conflicting_result"


class NoOpenConflict(Conflict):
    """Resolving a conflict on a handoff that has none."""

    code = "no_open_conflict"


class ResultHashMismatch(ValidationFailed):
    """The stated ``result_hash`` is not the server's sha256 of the canonical result."""

    code = "result_hash_mismatch"


class StalePrecondition(Conflict):
    code = "stale_precondition"


class ApprovalRequired(Conflict):
    code = "approval_required"


class IntentClosed(IntentNotExecutable):
    """The write intent is closed (rejected, refused or executed): it takes no more decisions."""

    code = "intent_closed"


class NotApproved(Conflict):
    """Revoking the approval of an intent that is not approved (or already executed)."""

    code = "not_approved"


class IdempotencyKeyReused(Conflict):
    code = "idempotency_key_reused"


class ReviewRouteRequired(Conflict):
    """409: the handoff is an agent-review slot (``purpose = review``). The plain handoff routes never claim, renew, answer or cancel it — only the review routes do (``/review-packets/claim``, ``…/heartbeat``, ``…/verdicts``; a gate is withdrawn with ``/review-gates/{id}/cancel``). Nothing is written."""

    code = "review_route_required"


class IndependenceViolation(Forbidden):
    code = "independence_violation"


class StaleFingerprint(Conflict):
    code = "stale_fingerprint"


class AlreadyClaimed(Conflict):
    """This reviewer already holds a slot on that packet."""

    code = "already_claimed"


class VerdictConflict(Conflict):
    """A different verdict is already bound to this packet by the same reviewer."""

    code = "verdict_conflict"


class GateClosed(Conflict):
    """The review gate is cancelled or complete."""

    code = "gate_closed"


class GraphCheckpointConflict(Conflict):
    """A graph checkpoint id of this thread and namespace already names a different checkpoint."""

    code = "graph_checkpoint_conflict"


class GraphBlobMissing(Conflict):
    """A put or write named a state blob by fingerprint that the server does not hold (``details["missing"]``)."""

    code = "graph_blob_missing"


class GraphBlobMismatch(ValidationFailed):
    """An uploaded state blob's chunks do not make the content its fingerprint names; nothing of it was kept."""

    code = "graph_blob_mismatch"


class GraphThreadExists(Conflict):
    """A copy named a target thread id the project already has (a copy opens a new session)."""

    code = "graph_thread_exists"


class WebhookUrlRefused(ValidationFailed):
    """A webhook URL the sender may not call: not http(s), credentials in it, a host that does not
    resolve, or one that resolves to a private, loopback or link-local address."""

    code = "webhook_url_refused"


# The event stream's refusals: an error frame, then the socket closes with 4000 + the status.
class MalformedFrame(BadRequest):
    """A websocket frame that is not a JSON text object with a ``type``, or a message with wrong fields."""

    code = "malformed_frame"


class UnknownFrameType(BadRequest):
    code = "unknown_type"


class AlreadyAuthenticated(BadRequest):
    code = "already_authenticated"


class TooManySubscriptions(BadRequest):
    code = "too_many_subscriptions"


#: code → class, for every code of the service's catalog (and the two grouping classes); the
#: client's own (``TransportError``, ``LeaseLost``, ``RunAborted``) are no answer of the service.
CODES: dict[str, type[NovelForgeError]] = {
    cls.code: cls
    for cls in list(globals().values())
    if isinstance(cls, type) and issubclass(cls, NovelForgeError)
    and cls not in (NovelForgeError, TransportError, LeaseLost, RunAborted)
}

_BY_STATUS: dict[int, type[NovelForgeError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 405: MethodNotAllowed,
    409: Conflict, 413: PayloadTooLarge, 415: UnsupportedMediaType, 422: ValidationFailed, 500: InternalError,
}


def error_for(status: int, body: Any) -> NovelForgeError:
    """The typed exception for an error response (``body`` is its parsed JSON, or anything)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("code"), str):
        cls = _BY_STATUS.get(status, InternalError if status >= 500 else OtherHttpError)
        return cls(f"HTTP {status} without an error body", status=status)
    code = err["code"]
    cls = CODES.get(code) or _BY_STATUS.get(status) or NovelForgeError
    details = err.get("details") if isinstance(err.get("details"), dict) else {}
    return cls(str(err.get("message", "")), code=code, status=status, details=details)
