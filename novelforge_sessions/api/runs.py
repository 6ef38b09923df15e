"""Runs and checkpoints."""
from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Status

from novelforge_sessions import tracing
from novelforge_sessions.access import Caller
from novelforge_sessions.actions import runs as actions
from novelforge_sessions.control.batch import record_batch
from novelforge_sessions.control.checkpoints import record_checkpoint
from novelforge_sessions.apikit.auth import RECALL
from novelforge_sessions.apikit.common import RUNTIME_GONE, caller, errors, get_or_404, keyset
from novelforge_sessions.api.schemas import (
    BatchIn, BatchItemOut, BatchOut, CheckpointIn, CheckpointOut, CursorIn, RunEndIn, RunIn, RunOut, RunStateName,
)
from novelforge_sessions.apikit.schemas import Page, page_after, page_limit
from novelforge_sessions.models import Checkpoint, Run

router = Router(tags=["runs"])



@router.post(
    "/sessions/{session_id}/runs", response={201: RunOut, **errors(403, 404, 409)},
    summary="Start a run (needs a live runtime; at most one open run)",
    description="With an `idempotency_key` (scoped to the session) the same key and body answer 201 with the run "
    "the first request started, writing nothing, whatever the session did since; the same key with another body "
    "is 409 `idempotency_key_reused`.",
)
def start_run(request: HttpRequest, session_id: int, body: RunIn):
    run = actions.start_run(
        caller(request), session_id, task_mode=body.task_mode, target=body.target, cursor=body.cursor,
        frozen_inputs=body.frozen_inputs, runtime_id=body.runtime_id, idempotency_key=body.idempotency_key,
    )
    return Status(201, run)


@router.get("/sessions/{session_id}/runs", response={200: Page[RunOut], **errors(403, 404)}, summary="List a session's runs")
def list_runs(request: HttpRequest, session_id: int, state: RunStateName | None = None, after: int | None = page_after(),
              limit: int = page_limit()):
    who = caller(request)
    who.require("read")
    session = get_or_404(who.sessions(), "session", id=session_id)
    qs = Run.objects.filter(session=session)
    if state:
        qs = qs.filter(state=state)
    return keyset(qs, after=after, limit=limit)


@router.get("/runs/{run_id}", response={200: RunOut, **errors(403, 404)}, summary="Get a run")
def get_run(request: HttpRequest, run_id: int):
    who = caller(request)
    who.require("read")
    return get_or_404(who.scope("run", Run.objects.filter(session__project_id__in=who.project_ids)), "run", id=run_id)


@router.post(
    "/runs/{run_id}/cursor", response={200: RunOut, **errors(403, 404, 409)}, summary="Advance the workflow cursor",
    description=RUNTIME_GONE,
)
def advance_cursor(request: HttpRequest, run_id: int, body: CursorIn):
    return actions.advance_cursor(caller(request), run_id, body.cursor, runtime_id=body.runtime_id)


@router.post(
    "/runs/{run_id}/end", response={200: RunOut, **errors(403, 404, 409)},
    summary="End the open run (the session goes idle, completed or failed)",
    description="409 `wait_outstanding` (`details.waiting_on`) for outcome `completed` while the run still waits "
    "on a pending review gate; it may still fail or be aborted. An aborted run leaves a `running` session `idle` "
    "and a waiting one (`awaiting_user`, `awaiting_external`) `failed` (the table has no `awaiting_* → idle`). "
    + RUNTIME_GONE,
)
def end_run(request: HttpRequest, run_id: int, body: RunEndIn):
    return actions.end_run(
        caller(request), run_id, outcome=body.outcome, session_status=body.session_status, reason=body.reason,
        runtime_id=body.runtime_id,
    )


@router.post(
    "/runs/{run_id}/checkpoints", response={200: CheckpointOut, 201: CheckpointOut, **errors(403, 404, 409, 413)},
    auth=RECALL,
    summary="Record a bounded checkpoint (201; 200 replays the same idempotency key)",
    description=(
        "422 `checkpoint_not_bounded` for transcript-like or oversized bodies. Send an `idempotency_key` to make "
        "the write safe to retry: the same key with the same body answers 200 with the checkpoint the first "
        "request wrote (nothing is written again, even after the run ended); the same key with another body is "
        "409 `idempotency_key_reused`. " + RUNTIME_GONE
    ),
)
def create_checkpoint(request: HttpRequest, run_id: int, body: CheckpointIn):
    return Status(*checkpoint_answer(write_checkpoint(caller(request), run_id, body.model_dump(exclude_unset=True))))


def write_checkpoint(who: Caller, run_id: int, payload: dict[str, Any]) -> Checkpoint:
    """The checkpoint route's action, traced: this route's and the API socket's (``api/socket.py``)."""
    with tracing.span("checkpoint", run_id=run_id) as span:
        checkpoint = record_checkpoint(who, run_id, payload)
        span.set(session_id=checkpoint.session_id, checkpoint_id=checkpoint.id, seq=checkpoint.seq,
                 outcome="replayed" if checkpoint.replayed else "created")
    return checkpoint


def checkpoint_answer(checkpoint: Checkpoint) -> tuple[int, CheckpointOut]:
    """The checkpoint route's answer: 200 for a replay, else 201, with the checkpoint."""
    return 200 if checkpoint.replayed else 201, _checkpoint_out(checkpoint)


@router.post(
    "/runs/{run_id}/batch", response={201: BatchOut, **errors(403, 404, 409, 413)},
    auth=RECALL,
    summary="Several checkpoints and cursor advances of one run in one transaction (all or nothing)",
    description=(
        "Use it when an agent makes several durable steps together (it froze several boundaries, or it "
        "checkpoints and then moves its cursor): one request, one transaction, one acknowledgement after the "
        "commit, instead of one round trip and one commit per step. Items are applied in order; each gets its "
        "own typed result. The first refusal (any item) is the answer, naming `details.item` and a field "
        "prefixed `items[i].`, and nothing of the batch is written. Same rules as the single writes; no "
        "`runtime_id` fencing (use the single cursor write for a fenced advance). With an `idempotency_key` "
        "(scoped to the run) the same key and items answer 201 with what the first batch wrote (nothing is "
        "written again, even after the run ended); the same key with other items is 409 "
        "`idempotency_key_reused`. " + RUNTIME_GONE
    ),
)
def create_batch(request: HttpRequest, run_id: int, body: BatchIn):
    items = [item.model_dump(exclude_unset=True) for item in body.items]
    with tracing.span("batch", run_id=run_id, items=len(items)) as span:
        count, results = record_batch(caller(request), run_id, items, idempotency_key=body.idempotency_key)
        span.set(checkpoint_count=count, outcome="written")
    return Status(201, BatchOut.model_construct(run_id=run_id, checkpoint_count=count, items=[
        BatchItemOut.model_construct(kind=r.kind, checkpoint=None if r.checkpoint is None else _checkpoint_out(r.checkpoint),
                                     cursor=r.cursor) for r in results]))


#: The fields of a checkpoint as the API answers them.
_CHECKPOINT_OUT_FIELDS = tuple(CheckpointOut.model_fields)


def _checkpoint_out(checkpoint: Checkpoint) -> CheckpointOut:
    """A checkpoint as the API answers it (the single write's, the socket's and each of a batch's),
    built from the row it wrote (or, replayed, read):
    already the declared types, so it is not validated again (ninja validates a returned dict
    attribute by attribute through its ``DjangoGetter``, most of a batch's answer; a returned
    instance of the response schema is only dumped). ``tests/api/test_batch.py`` holds it equal
    to the validated answer."""
    return CheckpointOut.model_construct(**{name: getattr(checkpoint, name) for name in _CHECKPOINT_OUT_FIELDS})


@router.get("/runs/{run_id}/checkpoints", response={200: Page[CheckpointOut], **errors(403, 404)}, summary="List a run's checkpoints")
def list_checkpoints(request: HttpRequest, run_id: int, after: int | None = page_after(), limit: int = page_limit()):
    who = caller(request)
    who.require("read")
    run = get_or_404(who.scope("run", Run.objects.filter(session__project_id__in=who.project_ids)), "run", id=run_id)
    return keyset(Checkpoint.objects.filter(run=run), after=after, limit=limit)


@router.get("/checkpoints/{checkpoint_id}", response={200: CheckpointOut, **errors(403, 404)}, summary="Get a checkpoint")
def get_checkpoint(request: HttpRequest, checkpoint_id: int):
    who = caller(request)
    who.require("read")
    qs = who.scope("checkpoint", Checkpoint.objects.filter(session__project_id__in=who.project_ids))
    return get_or_404(qs, "checkpoint", id=checkpoint_id)
