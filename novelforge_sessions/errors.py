"""One error hierarchy for the whole service — and its closed catalog.

Every refusal the API, the websocket or the pages report is one of these classes, rendered as
``{"error": {"code", "message", "details"}}``. A class *is* its code and HTTP status: there is
no way to override them at a raise site (``ServiceError(..., code=...)`` is a ``TypeError``);
a new refusal is a new class here, added to :data:`CATALOG`. Base classes that only group
others (:class:`ServiceError`, :class:`Conflict`, :class:`BadRequest`, :class:`IntentNotExecutable`) are marked
:func:`abstract`: they cannot be raised and are not in the catalog. ``tests/test_error_catalog.py``
checks that every concrete class anywhere in the project is in the catalog and that the error table of docs/api.md#errors
error table lists exactly the catalog. Each class also has its ``words``: the plain sentence a page
in another language than English shows for it (the API's ``message`` stays English). Pure lifecycle refusals from
:mod:`novelforge_sessions.session_runtime` are converted by :func:`from_rule_error`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.phrases import Phrase, gettext_noop, say

_ABSTRACT: set[type] = set()


def abstract(cls: type[ServiceError]) -> type[ServiceError]:
    """Mark a grouping base class: never raised itself, so not part of the catalog."""
    _ABSTRACT.add(cls)
    return cls


def is_abstract(cls: type) -> bool:
    return cls in _ABSTRACT


@abstract
class ServiceError(Exception):
    code: str = "error"
    http_status: int = 400
    #: What a page says for this refusal when its message is not a phrase of its own: one plain
    #: sentence, marked for the catalogs and translated where it is shown (docs/pages.md#language).
    #: Every catalogued class has its own (``tests/test_error_catalog.py``).
    words: str = ""

    def __init__(self, message: str, **details: Any):
        if type(self) in _ABSTRACT:
            raise TypeError(f"{type(self).__name__} is abstract: raise one of its catalogued subclasses")
        if "code" in details or "http_status" in details:
            raise TypeError("an error's code and status are its class's: add a class to errors.CATALOG")
        super().__init__(message)
        self.message = message
        self.details = details

    def as_dict(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}

    @property
    def close_code(self) -> int:
        """The websocket close code that follows this refusal's error frame: 4000 + its HTTP
        status (4400 malformed, 4401 not authenticated, 4403 refused, 4413 too large)."""
        return 4000 + self.http_status


@abstract
class BadRequest(ServiceError):
    code, http_status = "bad_request", 400


class Unauthorized(ServiceError):
    code, http_status = "unauthorized", 401
    words = gettext_noop("You are not signed in, or your sign-in has run out.")


class Forbidden(ServiceError):
    code, http_status = "forbidden", 403
    words = gettext_noop("You are not allowed to do this.")


class NotFound(ServiceError):
    code, http_status = "not_found", 404
    words = gettext_noop("It does not exist, or it is not yours to see.")


@abstract
class Conflict(ServiceError):
    """409: the request is well-formed but the current state refuses it."""

    code, http_status = "conflict", 409


class PayloadTooLarge(ServiceError):
    code, http_status = "payload_too_large", 413
    words = gettext_noop("What was sent is too large.")


class ValidationFailed(ServiceError):
    code, http_status = "validation_error", 422
    words = gettext_noop("Something in what was sent is not valid.")


class IllegalTransition(Conflict):
    code = "illegal_transition"
    words = gettext_noop("This change of state is not allowed from the session's current state.")


class VersionConflict(Conflict):
    code = "version_conflict"
    words = gettext_noop("The session changed since you loaded the page.")


class LiveRuntimeExists(Conflict):
    code = "live_runtime_exists"
    words = gettext_noop("A runtime is live for this session; close it first.")


class NoLiveRuntime(Conflict):
    code = "no_live_runtime"
    words = gettext_noop("No runtime is live for this session.")


class RuntimeNotLive(Conflict):
    code = "runtime_not_live"
    words = gettext_noop("That runtime is no longer live.")


class OpenRunExists(Conflict):
    code = "open_run_exists"
    words = gettext_noop("The session already has an open run.")


class NoOpenRun(Conflict):
    code = "no_open_run"
    words = gettext_noop("The session has no open run.")


class StaleAuthority(Conflict):
    code = "stale_authority"
    words = gettext_noop("The project's authority changed since this was prepared.")


class TranscriptFull(Conflict):
    code = "transcript_full"
    words = gettext_noop("The session's transcript is full.")


class OpenConflict(Conflict):
    """The session carries an open conflict (a conflicting result): no new work until a manager resolves it."""

    code = "open_conflict"
    words = gettext_noop("The session has an open conflict; resolve it first.")


class WaitOutstanding(Conflict):
    """The open run still waits on something that holds it (a pending review gate): it may not
    continue past it (``→ running``) nor end ``completed`` until the wait is settled
    (``details.waiting_on``)."""

    code = "wait_outstanding"
    words = gettext_noop("The session still waits on something (a review, a handoff or a question).")


class RunNotOpen(Conflict):
    code = "run_not_open"
    words = gettext_noop("That run has already ended.")


class SessionTerminated(Conflict):
    code = "session_terminated"
    words = gettext_noop("The session is terminated.")


class StaleRuntime(Conflict):
    """The write names a runtime that is not the session's live one (superseded, closed or lost)."""

    code = "stale_runtime"
    words = gettext_noop("That runtime is no longer the session's live runtime.")


class RuntimeRequired(Conflict):
    """An unnamed token write to a session that has had more than one runtime generation."""

    code = "runtime_required"
    words = gettext_noop("Say which runtime this is for: the session has had more than one.")


class CheckpointNotBounded(ServiceError):
    code, http_status = "checkpoint_not_bounded", 422
    words = gettext_noop("A checkpoint is saved only at one of the agreed boundaries.")


class SessionNotRunning(Conflict):
    """The write needs a running session (a handoff, a review gate)."""

    code = "session_not_running"
    words = gettext_noop("The session is not running.")


class UnknownArtifactVersion(ValidationFailed):
    """A reference names no version of this project's artifacts."""

    code = "unknown_artifact_version"
    words = gettext_noop("That artifact version does not exist in this project.")


class ArtifactExists(Conflict):
    code = "artifact_exists"
    words = gettext_noop("An artifact with this name already exists.")


class ResumeRefused(Conflict):
    """A resume step failed; ``details.report`` is the step report. Nothing changed."""

    code = "resume_refused"
    words = gettext_noop("Resume was refused: a check failed.")


# --- request framing (the API's edge) ------------------------------------------------------

class MalformedBody(BadRequest):
    """The request body is not JSON, or nests deeper than the API accepts."""

    code = "malformed_body"
    words = gettext_noop("What was sent could not be read.")


class MethodNotAllowed(ServiceError):
    code, http_status = "method_not_allowed", 405
    words = gettext_noop("This cannot be done this way.")


class UnsupportedMediaType(ServiceError):
    """The body is sent as something other than JSON: a ``Content-Type`` other than
    ``application/json`` (whose one parameter may be ``charset=utf-8``)."""

    code, http_status = "unsupported_media_type", 415
    words = gettext_noop("What was sent is not JSON.")


class HostNotAllowed(BadRequest):
    """The request's Host (or X-Forwarded-Host, when trusted) is not in ``ALLOWED_HOSTS``: refused
    before anything runs (``novelforge_sessions/server/hosts.py``)."""

    code = "disallowed_host"
    words = gettext_noop("The service does not answer at this address.")


class OtherHttpError(ServiceError):
    """An HTTP-level refusal of the framework that no class above names (see :func:`for_status`)."""

    code, http_status = "http_error", 400
    words = gettext_noop("The request was refused.")


class InternalError(ServiceError):
    """An unexpected exception: logged, answered in the one shape, never an HTML page."""

    code, http_status = "internal_error", 500
    words = gettext_noop("Something went wrong on the server; try again.")


#: The message of an :class:`InternalError` answered for an unexpected exception (which is logged).
LOGGED = "internal error; it has been logged"


class DatabaseUnavailable(ServiceError):
    """PostgreSQL went away under the request (a restart, a terminated backend, no connection
    within the pool's timeout): nothing the request wrote survives unless it had committed, so
    retry it with the same logical ids (idempotent routes answer the first outcome)."""

    code, http_status = "database_unavailable", 503
    words = gettext_noop("The database is unavailable for a moment; try again.")


# --- the control plane: handoffs, results, write intents ------------------------------------

class StaleLease(Conflict):
    """A write carried a fencing token that a later claim superseded."""

    code = "stale_lease"
    words = gettext_noop("A newer claim has taken over this job.")


class HandoffNotClaimable(Conflict):
    code = "handoff_not_claimable"
    words = gettext_noop("This job cannot be claimed now.")


class HandoffClosed(Conflict):
    """The handoff takes no more lease traffic (bound, conflicted or cancelled), or its session is
    terminated or stale (``details.session_status``)."""

    code = "handoff_closed"
    words = gettext_noop("This job is closed: it takes no more work.")


class LogicalIdTaken(Conflict):
    code = "logical_id_taken"
    words = gettext_noop("Another job already has this name.")


class AlreadyConsumed(Conflict):
    """A *new* handoff for a logical id whose result was consumed before (deliveries of a
    consumed result are answered 200 ``already_consumed`` instead)."""

    code = "already_consumed"
    words = gettext_noop("The result of this job was already used.")


class ConflictingResult(Conflict):
    code = "conflicting_result"
    words = gettext_noop("A different result arrived for a job whose result was already used.")


class NoOpenConflict(Conflict):
    """Resolving a conflict on a handoff that has none."""

    code = "no_open_conflict"
    words = gettext_noop("There is no open conflict to resolve.")


class InvalidResult(ServiceError):
    """The delivery was logged, but its result is not a valid result of the frozen job."""

    code, http_status = "invalid_result", 422
    words = gettext_noop("The worker's result does not fit the job.")


class ResultHashMismatch(ValidationFailed):
    """The stated ``result_hash`` is not the server's sha256 of the canonical result."""

    code = "result_hash_mismatch"
    words = gettext_noop("The result does not match its stated fingerprint.")


class StalePrecondition(Conflict):
    code = "stale_precondition"
    words = gettext_noop("The before-state changed since this write intent was made.")


class ApprovalRequired(Conflict):
    code = "approval_required"
    words = gettext_noop("This write intent needs a manager's approval first.")


@abstract
class IntentNotExecutable(Conflict):
    """The write intent cannot be executed (grouping base: see :class:`IntentClosed`)."""

    code = "intent_not_executable"
    words = gettext_noop("This write intent cannot be executed.")


class IntentClosed(IntentNotExecutable):
    """The write intent is closed (rejected, refused or executed): it takes no more decisions."""

    code = "intent_closed"
    words = gettext_noop("This write intent is already closed.")


class NotApproved(Conflict):
    """Revoking the approval of an intent that is not approved (or already executed)."""

    code = "not_approved"
    words = gettext_noop("This write intent is not approved.")


class IdempotencyKeyReused(Conflict):
    code = "idempotency_key_reused"
    words = gettext_noop("This request key was already used for a different request.")


class PostconditionFailed(ServiceError):
    code, http_status = "postcondition_failed", 500
    words = gettext_noop("The write did not give the promised result, so it was undone.")


class ReviewRouteRequired(Conflict):
    """409: the handoff is an agent-review slot (``purpose = review``). The plain handoff
    routes never claim, renew, answer or cancel it — only the review routes do
    (``/review-packets/claim``, ``…/heartbeat``, ``…/verdicts``; a gate is withdrawn with
    ``/review-gates/{id}/cancel``). Nothing is written."""

    code = "review_route_required"
    words = gettext_noop("This is a review job: only the review routes handle it.")


# --- independent review ----------------------------------------------------------------------

class IndependenceViolation(Forbidden):
    code = "independence_violation"
    words = gettext_noop("You may not review this text: it is your own work, or you opened this review.")


class StaleFingerprint(Conflict):
    code = "stale_fingerprint"
    words = gettext_noop("The text under review changed since the page was loaded.")


class AlreadyClaimed(Conflict):
    """This reviewer already holds a slot on that packet."""

    code = "already_claimed"
    words = gettext_noop("You already hold a place on this review.")


class VerdictConflict(Conflict):
    """A different verdict is already bound to this packet by the same reviewer."""

    code = "verdict_conflict"
    words = gettext_noop("A different review of this packet was already submitted.")


class GateClosed(Conflict):
    """The review gate is cancelled or complete, or its session is terminated or stale."""

    code = "gate_closed"
    words = gettext_noop("This review is closed: it was withdrawn or is finished.")


class GraphCheckpointConflict(Conflict):
    """A graph checkpoint id of this thread and namespace already names a different checkpoint."""

    code = "graph_checkpoint_conflict"
    words = gettext_noop("This graph checkpoint id already names a different checkpoint.")


class GraphBlobMissing(Conflict):
    """A graph put or write names a state blob by fingerprint that this project does not hold
    (``details.missing``): upload it (``POST /graph-blobs``) and send the request again."""

    code = "graph_blob_missing"
    words = gettext_noop("Part of the saved graph state is missing: upload it and try again.")


class GraphThreadExists(Conflict):
    """A copy of a graph thread names a target thread id the project already has: a copy opens a
    new session, never writes into another thread's history."""

    code = "graph_thread_exists"
    words = gettext_noop("A graph thread with this id exists already: copy to a new id.")


class GraphBlobMismatch(ValidationFailed):
    """An uploaded graph blob's chunks do not make the content its fingerprint names (or do not
    agree on its serializer or chunk count): nothing of it is kept."""

    code = "graph_blob_mismatch"
    words = gettext_noop("An uploaded part of the graph state does not match its fingerprint.")


# ---- the event stream's frames (``live.consumers``: an error frame, then the socket closes) ------
class MalformedFrame(BadRequest):
    """A frame that is not a JSON text object with a ``type``, or a message with wrong fields."""

    code = "malformed_frame"
    words = gettext_noop("A live-update message could not be read.")


class UnknownFrameType(BadRequest):
    code = "unknown_type"
    words = gettext_noop("A live-update message is of an unknown kind.")


class AlreadyAuthenticated(BadRequest):
    code = "already_authenticated"
    words = gettext_noop("This live connection is already signed in.")


class TooManySubscriptions(BadRequest):
    code = "too_many_subscriptions"
    words = gettext_noop("This live connection follows too many things at once.")


class WebhookUrlRefused(ValidationFailed):
    """A webhook URL the sender may not call: not http(s), credentials in it, a host that does not
    resolve, or one that resolves to a private, loopback or link-local address (docs/webhooks.md)."""

    code = "webhook_url_refused"
    words = gettext_noop("This webhook address may not be called.")


#: The closed catalog, in one explicit list: every code the service answers with.
_CATALOGUED: tuple[type[ServiceError], ...] = (
    # generic refusals
    Unauthorized, Forbidden, NotFound, PayloadTooLarge, ValidationFailed, CheckpointNotBounded,
    MalformedBody, HostNotAllowed, MethodNotAllowed, UnsupportedMediaType, OtherHttpError, InternalError, DatabaseUnavailable,
    # sessions
    IllegalTransition, VersionConflict, LiveRuntimeExists, NoLiveRuntime, RuntimeNotLive, OpenRunExists,
    NoOpenRun, RunNotOpen, StaleAuthority, TranscriptFull, OpenConflict, WaitOutstanding, SessionTerminated, StaleRuntime,
    RuntimeRequired, SessionNotRunning, UnknownArtifactVersion, ArtifactExists, ResumeRefused,
    # control plane
    StaleLease, HandoffNotClaimable, HandoffClosed, LogicalIdTaken, AlreadyConsumed, ConflictingResult,
    NoOpenConflict, InvalidResult, ResultHashMismatch, StalePrecondition, ApprovalRequired,
    IntentClosed, NotApproved, IdempotencyKeyReused, PostconditionFailed,
    ReviewRouteRequired,
    # reviews
    IndependenceViolation, StaleFingerprint, AlreadyClaimed, VerdictConflict, GateClosed,
    # graph threads
    GraphCheckpointConflict, GraphBlobMissing, GraphBlobMismatch, GraphThreadExists,
    # the event stream's frames
    MalformedFrame, UnknownFrameType, AlreadyAuthenticated, TooManySubscriptions,
    # webhooks
    WebhookUrlRefused,
)

#: code → class. Codes are unique (checked here at import, and by the tests).
CATALOG: dict[str, type[ServiceError]] = {cls.code: cls for cls in _CATALOGUED}
assert len(CATALOG) == len(_CATALOGUED), "two catalogued classes share a code"
assert not any(is_abstract(cls) for cls in _CATALOGUED), "an abstract class is catalogued"

def words_for(code: str | None) -> str | None:
    """The page words of a catalogued code (untranslated: the page translates them), else None."""
    cls = CATALOG.get(code or "")
    return cls.words if cls is not None else None


def page_message(code: str | None, message: str, gettext: Callable[[str], str], *, english: bool) -> str:
    """A refusal as a page says it (docs/pages.md#language): in English the message itself (the API's);
    in another language the message said again when it is a phrase (``phrases.Phrase``), else the
    code's words (``words_for``), translated with the page's ``gettext``."""
    if english:
        return message
    if isinstance(message, Phrase):
        return say(message, gettext)
    words = words_for(code)
    return gettext(words) if words else message


#: The generic class for a bare HTTP status (ninja's ``HttpError`` carries only a status).
_BY_STATUS: dict[int, type[ServiceError]] = {
    400: MalformedBody, 401: Unauthorized, 403: Forbidden, 404: NotFound, 405: MethodNotAllowed,
    413: PayloadTooLarge, 415: UnsupportedMediaType, 422: ValidationFailed, 500: InternalError,
}


def for_status(status: int) -> type[ServiceError]:
    """The catalogued class answering a bare HTTP status: a 5xx is an internal error, any other
    status without a generic class here is ``http_error`` (400)."""
    if status >= 500:
        return InternalError
    return _BY_STATUS.get(status, OtherHttpError)


_RULE_MAP: dict[type[rt.RuntimeRuleError], type[ServiceError]] = {
    rt.IllegalTransition: IllegalTransition,
    rt.CheckpointNotBounded: CheckpointNotBounded,
    rt.InvalidPayload: ValidationFailed,
}


def from_rule_error(exc: rt.RuntimeRuleError) -> ServiceError:
    cls = _RULE_MAP.get(type(exc), ValidationFailed)
    return cls(exc.message, **exc.details)


#: Codes and statuses the API declares in its OpenAPI schema (ninja `response={...}`).
ERROR_STATUSES = (400, 401, 403, 404, 409, 413, 422)
