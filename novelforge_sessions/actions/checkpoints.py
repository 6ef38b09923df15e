"""Checkpoints: bounded resume state at the contract's §06 boundaries. Immutable once written."""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.actions.artifacts import require_versions
from novelforge_sessions.actions.lifecycle import Outbox, check
from novelforge_sessions.errors import Conflict, NotFound, StaleAuthority, ValidationFailed
from novelforge_sessions.models import Checkpoint, Run


def record_checkpoint(caller: Caller, run_id: int, payload: dict[str, Any]) -> Checkpoint:
    """Validate (pure) then write checkpoint N+1 of an open run, in one transaction.

    The authority refs are the project's *current* ones, read by the server; a client that
    states other refs is refused with ``stale_authority`` (it froze against an old Canon).
    Every artifact ref must name a real version of an artifact in this project.
    """
    caller.require("write")
    spec = check(rt.validate_checkpoint, payload, max_bytes=settings.CHECKPOINT_MAX_BYTES)
    with transaction.atomic():
        try:
            # Lock only the run: checkpoint numbering is per run. Session-level transitions
            # lock session then run, so this single lock cannot deadlock with them.
            run = (
                Run.objects.select_for_update(of=("self",)).select_related("session__project")
                .get(id=run_id, session__in=caller.sessions())
            )
        except Run.DoesNotExist:
            raise NotFound("run not found", run_id=run_id) from None
        if run.state != rt.RunState.OPEN:
            raise Conflict("checkpoints are written by an open run", code="run_not_open", state=run.state)
        session = run.session
        project = session.project
        current = project.authority_ref()
        stated = payload.get("authority")
        if stated is not None:
            if not isinstance(stated, dict):
                raise ValidationFailed("authority must be an object", field="authority")
            differing = {k: {"stated": stated[k], "current": v} for k, v in current.items() if k in stated and stated[k] != v}
            if differing:
                raise StaleAuthority("the checkpoint was frozen against outdated authority", differences=differing)
        require_versions(project.id, ((r.artifact_id, r.fingerprint) for r in spec.artifacts), what="artifact refs")
        run.checkpoint_count += 1
        checkpoint = Checkpoint.objects.create(
            session=session,
            run=run,
            seq=run.checkpoint_count,
            boundary=spec.boundary.value,
            cursor=spec.cursor,
            artifacts=[{"artifact_id": r.artifact_id, "fingerprint": r.fingerprint} for r in spec.artifacts],
            authority=current,
            pending=spec.pending,
            approvals=spec.approvals,
            resume_policy=spec.resume_policy,
            size_bytes=spec.size_bytes,
        )
        run.cursor = spec.cursor
        run.save(update_fields=["checkpoint_count", "cursor"])
        outbox = Outbox(caller.label)
        outbox.add(
            session, "checkpoint.recorded", run_id=run.id, checkpoint_id=checkpoint.id, seq=checkpoint.seq,
            boundary=checkpoint.boundary, cursor=checkpoint.cursor,
        )
        outbox.flush()
    return checkpoint
