"""One error hierarchy for the whole service: a code, an HTTP status, a message, details.

Every refusal the API, the websocket or the pages report is one of these, rendered as
``{"error": {"code", "message", "details"}}``. Pure lifecycle refusals from
:mod:`novelforge_sessions.session_runtime` are converted by :func:`from_rule_error`.
"""
from __future__ import annotations

from typing import Any

from novelforge_sessions import session_runtime as rt


class ServiceError(Exception):
    code: str = "error"
    http_status: int = 400

    def __init__(self, message: str, *, code: str | None = None, http_status: int | None = None, **details: Any):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        if http_status:
            self.http_status = http_status
        self.details = details

    def as_dict(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class BadRequest(ServiceError):
    code, http_status = "bad_request", 400


class Unauthorized(ServiceError):
    code, http_status = "unauthorized", 401


class Forbidden(ServiceError):
    code, http_status = "forbidden", 403


class NotFound(ServiceError):
    code, http_status = "not_found", 404


class Conflict(ServiceError):
    """409: the request is well-formed but the current state refuses it."""

    code, http_status = "conflict", 409


class PayloadTooLarge(ServiceError):
    code, http_status = "payload_too_large", 413


class ValidationFailed(ServiceError):
    code, http_status = "validation_error", 422


class NonFiniteNumber(ValidationFailed):
    """A JSON body held ``NaN``, ``Infinity``, ``-Infinity`` or a number too large for a double
    (``1e999``): Python's json reads them, PostgreSQL cannot store them (422 ``validation_error``)."""


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


class StaleAuthority(Conflict):
    code = "stale_authority"


class TranscriptFull(Conflict):
    code = "transcript_full"


class OpenConflict(Conflict):
    """The session carries an open conflict (a conflicting result): no new work until a manager resolves it."""

    code = "open_conflict"


class RunNotOpen(Conflict):
    code = "run_not_open"


class SessionTerminated(Conflict):
    code = "session_terminated"


class StaleRuntime(Conflict):
    """The write names a runtime that is not the session's live one (superseded, closed or lost)."""

    code = "stale_runtime"


class RuntimeRequired(Conflict):
    """An unnamed token write to a session that has had more than one runtime generation."""

    code = "runtime_required"


class CheckpointNotBounded(ServiceError):
    code, http_status = "checkpoint_not_bounded", 422


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
