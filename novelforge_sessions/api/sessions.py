"""Sessions: create, read, transition, close, abort, resume, forget, transcript."""
from __future__ import annotations

from django.http import HttpRequest
from ninja import Query, Router, Status, Schema

from novelforge_sessions import tracing
from novelforge_sessions.control import resume as resume_actions
from novelforge_sessions.actions import sessions as actions
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.transcript import append_transcript
from novelforge_sessions.apikit.common import RUNTIME_GONE, caller, errors, get_or_404, keyset
from novelforge_sessions.api.schemas import (
    AbortIn,
    AbortOut,
    CloseIn,
    CloseOut,
    ResumeIn,
    Role,
    ResumeReportOut,
    RuntimeIn,
    SessionCreatedOut,
    SessionIn,
    SessionOut,
    StatusName,
    TranscriptIn,
    TranscriptOut,
    TRANSCRIPT_AFTER_DOC,
    TransitionIn,
)
from novelforge_sessions.apikit.schemas import Page, page_after, page_after_field, page_limit, page_limit_field
from novelforge_sessions.models import TranscriptEntry

router = Router(tags=["sessions"])


def runtime_spec(body: RuntimeIn) -> RuntimeSpec:
    return RuntimeSpec(
        runtime_family=body.runtime_family,
        capabilities=body.capabilities,
        provider_metadata=body.provider_metadata,
        lease_seconds=body.lease_seconds,
    )


class SessionFilters(Schema):
    status: StatusName | None = None
    role: Role | None = None
    runtime_family: str | None = None
    task_mode: str | None = None
    after: int | None = page_after_field()
    limit: int = page_limit_field()


@router.post(
    "/sessions", response={201: SessionCreatedOut, **errors(403, 413)}, summary="Create a session",
    description="Needs the `write` permission and a token that is not bound to a session: a bound token is its "
    "session's identity and creates no other (403 `forbidden`, nothing written).",
)
def create_session(request: HttpRequest, body: SessionIn):
    spec = actions.NewSession(
        role=body.role, role_extension=body.role_extension, memory_policy=body.memory_policy,
        task_mode=body.task_mode, runtime_family=body.runtime_family, provider_metadata=body.provider_metadata,
    )
    runtime = runtime_spec(body.runtime) if body.runtime else None
    return Status(201, actions.create_session(caller(request), spec, runtime=runtime))


@router.get("/sessions", response={200: Page[SessionOut], **errors(403)}, summary="List sessions (keyset pages)")
def list_sessions(request: HttpRequest, filters: Query[SessionFilters]):
    who = caller(request)
    who.require("read")
    qs = who.sessions()
    for name in ("status", "role", "runtime_family", "task_mode"):
        value = getattr(filters, name)
        if value:
            qs = qs.filter(**{name: value})
    return keyset(qs, after=filters.after, limit=filters.limit)


@router.get("/sessions/{session_id}", response={200: SessionOut, **errors(403, 404)}, summary="Get a session")
def get_session(request: HttpRequest, session_id: int):
    who = caller(request)
    who.require("read")
    return get_or_404(who.sessions(), "session", id=session_id)


@router.post(
    "/sessions/{session_id}/transition", response={200: SessionOut, **errors(403, 404, 409)},
    summary="Move a session along the lifecycle table",
    description="409 `illegal_transition` off the table; 409 `wait_outstanding` (`details.waiting_on`) when the "
    "move would take the open run past a pending review gate (→ `running`, or ending the run completed): the "
    "verdicts, or cancelling the gate, continue it. A move out of `running` to `idle`, a wait, `completed` or "
    "`failed` is the runtime's own work: " + RUNTIME_GONE + " `terminated` and `stale` need no runtime; entering "
    "either cancels the session's unbound handoffs and pending review gates in the same transaction.",
)
def transition(request: HttpRequest, session_id: int, body: TransitionIn):
    return actions.transition_session(
        caller(request), session_id, body.to, reason=body.reason, expected_version=body.expected_version,
        runtime_id=body.runtime_id,
    )


@router.post(
    "/sessions/{session_id}/close", response={200: CloseOut, **errors(403, 404, 409)},
    summary="Close: end the live runtime, keep everything (idempotent)",
)
def close(request: HttpRequest, session_id: int, body: CloseIn | None = None):
    result = actions.close_session(
        caller(request), session_id, reason=(body.reason if body and body.reason else "closed"),
        runtime_id=body.runtime_id if body else None,
    )
    return {"session": result.session, "already_closed": result.already_closed, "closed_runtime_id": result.closed_runtime_id}


@router.post(
    "/sessions/{session_id}/abort", response={200: AbortOut, **errors(403, 404, 409)},
    summary="Abort: ask the current run to stop (cooperative; not close)",
)
def abort(request: HttpRequest, session_id: int, body: AbortIn | None = None):
    result = actions.abort_session(
        caller(request), session_id, reason=(body.reason if body and body.reason else "abort requested"),
        runtime_id=body.runtime_id if body else None,
    )
    return {"session": result.session, "run_id": result.run_id, "already_requested": result.already_requested}


@router.post(
    "/sessions/{session_id}/resume", response={200: ResumeReportOut, **errors(403, 404, 409)},
    summary="Resume: revalidate, then runtime generation N+1 and a new run at the saved cursor",
    description="Any failed step → 409 `resume_refused` with the report in `details.report`; nothing changes. "
    "`dry_run` returns the report without acting. A session that can never run again (`completed`, `stale`, "
    "`terminated`) is 409 `illegal_transition` first, whatever its runtimes; then 409 `live_runtime_exists` while a "
    "runtime is live (an expired one is recorded lost instead, and a `running` session with no live runtime becomes "
    "`failed / runtime_lost` before the steps run).",
)
def resume(request: HttpRequest, session_id: int, body: ResumeIn):
    with tracing.span("resume", session_id=session_id, dry_run=body.dry_run) as span:
        outcome = resume_actions.resume_session(
            caller(request), session_id, runtime=runtime_spec(body.runtime), checkpoint_id=body.checkpoint_id,
            dry_run=body.dry_run,
        )
        span.set(outcome=("checked" if body.dry_run else "resumed") if outcome.ok else "steps_failed",
                 checkpoint_id=outcome.checkpoint_id, run_id=outcome.run_id,
                 runtime_id=outcome.runtime.id if outcome.runtime else None,
                 failed_steps=sum(1 for s in outcome.steps if not s.ok))
    return outcome.report()


@router.delete(
    "/sessions/{session_id}", response={204: None, **errors(403, 404, 409)},
    summary="Forget: delete the session record (refused while a runtime is live)",
)
def forget(request: HttpRequest, session_id: int):
    actions.forget_session(caller(request), session_id)
    return Status(204, None)


@router.post(
    "/sessions/{session_id}/transcript", response={201: TranscriptOut, **errors(403, 404, 409)},
    summary="Append a transcript entry (bounded; never memory, never authority)",
)
def add_transcript(request: HttpRequest, session_id: int, body: TranscriptIn):
    return Status(201, append_transcript(
        caller(request), session_id, role=body.role, content=body.content, runtime_id=body.runtime_id
    ))


@router.get(
    "/sessions/{session_id}/transcript", response={200: Page[TranscriptOut], **errors(403, 404)},
    summary="Read a session's transcript (pages by seq)",
)
def list_transcript(request: HttpRequest, session_id: int, after: int | None = page_after(TRANSCRIPT_AFTER_DOC), limit: int = page_limit(100)):
    who = caller(request)
    who.require("read")
    session = get_or_404(who.sessions(), "session", id=session_id)
    qs = TranscriptEntry.objects.filter(session=session, seq__gt=after or 0).order_by("seq")
    items = list(qs[: limit + 1])
    more = len(items) > limit
    items = items[:limit]
    return {"items": items, "next_after": items[-1].seq if more and items else None}
