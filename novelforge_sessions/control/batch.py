"""A batch of a run's durable steps in ONE transaction: checkpoints and cursor advances.

When an agent makes several steps together (it froze three boundaries while drafting, or it
checkpoints and then advances its cursor), one request carries them all: every item is
validated first (pure, nothing written), then the run is locked once, every checkpoint row is
inserted by one statement, the run is updated once and every event is appended by one
statement, then the transaction commits. All or nothing: the first refusal names its item
(``details.item``, and ``field`` prefixed ``items[i].``) and nothing is written. Each item's
result is its own typed object (the checkpoint written, or the cursor it set), in item order.

Same rules as the single writes (``control.checkpoints.record_checkpoint``,
``actions.runs.advance_cursor`` without ``runtime_id`` fencing): an open run, a live runtime
(for a write on a runtime's behalf), current authority, resolvable refs (artifact refs within the
caller's reach); checkpoints are numbered consecutively in item order.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.utils import timezone

from novelforge_sessions import events
from novelforge_sessions import event_types as ev
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller, token_confirmed
from novelforge_sessions.actions.lifecycle import BIGINT_MAX, check
from novelforge_sessions.control import waits
from novelforge_sessions.control.checkpoints import (
    Locked, _resolve_approvals, artifact_refs, decided_lock_sql, lock_params, refusal,
)
from novelforge_sessions.errors import NotFound, ServiceError, ValidationFailed
from novelforge_sessions.models import Checkpoint, Run

MAX_BATCH_ITEMS = rt.MAX_BATCH_ITEMS  # declared in the OpenAPI schema as maxItems

_INSERT_CHECKPOINTS = f"""
INSERT INTO {Checkpoint._meta.db_table}
  (session_id, run_id, seq, boundary, cursor, artifacts, authority, pending, approvals, resume_policy,
   schema_version, size_bytes, created_at)
SELECT %(session)s, %(run)s, t.seq, t.boundary, t.cursor, t.artifacts, %(authority)s::jsonb, t.pending, t.approvals,
       t.resume_policy, %(schema_version)s, t.size_bytes, t.created_at
  FROM unnest(%(seq)s::int[], %(boundary)s::text[], %(cursor)s::jsonb[], %(artifacts)s::jsonb[], %(pending)s::jsonb[],
              %(approvals)s::jsonb[], %(resume_policy)s::text[], %(size_bytes)s::int[], %(created_at)s::timestamptz[])
       AS t(seq, boundary, cursor, artifacts, pending, approvals, resume_policy, size_bytes, created_at)
 ORDER BY t.seq
RETURNING id, seq, created_at
"""
# The single checkpoint's lock, reading the run's seq (for cursor events) instead of drawing an id.
_LOCK_SQL = decided_lock_sql("r.seq")
_UPDATE_RUN = f"UPDATE {Run._meta.db_table} SET checkpoint_count = %s, cursor = %s::jsonb WHERE id = %s"


@dataclass(frozen=True)
class ItemResult:
    kind: str
    checkpoint: Checkpoint | None = None
    cursor: dict[str, Any] | None = None


def _at(index: int, exc: ServiceError) -> ServiceError:
    """The same refusal, naming the item it came from."""
    details = dict(exc.details)
    if isinstance(details.get("field"), str):
        details["field"] = f"items[{index}].{details['field']}"
    details["item"] = index
    return type(exc)(f"items[{index}]: {exc.message}", **details)


def _dumps(value: Any) -> str:
    return json.dumps(value, cls=DjangoJSONEncoder)


def record_batch(caller: Caller, run_id: int, items: list[dict[str, Any]]) -> tuple[int, list[ItemResult]]:
    """Validate every item, then write them all in one transaction (see the module doc).

    ``items``: ``{"kind": "checkpoint", "checkpoint": {...the single write's body...}}`` or
    ``{"kind": "cursor", "cursor": {...}}``. Returns the run's checkpoint count after the
    batch and one result per item.
    """
    caller.require("write")
    if not items:
        raise ValidationFailed("a batch needs at least one item", field="items")
    if len(items) > MAX_BATCH_ITEMS:
        raise ValidationFailed(f"at most {MAX_BATCH_ITEMS} items per batch", field="items", limit=MAX_BATCH_ITEMS)
    specs: list[tuple[str, Any, dict[str, Any]]] = []
    for index, item in enumerate(items):
        kind = item.get("kind")
        body = item.get("checkpoint") if kind == "checkpoint" else {"cursor": item.get("cursor")}
        body = body if isinstance(body, dict) else {}
        try:
            if kind == "checkpoint":
                spec = check(rt.validate_checkpoint, body, max_bytes=settings.CHECKPOINT_MAX_BYTES,
                             pending_keys=waits.pending_keys())
                if spec.idempotency_key is not None:  # never silently dropped: the single write has them
                    raise ValidationFailed(
                        "idempotency keys are for the single checkpoint write (POST /runs/{id}/checkpoints)",
                        field="checkpoint.idempotency_key",
                    )
            elif kind == "cursor":
                cursor = body.get("cursor")
                if not isinstance(cursor, dict) or not cursor:
                    raise ValidationFailed("cursor must be a non-empty JSON object", field="cursor")
                check(rt.validate_metadata, cursor, "cursor", rt.MAX_CURSOR_BYTES)
                spec = cursor
            else:  # the schema allows only these two; a direct caller gets the same refusal
                raise ValidationFailed("kind must be checkpoint or cursor", field="kind")
        except ServiceError as exc:
            raise _at(index, exc) from None
        specs.append((kind, spec, body))

    # The authority each checkpoint item states, decided with the run's other refusals by the
    # lock statement (``checkpoints.decided_lock_sql``); ``stated_by`` maps its index to the item.
    stated_by = [index for index, (kind, _spec, _body) in enumerate(specs) if kind == "checkpoint"]
    stated = [specs[index][1].authority for index in stated_by]
    with transaction.atomic():
        row = None
        if 0 < run_id <= BIGINT_MAX:
            events.before_order_lock()
            with connection.cursor() as cur:
                cur.execute(_LOCK_SQL, lock_params(caller, run_id, stated))
                row = cur.fetchone()
        if row is None:
            raise NotFound("run not found", run_id=run_id)
        locked = Locked.of(row)
        refused = refusal(locked, stated, what="steps")
        if refused is not None:
            raise _at(stated_by[locked.stale_item], refused) if locked.refusal == "stale_authority" else refused
        token_confirmed(caller, True)  # a recalled caller's token: the lock statement found it unchanged
        count, session_id, project_id, run_seq = (locked.checkpoint_count, locked.session_id, locked.project_id,
                                                  locked.extra)
        current = locked.current
        run_cursor = None
        cols: dict[str, list[Any]] = {k: [] for k in ("seq", "boundary", "cursor", "artifacts", "pending", "approvals",
                                                      "resume_policy", "size_bytes", "created_at")}
        plan: list[tuple[str, int | dict[str, Any]]] = []  # (kind, index into cols | cursor)
        for index, (kind, spec, body) in enumerate(specs):
            try:
                if kind == "cursor":
                    run_cursor = spec
                    plan.append((kind, spec))
                    continue
                artifacts = artifact_refs(caller, project_id, spec.artifacts)
                approvals = _resolve_approvals(caller, project_id, spec.approvals) if spec.approvals else []
                pending = (waits.resolve_pending(waits.WriteScope(project_id, session_id, run_id), spec.pending)
                           if spec.pending else {})
            except ServiceError as exc:
                raise _at(index, exc) from None
            count += 1
            run_cursor = spec.cursor
            plan.append((kind, len(cols["seq"])))
            cols["seq"].append(count)
            cols["boundary"].append(spec.boundary.value)
            cols["cursor"].append(_dumps(spec.cursor))
            cols["artifacts"].append(_dumps(artifacts))
            cols["pending"].append(_dumps(pending))
            cols["approvals"].append(_dumps(approvals))
            cols["resume_policy"].append(spec.resume_policy)
            cols["size_bytes"].append(spec.size_bytes)
            cols["created_at"].append(timezone.now())  # the application's clock, as auto_now_add
        written: list[tuple[int, int, Any]] = []
        with connection.cursor() as cur:
            if cols["seq"]:
                cur.execute(_INSERT_CHECKPOINTS, {
                    **cols, "session": session_id, "run": run_id, "authority": _dumps(current),
                    "schema_version": Checkpoint._meta.get_field("schema_version").default,
                })
                written = cur.fetchall()
            cur.execute(_UPDATE_RUN, [count, _dumps(run_cursor), run_id])
        results: list[ItemResult] = []
        outbox: list[dict[str, Any]] = []
        base = {"project_id": project_id, "session_id": session_id, "run_id": run_id, "actor": caller.label}
        for kind, ref in plan:
            if kind == "cursor":
                results.append(ItemResult(kind="cursor", cursor=ref))
                outbox.append({**base, "type": ev.RUN_CURSOR_ADVANCED, "payload": {"seq": run_seq, "cursor": ref}})
                continue
            checkpoint_id, seq, created_at = written[ref]
            checkpoint = Checkpoint(
                id=checkpoint_id, session_id=session_id, run_id=run_id, seq=seq, boundary=cols["boundary"][ref],
                cursor=json.loads(cols["cursor"][ref]), artifacts=json.loads(cols["artifacts"][ref]), authority=current,
                pending=json.loads(cols["pending"][ref]), approvals=json.loads(cols["approvals"][ref]),
                resume_policy=cols["resume_policy"][ref], size_bytes=cols["size_bytes"][ref], created_at=created_at,
            )
            results.append(ItemResult(kind="checkpoint", checkpoint=checkpoint))
            outbox.append({**base, "type": ev.CHECKPOINT_RECORDED, "payload": {
                "checkpoint_id": checkpoint.id, "seq": seq, "boundary": checkpoint.boundary, "cursor": checkpoint.cursor}})
        events.append_many(outbox)  # one statement for every event of the batch
    return count, results
