"""Runtime attachments: attach, list, heartbeat, detach."""
from __future__ import annotations

from django.http import HttpRequest
from ninja import Router, Status

from novelforge_sessions import tracing
from novelforge_sessions.actions import runtimes as actions
from novelforge_sessions.actions import sessions as session_actions
from novelforge_sessions.apikit.common import caller, errors, get_or_404, keyset
from novelforge_sessions.api.schemas import AttachIn, HeartbeatIn, HeartbeatOut, RuntimeOut
from novelforge_sessions.apikit.schemas import Page, page_after, page_limit
from novelforge_sessions.api.sessions import runtime_spec
from novelforge_sessions.models import RuntimeAttachment

router = Router(tags=["runtimes"])


@router.post(
    "/sessions/{session_id}/runtimes", response={201: RuntimeOut, **errors(403, 404, 409)},
    summary="Attach a runtime (generation N+1); 409 illegal_transition if the session cannot run again, "
    "409 live_runtime_exists while one is live by its lease, 409 open_run_exists if the session holds an "
    "open run (a waiting session whose runtime is gone: resume it instead)",
    description="With an `idempotency_key` (scoped to the session) the same key and body answer 201 with the "
    "runtime the first request attached, writing nothing; the same key with another body is 409 "
    "`idempotency_key_reused`.",
)
def attach(request: HttpRequest, session_id: int, body: AttachIn):
    return Status(201, actions.attach_runtime(caller(request), session_id, runtime_spec(body),
                                              idempotency_key=body.idempotency_key))


@router.get("/sessions/{session_id}/runtimes", response={200: Page[RuntimeOut], **errors(403, 404)}, summary="List a session's runtimes")
def list_runtimes(request: HttpRequest, session_id: int, after: int | None = page_after(), limit: int = page_limit()):
    who = caller(request)
    who.require("read")
    session = get_or_404(who.sessions(), "session", id=session_id)
    return keyset(RuntimeAttachment.objects.filter(session=session), after=after, limit=limit)


@router.get("/runtimes/{runtime_id}", response={200: RuntimeOut, **errors(403, 404)}, summary="Get a runtime")
def get_runtime(request: HttpRequest, runtime_id: int):
    who = caller(request)
    who.require("read")
    qs = who.scope("runtime", RuntimeAttachment.objects.filter(session__project_id__in=who.project_ids))
    return get_or_404(qs, "runtime", id=runtime_id)


@router.post(
    "/runtimes/{runtime_id}/heartbeat", response={200: HeartbeatOut, **errors(403, 404, 409)},
    summary="Extend the lease; tells the runtime if its run was asked to abort",
)
def heartbeat(request: HttpRequest, runtime_id: int, body: HeartbeatIn | None = None):
    with tracing.span("heartbeat", runtime_id=runtime_id) as span:
        beat = actions.heartbeat_runtime(caller(request), runtime_id, lease_seconds=body.lease_seconds if body else None)
        span.set(session_id=beat.session_id, run_id=beat.open_run_id, outcome="abort_requested" if beat.abort_requested else "renewed")
    return {
        "runtime_id": beat.runtime_id, "session_id": beat.session_id, "lease_expires_at": beat.lease_expires_at,
        "open_run_id": beat.open_run_id, "abort_requested": beat.abort_requested,
    }


@router.post(
    "/runtimes/{runtime_id}/detach", response={200: RuntimeOut, **errors(403, 404)},
    summary="Detach: the runtime ends its own generation (same as closing the session; idempotent)",
)
def detach(request: HttpRequest, runtime_id: int):
    return session_actions.detach_runtime(caller(request), runtime_id)
