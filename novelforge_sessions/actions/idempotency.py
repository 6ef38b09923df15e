"""Idempotency keys of the agent writes that create something (docs/agents.md#idempotency-keys).

Start a run, attach a runtime, a batch, a handoff and opening a review gate take an optional
client-chosen ``idempotency_key``. Its contract is the checkpoint's (``control/checkpoints.py``):
the same key with the same body answers what the first request answered (its status and the
object it created, as it is now), writing nothing and appending no event; the same key with
another body is ``idempotency_key_reused``. A key is scoped to the parent named in the request's
path: the session (start a run, attach, open a gate) or the run (a batch, a handoff).

How, with one rule for all five (:func:`once`):

1. the key's row, if committed already, answers at once (within the caller's reach: a key in
   another project or session answers nothing, and the write then refuses as it would);
2. otherwise the write runs, and its ``IdempotentRequest`` row is inserted in the same
   transaction, after the write's locks (so the session's ordering lock stays the transaction's
   first lock, ``events.order_lock``);
3. a concurrent retry that got past 1 either waited on the write's own locks and now refuses
   (a run is open, a runtime is live…) or writes again; its key insert then meets the committed
   row in the unique index (``ON CONFLICT DO NOTHING``, which waits for an in-flight insert of
   the same key and then sees its outcome). Either way its transaction is rolled back and the
   committed row answers: the first outcome stands, even over a refusal decided since.

No Python lock: the unique index ``idempotent_request_key_unique`` decides who was first.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import TOKEN_STILL_VALID_SQL, Caller, recheck_params, token_confirmed
from novelforge_sessions.errors import IdempotencyKeyReused, NotFound, ServiceError, ValidationFailed
from novelforge_sessions.models import IdempotentRequest, KeyedOperation

T = TypeVar("T")


@dataclass(frozen=True)
class Key:
    """A checked key and what it is bound to: its operation, its parent and the body's digest."""

    operation: KeyedOperation
    scope_id: int
    key: str
    digest: str


@dataclass(frozen=True)
class Answer:
    """The first answer a key recorded: its status and what rebuilds it."""

    status: int
    data: dict[str, Any]


def digest(body: Any) -> str:
    """sha256 of the body's canonical JSON (the checkpoint's ``request_digest``)."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), cls=DjangoJSONEncoder)
    return hashlib.sha256(text.encode()).hexdigest()


def key_for(operation: KeyedOperation, scope_id: int, key: str | None, body: Any) -> Key | None:
    """``key`` checked (422 naming ``idempotency_key``) and bound to ``body``; ``None`` without one."""
    if key is None:
        return None
    if not isinstance(key, str) or not rt.IDEMPOTENCY_KEY_RE.match(key):
        raise ValidationFailed("idempotency_key must be 1–200 printable ASCII characters, no spaces",
                               field="idempotency_key")
    return Key(operation, scope_id, key, digest(body))


def first_answer(caller: Caller, key: Key) -> Answer | None:
    """The committed first answer of ``key`` within the caller's reach (a new snapshot); the same
    key with another body is ``idempotency_key_reused``."""
    found = (
        IdempotentRequest.objects.filter(operation=key.operation, scope_id=key.scope_id, key=key.key,
                                         session__in=caller.sessions())
        .values_list("request_digest", "status", "answer").first()
    )
    if found is None:
        return None
    if caller.recheck is not None:
        # A recalled caller (apikit/auth.py): a replay answers only a token that still says the same.
        with connection.cursor() as cur:
            cur.execute(f"SELECT {TOKEN_STILL_VALID_SQL}", recheck_params(caller))
            token_confirmed(caller, bool(cur.fetchone()[0]))
    first_digest, status, data = found
    if first_digest != key.digest:
        raise IdempotencyKeyReused("this idempotency key already names another request", key=key.key,
                                   operation=key.operation.value)
    return Answer(status, data)


class _Taken(Exception):
    """The key's row was committed by another request while this one wrote: roll back, replay."""


def once(caller: Caller, key: Key | None, write: Callable[[], tuple[T, int, Answer]],
         replay: Callable[[Answer], T]) -> T:
    """Run ``write`` at most once per key (see the module doc).

    ``write`` returns (its result, the session it wrote in, the answer to record); ``replay``
    rebuilds a result from a recorded answer. Without a key, ``write`` simply runs."""
    if key is None:
        return write()[0]
    first = first_answer(caller, key)
    if first is not None:
        return replay(first)
    try:
        with transaction.atomic():
            result, session_id, answer = write()
            if not _remember(key, session_id, answer):
                raise _Taken
        return result
    except _Taken:
        pass
    except ServiceError:
        # A concurrent request with this key committed while this one waited for its locks:
        # the first outcome stands over what this one decided.
        first = first_answer(caller, key)
        if first is None:
            raise
        return replay(first)
    first = first_answer(caller, key)
    if first is None:  # the row vanished between the insert and this read: its session was forgotten
        raise NotFound("not found", operation=key.operation.value)
    return replay(first)


def _remember(key: Key, session_id: int, answer: Answer) -> bool:
    """Insert the key's row in the current transaction; False when the key is taken (a committed
    row, or one in flight that then commits: the insert waits for it)."""
    table = IdempotentRequest._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {table} (session_id, operation, scope_id, key, request_digest, status, answer, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, now())"
            " ON CONFLICT (operation, scope_id, key) DO NOTHING RETURNING id",
            [session_id, key.operation.value, key.scope_id, key.key, key.digest, answer.status,
             json.dumps(answer.data, cls=DjangoJSONEncoder)],
        )
        return cur.fetchone() is not None
