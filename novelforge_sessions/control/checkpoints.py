"""Checkpoints: bounded resume state at the boundaries of docs/model.md#checkpoints. Immutable once written."""
from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from novelforge_sessions import commit, events
from novelforge_sessions import event_types as ev
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import TOKEN_STILL_VALID_SQL, Caller, recheck_params, token_confirmed
from novelforge_sessions.actions.artifacts import HOLD_BLOBS_SQL, gone_blobs, require_versions, unknown_versions
from novelforge_sessions.actions.lifecycle import BIGINT_MAX, acts_for_runtime, check, runtime_gone
from novelforge_sessions.control import waits
from novelforge_sessions.control.models import ApprovalDecision, WriteIntent
from novelforge_sessions.errors import (
    IdempotencyKeyReused, NotFound, RunNotOpen, ServiceError, StaleAuthority, Unauthorized, ValidationFailed,
)
from novelforge_sessions.models import LIVE_RUNTIME_PARAMS, Checkpoint, Event, Project, Run, Session, live_runtime_sql

#: The columns ``Project.authority_ref()`` reads, so the lock below selects exactly those.
_AUTHORITY_FIELDS = tuple(Project().authority_ref())
# The pure core types the refs a checkpoint states by these names (``rt.AUTHORITY_REF_TYPES``).
assert set(_AUTHORITY_FIELDS) == set(rt.AUTHORITY_REF_TYPES), "the stated authority refs are the project's"


# The run lock, in SQL: building the equivalent ORM query (select_related through session to
# project, scoped to the caller) cost more than the rest of the step. Lock only the run (FOR
# UPDATE OF r): checkpoint numbering is per run. Session-level transitions lock session then run,
# so this single lock cannot deadlock with them. The session's ordering lock is taken first, in
# the same statement (``events.order_lock_sql``). Whether the session still has a live runtime is
# read here too (the one rule in SQL, ``models.live_runtime_sql``).
def lock_run_sql(*columns: str) -> str:
    """The run lock, selecting ``state, checkpoint_count, session_id, project_id, status,
    runtime_live, token_valid`` (a recalled caller's token checked again, ``access.
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


def current_authority_sql(alias: str) -> str:
    """The project's current authority refs of the locked row ``alias`` as the JSON object the
    checkpoint stores (``Project.authority_ref()``'s keys)."""
    return "jsonb_build_object({})".format(", ".join(f"'{f}', {alias}.{f}" for f in _AUTHORITY_FIELDS))


#: The refusals of a step written on a locked run, most fundamental first. This CASE is the only
#: place they are decided, for the single checkpoint, the batch and the graph put alike;
#: ``refusal`` maps each code to its catalogued error. ``%(stated_authority)s`` is a JSON array
#: of the authority refs each checkpoint states (``{}``: none); ``stale_item`` is the index of
#: the first one that is not the project's current authority. JSON containment is equality of
#: each stated ref's scalar value (typed by ``rt.validate_authority_refs``).
_REFUSAL_CASE = """CASE
  WHEN NOT l.token_valid THEN 'token_changed'
  WHEN l.state <> %(open)s THEN 'run_not_open'
  WHEN NOT l.runtime_live AND %(acts_for_runtime)s THEN 'no_live_runtime'
  WHEN st.stale_item IS NOT NULL THEN 'stale_authority'
END"""
REFUSAL_CODES = ("token_changed", "run_not_open", "no_live_runtime", "stale_authority")


def decided_lock_sql(*columns: str) -> str:
    """``lock_run_sql(*columns)`` with two more columns: ``stale_item`` and ``refusal``
    (``_REFUSAL_CASE``, NULL when the step may be written)."""
    names = ("state", "checkpoint_count", "session_id", "project_id", "status", "runtime_live", "token_valid",
             *(f"c{i}" for i in range(len(columns))), *_AUTHORITY_FIELDS)
    return f"""
SELECT l.*, st.stale_item, {_REFUSAL_CASE} AS refusal
  FROM ({lock_run_sql(*columns)}) AS l ({", ".join(names)}),
       LATERAL (SELECT min(a.i) - 1 AS stale_item
                  FROM jsonb_array_elements(%(stated_authority)s::jsonb) WITH ORDINALITY AS a(refs, i)
                 WHERE NOT {current_authority_sql("l")} @> a.refs) AS st
"""


class Locked(NamedTuple):
    """The locked run as ``decided_lock_sql`` read it (one extra column: ``extra``)."""

    state: str
    checkpoint_count: int
    session_id: int
    project_id: int
    status: str
    runtime_live: bool
    token_valid: bool
    extra: Any
    current: dict[str, Any]
    stale_item: int | None
    refusal: str | None

    @classmethod
    def of(cls, row: tuple[Any, ...]) -> "Locked":
        n = len(_AUTHORITY_FIELDS)
        authority = row[8:8 + n]
        return cls(*row[:8], dict(zip(_AUTHORITY_FIELDS, authority)), row[8 + n], row[9 + n])


def _stale(locked: Locked, stated: list[dict[str, Any] | None]) -> StaleAuthority:
    refs = stated[locked.stale_item or 0] or {}
    current = locked.current
    differing = {k: {"stated": v, "current": current.get(k)} for k, v in refs.items() if v != current.get(k)}
    return StaleAuthority("the checkpoint was frozen against outdated authority", differences=differing)


#: Each code of ``_REFUSAL_CASE`` and the catalogued error it answers (details read off the row).
_REFUSAL_ERRORS: dict[str, Callable[[Locked, list[dict[str, Any] | None], str], ServiceError]] = {
    "token_changed": lambda locked, stated, what: Unauthorized("the token changed while this request was answered"),
    "run_not_open": lambda locked, stated, what: RunNotOpen(f"{what} are written by an open run", state=locked.state),
    "no_live_runtime": lambda locked, stated, what: runtime_gone(locked.session_id, locked.status),
    "stale_authority": lambda locked, stated, what: _stale(locked, stated),
}
assert set(_REFUSAL_ERRORS) == set(REFUSAL_CODES), "every refusal the statement decides has its error"


def refusal(locked: Locked, stated: list[dict[str, Any] | None], *, what: str = "checkpoints") -> ServiceError | None:
    """The catalogued error for the statement's decision on ``locked`` (``None``: none).
    ``stated``: the authority refs each checkpoint stated, as passed to ``lock_params``."""
    if locked.refusal is None:
        return None
    return _REFUSAL_ERRORS[locked.refusal](locked, stated, what)


def lock_params(caller: Caller, run_id: int, stated: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The parameters of ``decided_lock_sql`` (the single write's and the batch's)."""
    return {"id": run_id, "projects": list(caller.project_ids), "bound": caller.session_id, "now": timezone.now(),
            "open": rt.RunState.OPEN.value, "acts_for_runtime": acts_for_runtime(caller),
            "stated_authority": _dumps([refs or {} for refs in stated]),
            **LIVE_RUNTIME_PARAMS, **recheck_params(caller)}


#: A write statement's CTE ``h`` holding the graph blobs it cites (``%(blobs)s``) until it
#: commits (``actions.artifacts.HOLD_BLOBS_SQL``), and the condition that every one of them is
#: still there: its ``w`` writes nothing otherwise, and the action names the blobs that went
#: (``collected_refs_error``). Only a statement that cites a graph blob carries them.
HOLD_CTE = f"h AS MATERIALIZED ({HOLD_BLOBS_SQL})"
ALL_HELD = "(SELECT count(*) FROM h) = cardinality(%(blobs)s::bigint[])"

# Every single checkpoint, keyed or not, with refs or without, is ONE statement run as its own
# transaction (``commit.execute_write``): one round trip. In order:
#   l  the run lock and the decision (``decided_lock_sql``), the checkpoint's id drawn;
#   k  the checkpoint this idempotency key already names, as the statement's snapshot sees it;
#   h  (``holds``: the checkpoint cites graph blobs) those blobs, held until it commits;
#   w  the run, when nothing refuses, the caller's refs resolved (``%(write)s``), no replay and
#      (``holds``) every cited graph blob still there;
#   c  the checkpoint, numbered from the locked row (READ COMMITTED re-reads a row it waited
#      for, so the count is the committed one); a same-key writer that committed while this
#      statement waited for the lock is not in k's snapshot, but its row is in the unique
#      index, so the insert does nothing (ON CONFLICT) and ``record_checkpoint`` reads it;
#   u  the run's count and cursor; e  the checkpoint's event, from w and c;
#   b  (``Beside``, a caller's) a row that goes with the checkpoint, from c.
# A refusal writes nothing: every write selects from w.
@functools.cache
def _write_sql(beside: str | None, holds: bool = False) -> str:
    """The single checkpoint's statement; with ``beside``, its ``b`` CTE too and b's id last;
    ``holds``: its ``h`` CTE (``%(blobs)s``) (built once per text: a handful of constants)."""
    b_cte = f", b AS (\n  {beside}\n)" if beside else ""
    b_column = ", (SELECT id FROM b)" if beside else ""
    h_cte = f"\n{HOLD_CTE}," if holds else ""
    all_held = f" AND {ALL_HELD}" if holds else ""
    return f"""
WITH l AS ({decided_lock_sql(f"nextval(pg_get_serial_sequence('{Checkpoint._meta.db_table}', 'id'))")}),
k AS (
  SELECT x.id, x.request_digest FROM {Checkpoint._meta.db_table} AS x
   WHERE %(key)s::text IS NOT NULL AND x.run_id = %(id)s AND x.idempotency_key = %(key)s
),{h_cte} w AS (
  SELECT * FROM l WHERE l.refusal IS NULL AND %(write)s AND NOT EXISTS (SELECT FROM k){all_held}
), c AS (
  INSERT INTO {Checkpoint._meta.db_table}
    (id, session_id, run_id, seq, boundary, cursor, artifacts, authority, pending, approvals, resume_policy,
     schema_version, size_bytes, created_at, idempotency_key, request_digest)
  SELECT w.c0, w.session_id, %(id)s, w.checkpoint_count + 1, %(boundary)s, %(cursor)s::jsonb, %(artifacts)s::jsonb,
         {current_authority_sql("w")}, %(pending)s::jsonb, %(approvals)s::jsonb, %(resume_policy)s, %(schema_version)s,
         %(size_bytes)s, %(created_at)s, %(key)s, %(digest)s
    FROM w
  ON CONFLICT (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
  RETURNING id, seq
), u AS (
  UPDATE {Run._meta.db_table} AS r SET checkpoint_count = c.seq, cursor = %(cursor)s::jsonb FROM c WHERE r.id = %(id)s
), e AS (
  INSERT INTO {Event._meta.db_table} (project_id, session_id, run_id, type, payload, actor, created_at)
  SELECT w.project_id, w.session_id, %(id)s, %(ev_type)s,
         %(ev_payload)s::jsonb || jsonb_build_object('checkpoint_id', c.id, 'seq', c.seq), %(ev_actor)s, now()
    FROM w, c
  RETURNING id
){b_cte}
SELECT l.*, (SELECT id FROM k), (SELECT request_digest FROM k), (SELECT id FROM e){b_column} FROM l
"""


_WRITE_SQL = _write_sql(None)


@dataclass(frozen=True)
class Beside:
    """A row written with a checkpoint, in its statement: one round trip for both, and the row
    only when the checkpoint is (a refusal or a replay writes neither). ``insert`` is an
    ``INSERT … SELECT … FROM c … RETURNING id`` where ``c`` is the checkpoint inserted (its ``id``
    and ``seq``); ``%(created_at)s`` is the checkpoint's time. Its id comes back as the
    checkpoint's ``beside_id``. A graph put's graph row goes so (``control/graphs.py``)."""

    insert: str
    params: Mapping[str, Any]


#: The event payload's fields the statement fills (it draws the id and counts the seq).
_FILLED = frozenset({"checkpoint_id", "seq"})

# The run's session and project in the caller's reach, for resolving refs before the write
# (scoped exactly as the lock is).
_SCOPE_SQL = f"""
SELECT r.session_id, s.project_id
  FROM {Run._meta.db_table} AS r JOIN {Session._meta.db_table} AS s ON s.id = r.session_id
 WHERE r.id = %(id)s AND s.project_id = ANY(%(projects)s) AND (%(bound)s::bigint IS NULL OR s.id = %(bound)s::bigint)
"""


def run_scope(caller: Caller, run_id: int) -> tuple[int, int] | None:
    """(session id, project id) of ``run_id`` in the caller's reach (``None``: not found)."""
    with connections[DEFAULT_DB_ALIAS].cursor() as cur:
        cur.execute(_SCOPE_SQL, {"id": run_id, "projects": list(caller.project_ids), "bound": caller.session_id})
        return cur.fetchone()


def _dumps(value: Any) -> str:
    return json.dumps(value, cls=DjangoJSONEncoder)


def request_digest(payload: dict[str, Any]) -> str:
    """sha256 of the body's canonical JSON: what an idempotency key is bound to."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":"), cls=DjangoJSONEncoder).encode()).hexdigest()


@dataclass(frozen=True)
class ResolvedRefs:
    """A checkpoint's artifact refs as the calling action resolved them within its caller's reach
    (a graph thread's own state blobs), under the lock of the run's session: that session, its
    project, and each (artifact id, fingerprint)'s head version. ``record_checkpoint`` then runs
    no statement of its own for the refs."""

    session_id: int
    project_id: int
    heads: Mapping[tuple[int, str], int | None]


def record_checkpoint(caller: Caller, run_id: int, payload: dict[str, Any], *,
                      resolved: ResolvedRefs | None = None, beside: Beside | None = None) -> Checkpoint:
    """Validate (pure) then write checkpoint N+1 of an open run: ONE statement (``_WRITE_SQL``),
    its own transaction, whether or not it carries an idempotency key or refs.

    With an ``idempotency_key``, a retry (same key, same body) returns the checkpoint the first
    request wrote, with ``replayed = True`` and nothing written, even if the run has ended since
    (the first outcome stands); the same key with another body is ``idempotency_key_reused``.
    Concurrent retries of one key leave one row: the run lock orders them and the unique index
    turns the later ones into replays.

    Refusals, most fundamental first: not found → (a replay answers here, writing nothing) →
    the token changed (a recalled token, ``apikit/auth.py``) → ``run_not_open`` →
    ``no_live_runtime`` (a write on a runtime's behalf once the session's runtime is gone) →
    ``stale_authority`` → the refs. All but the first and the last are decided by the statement
    (``_REFUSAL_CASE``).

    The authority refs are the project's *current* ones, read by the server; a client that
    states other refs is refused with ``stale_authority`` (it froze against an old Canon).
    Every artifact ref must name a real version of an artifact in this project within the
    caller's reach (``require_versions``: out of reach answers as missing; ``resolved``:
    the calling action resolved them and their heads in the caller's reach itself, a graph
    thread's own state blobs); each is stored with its artifact's head at that moment
    (``artifact_refs``). Approval
    and pending refs are typed (pure core) and resolved before the statement, then stored
    normalized (``_resolve_approvals``, the wait kinds of ``control/waits.py``): a ref that does
    not resolve is a 422 naming its field, and nothing is written. A checkpoint without refs runs
    no query for them.

    ``beside``: a row the statement inserts with the checkpoint (:class:`Beside`); its id is the
    returned checkpoint's ``beside_id``.
    """
    caller.require("write")
    spec = check(
        rt.validate_checkpoint, payload, max_bytes=settings.CHECKPOINT_MAX_BYTES, pending_keys=waits.pending_keys(),
    )
    if not 0 < run_id <= BIGINT_MAX:  # a larger id names no row (as the ORM would say), never a 500
        raise NotFound("run not found", run_id=run_id)
    artifacts: list[dict[str, Any]] = []
    approvals: list[Any] = []
    pending: dict[str, Any] = {}
    blobs: list[int] = []
    refs_error: ServiceError | None = None
    session_id = project_id = None
    if resolved is not None:
        session_id, project_id = resolved.session_id, resolved.project_id
    elif spec.artifacts or spec.approvals or any(spec.pending.values()):
        scope = run_scope(caller, run_id)
        if scope is None:
            raise NotFound("run not found", run_id=run_id)
        session_id, project_id = scope
    try:  # held until the statement has decided: a more fundamental refusal (or a replay) wins
        if resolved is not None:
            artifacts = [{"artifact_id": r.artifact_id, "fingerprint": r.fingerprint,
                          "head_version_id": resolved.heads[(r.artifact_id, r.fingerprint)]} for r in spec.artifacts]
        else:
            artifacts, blobs = artifact_refs(caller, project_id, spec.artifacts)
        approvals = _resolve_approvals(caller, project_id, spec.approvals) if spec.approvals else []
        pending = (waits.resolve_pending(waits.WriteScope(project_id, session_id, run_id), spec.pending)
                   if spec.pending else {})
    except ServiceError as exc:
        refs_error = exc
    key = spec.idempotency_key
    digest = request_digest(payload) if key is not None else None
    created_at = timezone.now()  # the application's clock, which resume compares
    event = events.stage_in_locking_statement(
        type=ev.CHECKPOINT_RECORDED, filled=_FILLED, actor=caller.label,
        payload={"boundary": spec.boundary.value, "cursor": spec.cursor},
    )
    row = commit.execute_write(_write_sql(beside.insert if beside is not None else None, bool(blobs)), {
        **lock_params(caller, run_id, [spec.authority]), "key": key, "digest": digest, "write": refs_error is None,
        "blobs": blobs,
        "boundary": spec.boundary.value, "cursor": _dumps(spec.cursor), "artifacts": _dumps(artifacts),
        "pending": _dumps(pending), "approvals": _dumps(approvals), "resume_policy": spec.resume_policy,
        "schema_version": rt.CHECKPOINT_SCHEMA_VERSION, "size_bytes": spec.size_bytes, "created_at": created_at,
        **event, **(beside.params if beside is not None else {}),
    })
    if row is None:
        raise NotFound("run not found", run_id=run_id)
    beside_id = None
    if beside is not None:
        row, beside_id = row[:-1], row[-1]
    locked = Locked.of(row[:-3])
    replay_id, replay_digest, event_id = row[-3:]
    if locked.refusal == "token_changed":  # before the replay: a changed token is answered afresh (apikit/auth.py)
        raise refusal(locked, [spec.authority])
    token_confirmed(caller, True)  # a recalled caller's token: the statement found it unchanged
    if key is not None and event_id is None:
        # A replay: the one this statement saw, or one committed while it waited for the run lock
        # (then the insert found its key taken, or a refusal hid it: replays win over refusals).
        first = _first_with_key(run_id, key) if replay_id is None else (replay_id, replay_digest)
        if first is not None:
            replayed = _replay(run_id, key, digest, *first)
            replayed.beside_id = None  # a replay writes nothing, beside rows included
            return replayed
    refused = refusal(locked, [spec.authority])
    if refused is not None:
        raise refused
    if refs_error is not None:
        raise refs_error
    if event_id is None:
        # A cited graph blob was collected after it was resolved (nothing written), or the key's
        # checkpoint vanished between the statement and its read (its session was forgotten).
        raise collected_refs_error("artifact refs", artifacts, gone_blobs(blobs)) or NotFound("run not found", run_id=run_id)
    events.recorded(events.Staged({}, locked.project_id, locked.session_id, run_id, ev.CHECKPOINT_RECORDED.name,
                                  caller.label), event_id)
    checkpoint = Checkpoint(
        id=locked.extra, session_id=locked.session_id, run_id=run_id, seq=locked.checkpoint_count + 1,
        boundary=spec.boundary.value, cursor=spec.cursor, artifacts=artifacts, authority=locked.current,
        pending=pending, approvals=approvals, resume_policy=spec.resume_policy, size_bytes=spec.size_bytes,
        created_at=created_at, idempotency_key=key, request_digest=digest,
    )
    checkpoint._state.adding = False
    checkpoint.replayed = False
    checkpoint.beside_id = beside_id
    return checkpoint


def _first_with_key(run_id: int, key: str) -> tuple[int, str] | None:
    """The checkpoint of ``run_id`` that ``key`` names, as committed now (a new snapshot)."""
    found = Checkpoint.objects.filter(run_id=run_id, idempotency_key=key).values_list("id", "request_digest").first()
    return None if found is None else (found[0], found[1])


def _replay(run_id: int, key: str, digest: str | None, checkpoint_id: int, first_digest: str) -> Checkpoint:
    """The first outcome of ``key`` stands: the same body gets its checkpoint again, another body
    ``idempotency_key_reused``."""
    if first_digest != digest:
        raise IdempotencyKeyReused(
            "this idempotency key already names another checkpoint of this run", checkpoint_id=checkpoint_id,
        )
    first = Checkpoint.objects.get(id=checkpoint_id)
    first.replayed = True
    return first


def artifact_refs(reach: Caller | None, project_id: int,
                  refs: tuple[rt.ArtifactRef, ...]) -> tuple[list[dict[str, Any]], list[int]]:
    """Resolve a checkpoint's artifact refs (``require_versions``: within ``reach``, one
    statement; none without refs) and store each as ``{"artifact_id", "fingerprint",
    "head_version_id"}``: the version the checkpoint froze, and its artifact's head (current
    version) when it froze it. A frozen candidate is often not its artifact's head (making it
    current is a write intent): resume fails the ref only when the head moved since. With them,
    the cited graph blobs, which the write statement holds (``HOLD_CTE``)."""
    if not refs:
        return [], []
    heads = require_versions(reach, project_id, ((r.artifact_id, r.fingerprint) for r in refs), what="artifact refs",
                             hold=False)
    return [{"artifact_id": r.artifact_id, "fingerprint": r.fingerprint,
             "head_version_id": heads[(r.artifact_id, r.fingerprint)]} for r in refs], heads.blobs


def collected_refs_error(what: str, artifacts: list[dict[str, Any]], gone: set[int]) -> ServiceError | None:
    """The refusal of the refs among ``artifacts`` whose graph blob is in ``gone``
    (``gone_blobs``: collected after they were resolved, so the statement holding them wrote
    nothing); the same answer as a ref that was never there. None if no ref's blob went."""
    missing = sorted({(r["artifact_id"], r["fingerprint"]) for r in artifacts if r["artifact_id"] in gone})
    return unknown_versions(what, missing) if missing else None


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
