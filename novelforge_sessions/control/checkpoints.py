"""Checkpoints: bounded resume state at the contract's §06 boundaries. Immutable once written."""
from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from novelforge_sessions import commit, events
from novelforge_sessions import event_types as ev
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import TOKEN_STILL_VALID_SQL, Caller, recheck_params, token_confirmed
from novelforge_sessions.actions.artifacts import require_versions
from novelforge_sessions.actions.lifecycle import BIGINT_MAX, acts_for_runtime, check, runtime_gone
from novelforge_sessions.control import waits
from novelforge_sessions.control.models import ApprovalDecision, WriteIntent
from novelforge_sessions.errors import (
    IdempotencyKeyReused, NotFound, RunNotOpen, ServiceError, StaleAuthority, ValidationFailed,
)
from novelforge_sessions.models import LIVE_RUNTIME_PARAMS, Checkpoint, Event, Project, Run, Session, live_runtime_sql

#: The columns ``Project.authority_ref()`` reads, so the lock below selects exactly those.
_AUTHORITY_FIELDS = tuple(Project().authority_ref())
# The pure core types the refs a checkpoint states by these names (``rt.AUTHORITY_REF_TYPES``).
assert set(_AUTHORITY_FIELDS) == set(rt.AUTHORITY_REF_TYPES), "the stated authority refs are the project's"


def check_authority(stated: dict[str, Any] | None, current: dict[str, Any]) -> None:
    """``stale_authority`` when a stated ref (typed by ``rt.validate_authority_refs``) is not
    the project's current one: the checkpoint was frozen against an old Canon."""
    if stated:
        differing = {k: {"stated": v, "current": current[k]} for k, v in stated.items() if v != current[k]}
        if differing:
            raise StaleAuthority("the checkpoint was frozen against outdated authority", differences=differing)

# The hot path's one read, in SQL: building the equivalent ORM query (select_related through
# session to project, scoped to the caller) cost ~0.7 ms CPU per checkpoint, most of the step.
# Lock only the run (FOR UPDATE OF r): checkpoint numbering is per run. Session-level
# transitions lock session then run, so this single lock cannot deadlock with them. Whether
# the session still has a live runtime is read here too (the one rule in SQL,
# ``models.live_runtime_sql``): a runtime whose lease ran out writes no checkpoint, at no extra
# statement.
def lock_run_sql(*columns: str) -> str:
    """The run lock, selecting ``state, checkpoint_count, session_id, project_id, status,
    runtime_live, token_still_valid`` (a recalled caller's token checked again, ``access.
    TOKEN_STILL_VALID_SQL``), then ``columns``, then the project's authority fields
    (``_AUTHORITY_FIELDS``, in order)."""
    return f"""
SELECT r.state, r.checkpoint_count, r.session_id, s.project_id,
       s.status, {live_runtime_sql("r.session_id")}, {TOKEN_STILL_VALID_SQL},
       {"".join(f"{c}, " for c in columns)}{", ".join(f"p.{f}" for f in _AUTHORITY_FIELDS)}
  FROM {Run._meta.db_table} AS r
  JOIN {Session._meta.db_table} AS s ON s.id = r.session_id
  JOIN {Project._meta.db_table} AS p ON p.id = s.project_id
 WHERE r.id = %(id)s AND s.project_id = ANY(%(projects)s)
   AND (%(bound)s::bigint IS NULL OR s.id = %(bound)s::bigint)
   AND {events.order_lock_sql(f"SELECT session_id FROM {Run._meta.db_table} WHERE id = %(id)s::bigint")}
   FOR UPDATE OF r
"""


#: The single checkpoint's lock also draws the checkpoint's id.
_LOCK_RUN_SQL = lock_run_sql(f"nextval(pg_get_serial_sequence('{Checkpoint._meta.db_table}', 'id'))")


# The checkpoint, the run's counter and the checkpoint's event in ONE statement (the ORM's
# insert plus update, and the event's own insert, cost three round trips and ~0.4 ms of query
# building on the hottest path). The checkpoint's id was drawn by the lock above, so the
# event's payload (which names it) is built and checked in Python (``events.stage``).
_INSERT_SQL = f"""
WITH c AS (
  INSERT INTO {Checkpoint._meta.db_table}
    (id, session_id, run_id, seq, boundary, cursor, artifacts, authority, pending, approvals, resume_policy,
     schema_version, size_bytes, created_at, idempotency_key, request_digest)
  VALUES (%(id)s, %(session)s, %(run)s, %(seq)s, %(boundary)s, %(cursor)s::jsonb, %(artifacts)s::jsonb,
          %(authority)s::jsonb, %(pending)s::jsonb, %(approvals)s::jsonb, %(resume_policy)s, %(schema_version)s,
          %(size_bytes)s, %(created_at)s, %(idempotency_key)s, %(request_digest)s)
), u AS (
  UPDATE {Run._meta.db_table} SET checkpoint_count = %(seq)s, cursor = %(cursor)s::jsonb WHERE id = %(run)s
), e AS (
  {events.STAGED_INSERT_SQL}
)
SELECT id FROM e
"""


# A checkpoint without refs or idempotency key (what an agent writes at nearly every step) in
# ONE statement: the run lock above (``l``, its ordering lock first), the conditions under which
# it may be written (``w``: the token still valid and none of ``_refuse_unwritable``'s refusals,
# the same rules in SQL), and the three writes, each from ``w``, so a refusal writes nothing.
# Sent as ``BEGIN; <this>; COMMIT`` (``commit.execute_only``): one round trip instead of two,
# and the run lock is held for one statement only. The row of ``l`` comes back with the event's
# id (NULL: nothing was written), and ``_record_in_one_statement`` runs the refusal order on it
# as the two-statement path does, failing if the two ever disagree. The authority check is JSON
# containment, which for the refs' scalar values (typed by ``rt.validate_authority_refs``) is
# ``check_authority``'s equality. After a wait for the run lock the row is the latest version
# (READ COMMITTED re-reads a locked row), so the count and the run's update are the committed
# ones, as they were with two statements; ``created_at`` is stamped just before the statement
# instead of under the lock, so two writers racing on one run may store stamps a lock wait
# out of seq order.
_LOCK_COLUMNS = ("state", "checkpoint_count", "session_id", "project_id", "status", "runtime_live", "token_valid",
                 "checkpoint_id", *_AUTHORITY_FIELDS)


def _current_authority(alias: str) -> str:
    """The project's current authority refs of the locked row ``alias`` as the JSON object the
    checkpoint stores (``Project.authority_ref()``'s keys)."""
    return "jsonb_build_object({})".format(", ".join(f"'{f}', {alias}.{f}" for f in _AUTHORITY_FIELDS))


_WRITE_SQL = f"""
WITH l ({", ".join(_LOCK_COLUMNS)}) AS ({_LOCK_RUN_SQL}), w AS (
  SELECT * FROM l
   WHERE l.token_valid AND l.state = %(open)s AND (l.runtime_live OR NOT %(acts_for_runtime)s)
     AND {_current_authority("l")} @> %(stated_authority)s::jsonb
), c AS (
  INSERT INTO {Checkpoint._meta.db_table}
    (id, session_id, run_id, seq, boundary, cursor, artifacts, authority, pending, approvals, resume_policy,
     schema_version, size_bytes, created_at)
  SELECT w.checkpoint_id, w.session_id, %(id)s, w.checkpoint_count + 1, %(boundary)s, %(cursor)s::jsonb, '[]',
         {_current_authority("w")}, '{{}}', '[]', %(resume_policy)s, %(schema_version)s, %(size_bytes)s, %(created_at)s
    FROM w
  RETURNING id, seq
), u AS (
  UPDATE {Run._meta.db_table} AS r SET checkpoint_count = c.seq, cursor = %(cursor)s::jsonb FROM c WHERE r.id = %(id)s
), e AS (
  INSERT INTO {Event._meta.db_table} (project_id, session_id, run_id, type, payload, actor, created_at)
  SELECT w.project_id, w.session_id, %(id)s, %(ev_type)s,
         %(ev_payload)s::jsonb || jsonb_build_object('checkpoint_id', c.id, 'seq', c.seq), %(ev_actor)s, now()
    FROM w, c
  RETURNING id
)
SELECT l.*, (SELECT id FROM e) FROM l
"""
#: The event payload's fields the statement fills (it draws the id and counts the seq).
_FILLED = frozenset({"checkpoint_id", "seq"})


def _dumps(value: Any) -> str:
    return json.dumps(value, cls=DjangoJSONEncoder)


def lock_params(caller: Caller, run_id: int) -> dict[str, Any]:
    """The parameters of ``_LOCK_RUN_SQL`` (and the batch's form of it)."""
    return {"id": run_id, "projects": list(caller.project_ids), "bound": caller.session_id, "now": timezone.now(),
            **LIVE_RUNTIME_PARAMS, **recheck_params(caller)}


def request_digest(payload: dict[str, Any]) -> str:
    """sha256 of the body's canonical JSON: what an idempotency key is bound to."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":"), cls=DjangoJSONEncoder).encode()).hexdigest()


def record_checkpoint(caller: Caller, run_id: int, payload: dict[str, Any], *, refs_in_reach: bool = False) -> Checkpoint:
    """Validate (pure) then write checkpoint N+1 of an open run, in one transaction: one
    statement for a checkpoint without refs or idempotency key (``_WRITE_SQL``), else the run
    lock, the replay and the refs' reads, then the insert.

    With an ``idempotency_key``, a retry (same key, same body) returns the checkpoint the first
    request wrote, with ``replayed = True`` and nothing written, even if the run has ended since
    (the first outcome stands); the same key with another body is ``idempotency_key_reused``.
    The run's row lock orders two racing requests with one key: the second finds the first.

    Refusals, most fundamental first: not found → (a replay answers here, writing nothing) →
    ``run_not_open`` → ``no_live_runtime`` (a write on a runtime's behalf once the session's
    runtime is gone: its lease ran out, reconciled or not) → ``stale_authority`` → the refs.

    The authority refs are the project's *current* ones, read by the server; a client that
    states other refs is refused with ``stale_authority`` (it froze against an old Canon).
    Every artifact ref must name a real version of an artifact in this project within the
    caller's reach (``require_versions``: out of reach answers as missing; ``refs_in_reach``:
    the calling action resolved them in the caller's reach itself, a graph thread's own state
    blobs); each is stored with its artifact's head at that moment (``artifact_refs``), read by
    the same statement. Approval and pending refs are typed (pure core) and resolved here, then stored normalized
    (``_resolve_approvals``, the wait kinds of ``control/waits.py``): a ref that does not
    resolve is a 422 naming its field, and nothing is written. A checkpoint without refs runs
    no query for them.
    """
    caller.require("write")
    spec = check(
        rt.validate_checkpoint, payload, max_bytes=settings.CHECKPOINT_MAX_BYTES, pending_keys=waits.pending_keys(),
    )
    if 0 < run_id <= BIGINT_MAX and spec.idempotency_key is None and not (spec.artifacts or spec.approvals or spec.pending):
        return _record_in_one_statement(caller, run_id, spec)
    db = connections[DEFAULT_DB_ALIAS]  # once: each use of the ``connection`` proxy is a thread-local lookup
    with transaction.atomic():
        row = None
        if 0 < run_id <= BIGINT_MAX:  # a larger id names no row (as the ORM would say), never a 500
            events.before_order_lock()
            cur = commit.statement_cursor(db, _LOCK_RUN_SQL)
            commit.execute_first(cur, _LOCK_RUN_SQL, lock_params(caller, run_id))  # BEGIN rides along
            row = cur.fetchone()
        if row is None:
            raise NotFound("run not found", run_id=run_id)
        state, count, session_id, project_id, status, runtime_live, token_valid, checkpoint_id, *authority = row
        token_confirmed(caller, token_valid)  # a recalled caller's token, checked again (api/auth.py)
        digest = None
        if spec.idempotency_key is not None:
            digest = request_digest(payload)
            first = Checkpoint.objects.filter(run_id=run_id, idempotency_key=spec.idempotency_key).first()
            if first is not None:
                if first.request_digest != digest:
                    raise IdempotencyKeyReused(
                        "this idempotency key already names another checkpoint of this run", checkpoint_id=first.id,
                    )
                first.replayed = True
                return first
        current = dict(zip(_AUTHORITY_FIELDS, authority))
        _refuse_unwritable(caller, spec, state=state, session_id=session_id, status=status,
                           runtime_live=runtime_live, current=current)
        artifacts = artifact_refs(None if refs_in_reach else caller, project_id, spec.artifacts)
        approvals = _resolve_approvals(caller, project_id, spec.approvals) if spec.approvals else []
        pending = waits.resolve_pending(waits.WriteScope(project_id, session_id, run_id), spec.pending) if spec.pending else {}
        checkpoint = _checkpoint(spec, run_id, session_id, count + 1, checkpoint_id, current,
                                 artifacts=artifacts, pending=pending, approvals=approvals, created_at=timezone.now())
        event = events.stage(
            project_id=project_id, session_id=session_id, run_id=run_id, type=ev.CHECKPOINT_RECORDED, actor=caller.label,
            payload={"checkpoint_id": checkpoint.id, "seq": checkpoint.seq, "boundary": checkpoint.boundary,
                     "cursor": checkpoint.cursor},
        )
        # Both statements on cursors kept for them (``commit.statement_cursor``: their adapters once).
        cur = commit.statement_cursor(db, _INSERT_SQL)
        # The last statement: the COMMIT rides along when this block ends the transaction.
        commit.execute_last(cur, _INSERT_SQL, {
            "id": checkpoint.id, "session": session_id, "run": run_id, "seq": checkpoint.seq,
            "boundary": checkpoint.boundary, "cursor": _dumps(checkpoint.cursor),
            "artifacts": _dumps(checkpoint.artifacts), "authority": _dumps(current), "pending": _dumps(pending),
            "approvals": _dumps(approvals), "resume_policy": checkpoint.resume_policy,
            "schema_version": checkpoint.schema_version, "size_bytes": checkpoint.size_bytes,
            "created_at": checkpoint.created_at, "idempotency_key": spec.idempotency_key, "request_digest": digest,
            **event.params,
        })
        events.recorded(event, cur.fetchone()[0])
        checkpoint.idempotency_key, checkpoint.request_digest = spec.idempotency_key, digest
    return checkpoint


def _refuse_unwritable(
    caller: Caller, spec: rt.CheckpointSpec, *, state: str, session_id: int, status: str, runtime_live: bool,
    current: dict[str, Any],
) -> None:
    """The refusals after the replay, in order: ``run_not_open``, ``no_live_runtime`` (a write
    on a runtime's behalf once the session's runtime is gone), ``stale_authority``. The one
    statement's ``w`` (``_WRITE_SQL``) writes exactly when none of these applies."""
    if state != rt.RunState.OPEN:
        raise RunNotOpen("checkpoints are written by an open run", state=state)
    if not runtime_live and acts_for_runtime(caller):
        raise runtime_gone(session_id, status)
    check_authority(spec.authority, current)


def _checkpoint(
    spec: rt.CheckpointSpec, run_id: int, session_id: int, seq: int, checkpoint_id: int, current: dict[str, Any], *,
    artifacts: list[dict[str, Any]], pending: dict[str, Any], approvals: list[Any], created_at: datetime,
) -> Checkpoint:
    """The written checkpoint as the answer shows it (``created_at``: the application's clock,
    which resume compares)."""
    checkpoint = Checkpoint(
        id=checkpoint_id, session_id=session_id, run_id=run_id, seq=seq, boundary=spec.boundary.value,
        cursor=spec.cursor, artifacts=artifacts, authority=current, pending=pending, approvals=approvals,
        resume_policy=spec.resume_policy, size_bytes=spec.size_bytes, created_at=created_at,
    )
    checkpoint._state.adding = False
    checkpoint.replayed = False
    return checkpoint


def _record_in_one_statement(caller: Caller, run_id: int, spec: rt.CheckpointSpec) -> Checkpoint:
    """``record_checkpoint`` for a checkpoint without refs or idempotency key: ``_WRITE_SQL``,
    one round trip. The statement decides whether to write (``w``); the refusal order is then
    run on the locked row as on the two-statement path, and the two must agree (they check the
    same conditions; ``tests/sessions/test_one_statement_checkpoint.py`` runs every refusal on
    both paths)."""
    db = connections[DEFAULT_DB_ALIAS]
    created_at = timezone.now()
    with transaction.atomic():
        event = events.stage_in_locking_statement(
            type=ev.CHECKPOINT_RECORDED, filled=_FILLED, actor=caller.label,
            payload={"boundary": spec.boundary.value, "cursor": spec.cursor},
        )
        events.before_order_lock()
        cur = commit.statement_cursor(db, _WRITE_SQL)
        commit.execute_only(cur, _WRITE_SQL, {
            **lock_params(caller, run_id), "open": rt.RunState.OPEN.value, "acts_for_runtime": acts_for_runtime(caller),
            "stated_authority": _dumps(spec.authority or {}), "boundary": spec.boundary.value,
            "cursor": _dumps(spec.cursor), "resume_policy": spec.resume_policy,
            "schema_version": rt.CHECKPOINT_SCHEMA_VERSION, "size_bytes": spec.size_bytes, "created_at": created_at,
            **event,
        })
        row = cur.fetchone()
        if row is None:
            raise NotFound("run not found", run_id=run_id)
        state, count, session_id, project_id, status, runtime_live, token_valid, checkpoint_id, *authority, event_id = row
        current = dict(zip(_AUTHORITY_FIELDS, authority))
        try:
            token_confirmed(caller, token_valid)  # a recalled caller's token, checked again (api/auth.py)
            _refuse_unwritable(caller, spec, state=state, session_id=session_id, status=status,
                               runtime_live=runtime_live, current=current)
        except ServiceError:
            if event_id is not None:  # never: the statement wrote what the checks refuse
                raise RuntimeError(f"checkpoint of run {run_id} written by its statement but refused by its checks")
            raise
        if event_id is None:  # never: the checks pass what the statement did not write
            raise RuntimeError(f"checkpoint of run {run_id} passed its checks but its statement wrote nothing")
        events.recorded(events.Staged({}, project_id, session_id, run_id, ev.CHECKPOINT_RECORDED.name, caller.label), event_id)
    return _checkpoint(spec, run_id, session_id, count + 1, checkpoint_id, current,
                       artifacts=[], pending={}, approvals=[], created_at=created_at)


def artifact_refs(reach: Caller | None, project_id: int, refs: tuple[rt.ArtifactRef, ...]) -> list[dict[str, Any]]:
    """Resolve a checkpoint's artifact refs (``require_versions``: within ``reach``, one
    statement; none without refs) and store each as ``{"artifact_id", "fingerprint",
    "head_version_id"}``: the version the checkpoint froze, and its artifact's head (current
    version) when it froze it. A frozen candidate is often not its artifact's head (making it
    current is a write intent): resume fails the ref only when the head moved since."""
    if not refs:
        return []
    heads = require_versions(reach, project_id, ((r.artifact_id, r.fingerprint) for r in refs), what="artifact refs")
    return [{"artifact_id": r.artifact_id, "fingerprint": r.fingerprint,
             "head_version_id": heads[(r.artifact_id, r.fingerprint)]} for r in refs]


def _resolve_approvals(caller: Caller, project_id: int, refs: tuple[rt.ApprovalRef, ...]) -> list[dict[str, Any]]:
    """Resolve ``approvals`` refs against this project's write intents in the caller's reach
    (one query): a session-bound token cites only its own session's intents (unless it holds
    ``project``), and another session's answers as a missing id does.

    Each becomes ``{"write_intent_id", "approval_id", "standing_approval_id",
    "before_fingerprint", "intent_state"}``: the approval the client named (verified to be one
    of that intent's, else null), the intent's standing approval at checkpoint time, its
    expected before-state and its state. Resume checks every one against current state.
    """
    intents: dict[int, dict[str, Any]] = {}
    in_reach = caller.scope("write_intent", WriteIntent.objects.filter(project_id=project_id))
    rows = in_reach.filter(id__in=[r.write_intent_id for r in refs]).values_list(
        "id", "state", "before_fingerprint", "approvals__id", "approvals__decision", "approvals__revoked_at",
    )
    for intent_id, state, before, approval_id, decision, revoked_at in rows:
        intent = intents.setdefault(intent_id, {"state": state, "before": before, "approvals": set(), "standing": None})
        if approval_id is not None:
            intent["approvals"].add(approval_id)
            if revoked_at is None and decision == ApprovalDecision.APPROVED:
                intent["standing"] = approval_id
    resolved = []
    for index, ref in enumerate(refs):
        intent = intents.get(ref.write_intent_id)
        if intent is None:
            raise ValidationFailed("no write intent of this project has this id",
                                   field=f"approvals[{index}].write_intent_id")
        if ref.approval_id is not None and ref.approval_id not in intent["approvals"]:
            raise ValidationFailed("this approval is not one of that write intent's",
                                   field=f"approvals[{index}].approval_id")
        resolved.append({
            "write_intent_id": ref.write_intent_id, "approval_id": ref.approval_id,
            "standing_approval_id": intent["standing"], "before_fingerprint": intent["before"],
            "intent_state": intent["state"],
        })
    return resolved
