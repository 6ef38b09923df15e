"""A batch of a run's durable steps in ONE statement: checkpoints and cursor advances.

When an agent makes several steps together (it froze three boundaries while drafting, or it
checkpoints and then advances its cursor), one request carries them all: every item is
validated first (pure, nothing written) and its refs resolved, then one statement, its own
transaction (``commit.execute_write``), locks the run, decides (``checkpoints.decided_lock_sql``),
inserts every checkpoint, updates the run once and appends every event. All or nothing: the
first refusal names its item (``details.item``, and ``field`` prefixed ``items[i].``) and
nothing is written. Each item's result is its own typed object (the checkpoint written, or the
cursor it set), in item order.

Same rules as the single writes (``control.checkpoints.record_checkpoint``,
``actions.runs.advance_cursor`` without ``runtime_id`` fencing): an open run, a live runtime
(for a write on a runtime's behalf), current authority, resolvable refs (artifact refs within the
caller's reach); checkpoints are numbered consecutively in item order.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from novelforge_sessions import commit, events
from novelforge_sessions import event_types as ev
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller, token_confirmed
from novelforge_sessions.actions import idempotency
from novelforge_sessions.actions.artifacts import gone_blobs
from novelforge_sessions.actions.lifecycle import BIGINT_MAX, check
from novelforge_sessions.control import waits
from novelforge_sessions.control.checkpoints import (
    ALL_HELD, HOLD_CTE, Locked, current_authority_sql, _resolve_approvals, artifact_refs, collected_refs_error,
    decided_lock_sql, lock_params, refusal, run_scope,
)
from novelforge_sessions.errors import NotFound, ServiceError, ValidationFailed
from novelforge_sessions.models import Checkpoint, Event, KeyedOperation, Run

MAX_BATCH_ITEMS = rt.MAX_BATCH_ITEMS  # declared in the OpenAPI schema as maxItems

# The items in order (``t``, numbered ``ord``; ``n``: a checkpoint's number within the batch),
# written from ``w`` (the run when nothing refuses and every ref resolved): the checkpoints
# numbered after the locked row's count, the run's count and cursor, and one event per item with
# ids reserved as one consecutive range in item order (``nf_event_ids``). ``holds``: the items
# cite graph blobs, held until the batch commits (``h``, ``checkpoints.HOLD_CTE``) and every one
# still there, or nothing is written. Sent compacted: without ``h`` it fits
# ``commit.PARSE_CACHED_BYTES``, so psycopg parses its text once, not on every batch (with ``h``
# it is a little longer and parsed each time: a batch citing a graph blob is a rare write).
@functools.cache
def _write_sql(holds: bool) -> str:
    return commit.compact(f"""
WITH l AS ({decided_lock_sql("r.seq")}),{f" {HOLD_CTE}," if holds else ""}
w AS (SELECT * FROM l WHERE l.refusal IS NULL AND %(write)s{f" AND {ALL_HELD}" if holds else ""}),
t AS (
  SELECT i.*, count(*) FILTER (WHERE i.kind = 'checkpoint') OVER (ORDER BY i.ord) AS n
    FROM ROWS FROM (jsonb_to_recordset(%(items)s::jsonb) AS (kind text, boundary text, cursor jsonb, artifacts jsonb,
                    pending jsonb, approvals jsonb, resume_policy text, size_bytes int, created_at timestamptz,
                    ev_payload jsonb))
         WITH ORDINALITY AS i(kind, boundary, cursor, artifacts, pending, approvals, resume_policy, size_bytes,
                              created_at, ev_payload, ord)
), c AS (
  INSERT INTO {Checkpoint._meta.db_table}
    (session_id, run_id, seq, boundary, cursor, artifacts, authority, pending, approvals, resume_policy,
     schema_version, size_bytes, created_at)
  SELECT w.session_id, %(id)s, w.checkpoint_count + t.n, t.boundary, t.cursor, t.artifacts, {current_authority_sql("w")},
         t.pending, t.approvals, t.resume_policy, %(schema_version)s, t.size_bytes, t.created_at
    FROM w, t WHERE t.kind = 'checkpoint' ORDER BY t.ord
  RETURNING id, seq, created_at
), u AS (
  UPDATE {Run._meta.db_table} AS r SET checkpoint_count = w.checkpoint_count + %(checkpoints)s,
         cursor = %(run_cursor)s::jsonb
    FROM w WHERE r.id = %(id)s
), b AS (
  SELECT nf_event_ids(%(events)s::int4) AS first FROM w
), e AS (
  INSERT INTO {Event._meta.db_table} (id, project_id, session_id, run_id, type, payload, actor, created_at)
  SELECT b.first + t.ord - 1, w.project_id, w.session_id, %(id)s, t.kind_event,
         t.ev_payload || CASE WHEN t.kind = 'checkpoint' THEN jsonb_build_object('checkpoint_id', c.id, 'seq', c.seq)
                              ELSE jsonb_build_object('seq', w.c0) END,
         %(actor)s, now()
    FROM w, b, (SELECT t.*, CASE t.kind WHEN 'checkpoint' THEN %(checkpoint_event)s ELSE %(cursor_event)s END
                  AS kind_event FROM t) AS t
    LEFT JOIN c ON t.kind = 'checkpoint' AND c.seq = t.n + (SELECT checkpoint_count FROM w)
   ORDER BY t.ord
  RETURNING id
)
SELECT l.*, (SELECT array_agg(ARRAY[c.id, c.seq] ORDER BY c.seq) FROM c),
       (SELECT array_agg(c.created_at ORDER BY c.seq) FROM c), (SELECT array_agg(id ORDER BY id) FROM e)
  FROM l
""")


_WRITE_SQL = _write_sql(False)  # the batch that cites no graph blob: nearly every one

#: What the statement fills in each event's payload (ids it draws, numbers it counts).
_CHECKPOINT_FILLED = frozenset({"checkpoint_id", "seq"})
_CURSOR_FILLED = frozenset({"seq"})


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


def _stored(value: Any) -> Any:
    """``value`` as the database stored it (its JSON read back); an empty one as it is."""
    return json.loads(_dumps(value)) if value else value


def record_batch(caller: Caller, run_id: int, items: list[dict[str, Any]], *,
                 idempotency_key: str | None = None) -> tuple[int, list[ItemResult]]:
    """Validate every item, then write them all in one transaction (see the module doc).

    ``items``: ``{"kind": "checkpoint", "checkpoint": {...the single write's body...}}`` or
    ``{"kind": "cursor", "cursor": {...}}``. Returns the run's checkpoint count after the
    batch and one result per item.

    With an ``idempotency_key`` (scoped to the run), the same key and items answer what the first
    batch wrote (its checkpoints, the count after it), writing nothing, even after the run ended;
    other items are ``idempotency_key_reused`` (``actions/idempotency.py``). The statement then
    runs inside a transaction with the key's row (without a key it is its own transaction).
    """
    caller.require("write")
    key = idempotency.key_for(KeyedOperation.BATCH, run_id, idempotency_key, items)

    def write() -> tuple[tuple[int, list[ItemResult]], int, idempotency.Answer]:
        count, results = _record_batch(caller, run_id, items)
        ids = [r.checkpoint.id for r in results if r.checkpoint is not None]
        session_id = next((r.checkpoint.session_id for r in results if r.checkpoint is not None), None)
        if session_id is None:
            session_id = Run.objects.values_list("session_id", flat=True).get(id=run_id)
        return (count, results), session_id, idempotency.Answer(201, {"checkpoint_count": count, "checkpoints": ids})

    def replay(first: idempotency.Answer) -> tuple[int, list[ItemResult]]:
        written = iter(Checkpoint.objects.filter(id__in=first.data["checkpoints"]).order_by("seq"))
        results = [ItemResult(kind="checkpoint", checkpoint=next(written)) if item.get("kind") == "checkpoint"
                   else ItemResult(kind="cursor", cursor=item.get("cursor")) for item in items]
        return first.data["checkpoint_count"], results

    return idempotency.once(caller, key, write, replay)


def _record_batch(caller: Caller, run_id: int, items: list[dict[str, Any]]) -> tuple[int, list[ItemResult]]:
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
    # statement (``checkpoints.decided_lock_sql``); ``stated_by`` maps its index to the item.
    stated_by = [index for index, (kind, _spec, _body) in enumerate(specs) if kind == "checkpoint"]
    stated = [specs[index][1].authority for index in stated_by]
    if not 0 < run_id <= BIGINT_MAX:
        raise NotFound("run not found", run_id=run_id)
    # Refs are resolved first; the first refusal among them is held until the statement has
    # decided, so a more fundamental refusal (the run's) still wins.
    session_id = project_id = None
    if any(kind == "checkpoint" and (spec.artifacts or spec.approvals or any(spec.pending.values()))
           for kind, spec, _body in specs):
        scope = run_scope(caller, run_id)
        if scope is None:
            raise NotFound("run not found", run_id=run_id)
        session_id, project_id = scope
    # The items go as ONE jsonb document (``t`` unpacks it with ``jsonb_to_recordset``): one JSON
    # encoding of the whole batch instead of one per value and ten array parameters to escape.
    rows: list[dict[str, Any]] = []
    blobs: set[int] = set()
    refs_error: ServiceError | None = None
    run_cursor: dict[str, Any] | None = None
    for index, (kind, spec, body) in enumerate(specs):
        if kind == "cursor":
            run_cursor = spec
            rows.append({"kind": "cursor", "cursor": spec, "artifacts": [], "pending": {}, "approvals": [],
                         "size_bytes": 0,
                         "ev_payload": ev.RUN_CURSOR_ADVANCED.filled_by_statement(_CURSOR_FILLED, cursor=spec)})
        else:
            artifacts: list[dict[str, Any]] = []
            approvals: list[Any] = []
            pending: dict[str, Any] = {}
            if refs_error is None:
                try:
                    artifacts, item_blobs = artifact_refs(caller, project_id, spec.artifacts)
                    blobs.update(item_blobs)
                    approvals = _resolve_approvals(caller, project_id, spec.approvals) if spec.approvals else []
                    pending = (waits.resolve_pending(waits.WriteScope(project_id, session_id, run_id), spec.pending)
                               if spec.pending else {})
                except ServiceError as exc:
                    refs_error = _at(index, exc)
            run_cursor = spec.cursor
            rows.append({
                "kind": "checkpoint", "boundary": spec.boundary.value, "cursor": spec.cursor, "artifacts": artifacts,
                "pending": pending, "approvals": approvals, "resume_policy": spec.resume_policy,
                "size_bytes": spec.size_bytes,
                # isoformat keeps the microseconds (DjangoJSONEncoder would cut them to milliseconds)
                "created_at": timezone.now().isoformat(),
                "ev_payload": ev.CHECKPOINT_RECORDED.filled_by_statement(
                    _CHECKPOINT_FILLED, boundary=spec.boundary.value, cursor=spec.cursor),
            })
    row = commit.execute_write(_write_sql(bool(blobs)), {
        **lock_params(caller, run_id, stated), "items": _dumps(rows), "write": refs_error is None,
        "blobs": sorted(blobs),
        "checkpoints": len(stated_by), "run_cursor": _dumps(run_cursor), "events": len(specs), "actor": caller.label,
        "schema_version": rt.CHECKPOINT_SCHEMA_VERSION, "checkpoint_event": ev.CHECKPOINT_RECORDED.name,
        "cursor_event": ev.RUN_CURSOR_ADVANCED.name,
    })
    if row is None:
        raise NotFound("run not found", run_id=run_id)
    locked = Locked.of(row[:-3])
    written, created, event_ids = row[-3:]
    refused = refusal(locked, stated, what="steps")
    if refused is not None:
        raise _at(stated_by[locked.stale_item], refused) if locked.refusal == "stale_authority" else refused
    token_confirmed(caller, True)  # a recalled caller's token: the statement found it unchanged
    if refs_error is not None:
        raise refs_error
    if event_ids is None:  # every batch appends an event: none, so a cited graph blob was collected since resolved
        gone = gone_blobs(sorted(blobs))
        for index, item in enumerate(rows):
            refused = collected_refs_error("artifact refs", item["artifacts"], gone)
            if refused is not None:
                raise _at(index, refused)
        raise NotFound("run not found", run_id=run_id)
    count = locked.checkpoint_count + len(stated_by)
    results: list[ItemResult] = []
    made = iter(zip(written or [], created or []))
    for index, (kind, spec, _body) in enumerate(specs):
        if kind == "cursor":
            results.append(ItemResult(kind="cursor", cursor=spec))
            continue
        (checkpoint_id, seq), created_at = next(made)
        item = rows[index]
        checkpoint = Checkpoint(
            id=checkpoint_id, session_id=locked.session_id, run_id=run_id, seq=seq, boundary=item["boundary"],
            cursor=spec.cursor, artifacts=_stored(item["artifacts"]), authority=locked.current,
            pending=_stored(item["pending"]), approvals=_stored(item["approvals"]),
            resume_policy=spec.resume_policy, size_bytes=spec.size_bytes, created_at=created_at,
        )
        checkpoint._state.adding = False
        results.append(ItemResult(kind="checkpoint", checkpoint=checkpoint))
    names = [ev.CHECKPOINT_RECORDED.name if kind == "checkpoint" else ev.RUN_CURSOR_ADVANCED.name
             for kind, _spec, _body in specs]
    events.recorded_many([(events.Staged({}, locked.project_id, locked.session_id, run_id, name, caller.label), event_id)
                          for name, event_id in zip(names, event_ids or [])])
    return count, results
