"""Bearer-token authentication for agents (django-ninja security class).

The token is hashed and looked up in one indexed read; ``last_used_at`` is refreshed at most
once per ``TOKEN_LAST_USED_RESOLUTION_SECONDS`` by a conditional UPDATE, so a busy agent's
requests stay read-only on the auth path (docs/model.md#one-transaction-per-write). Tokens never appear in logs.

**Recalled callers** (``RECALL``: the checkpoint and batch writes and the graph put and
writes, the hottest routes). The lookup is a round trip of its own, on the routes an agent calls most. On these
routes a token looked up in the last ``TOKEN_RECALL_SECONDS`` is recalled from this process's
memory (keyed by its hash, never the token) as a ``Caller`` whose
``recheck`` holds what the token's row said; the action checks that row again in its own first
statement, the run lock that it runs anyway (``access.TOKEN_STILL_VALID_SQL``), so the token is
checked in every request, in the statement that takes the lock its write needs, one round trip
fewer. Whatever the row no longer says (revoked, deleted, rebound, other permissions, renamed),
and whatever a recalled caller is refused for (any 4xx, even a 422 for its body), the request is
answered again from the start with a token read from the database (``answered_with_a_fresh_token``
in ``api/__init__.py``): the answer is always the one a fresh lookup gives, 401 first. A refusal
writes nothing, so answering again repeats no effect; a success counts only if the action
confirmed the token (``access.token_confirmed``).
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import timedelta

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Q
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer

from novelforge_sessions.access import Caller, TokenRow, token_label
from novelforge_sessions.models import ApiToken, Project


_T, _P = ApiToken._meta.db_table, Project._meta.db_table
#: Every project field, so the Caller carries a complete Project (writes use it as their FK).
_PROJECT_FIELDS = Project._meta.concrete_fields
# The auth path runs on every request: one SQL statement instead of an ORM query with
# select_related, whose construction would cost more CPU than the lookup itself.
_LOOKUP_SQL = (
    f"SELECT t.id, t.name, t.session_id, t.permissions, t.last_used_at, "
    f"{', '.join(f'p.{f.column}' for f in _PROJECT_FIELDS)} "
    f"FROM {_T} t JOIN {_P} p ON p.id = t.project_id WHERE t.key_hash = %s AND t.revoked_at IS NULL"
)


def _is_token(raw: str) -> bool:
    """Every token the service issues is ASCII (``nfs_`` and URL-safe base64): anything else (a
    websocket ``auth`` frame's JSON string may hold an unpaired surrogate, which has no UTF-8
    form to hash) is simply not a token, refused like any unknown one."""
    return bool(raw) and len(raw) <= 200 and raw.isascii()


def caller_for_token(raw: str) -> Caller | None:
    """The caller a raw token stands for, or None (unknown, revoked, or not a token at all)."""
    found = _look_up(ApiToken.hash_key(raw)) if _is_token(raw) else None
    return None if found is None else found[0]


def _look_up(key: str) -> tuple[Caller, TokenRow] | None:
    db = connections[DEFAULT_DB_ALIAS]  # once: each use of the ``connection`` proxy is a thread-local lookup
    with db.cursor() as cur:
        cur.execute(_LOOKUP_SQL, [key])
        row = cur.fetchone()
    if row is None:
        return None
    token_id, name, session_id, permissions, last_used_at, *project_values = row
    project = Project.from_db(db.alias, [f.attname for f in _PROJECT_FIELDS], project_values)
    now = timezone.now()
    stale_before = now - timedelta(seconds=settings.TOKEN_LAST_USED_RESOLUTION_SECONDS)
    if last_used_at is None or last_used_at < stale_before:
        ApiToken.objects.filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=stale_before), id=token_id).update(
            last_used_at=now
        )
    caller = Caller(
        label=token_label(name, token_id),  # fits every actor column, whatever the admin allowed
        project_ids=frozenset({project.id}),
        permissions=frozenset(permissions if isinstance(permissions, list) else json.loads(permissions)),
        session_id=session_id,
        token_id=token_id,
        project=project,
    )
    stored = permissions if isinstance(permissions, str) else json.dumps(permissions)
    return caller, TokenRow(token_id=token_id, project_id=project.id, session_id=session_id, permissions=stored, name=name)


#: Recalled callers by token hash: (monotonic time until which it is recalled, the caller).
_RECALLED: dict[str, tuple[float, Caller]] = {}
#: More distinct tokens than this in one window and the memory starts over (each refills on use).
RECALL_MAX_TOKENS = 4096


def recalled_caller(raw: str, *, fresh: bool = False) -> Caller | None:
    """``caller_for_token``, recalled when this process looked the token up in the last
    ``TOKEN_RECALL_SECONDS`` (then with ``recheck`` set: the action checks it in its statement).

    ``fresh``: look it up now (and remember that answer instead). A token that is no token, or
    that the lookup does not find, is forgotten and refused."""
    if not _is_token(raw):
        return None
    key = ApiToken.hash_key(raw)
    now = time.monotonic()
    if not fresh:
        hit = _RECALLED.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
    found = _look_up(key)
    if found is None:
        _RECALLED.pop(key, None)
        return None
    caller, row = found
    seconds = settings.TOKEN_RECALL_SECONDS
    if seconds > 0:
        if len(_RECALLED) >= RECALL_MAX_TOKENS:
            _RECALLED.clear()
        # The project is not kept: a recalled caller's project could have changed since, and the
        # actions that accept one read what they need of it in their statement.
        _RECALLED[key] = (now + seconds, replace(caller, project=None, recheck=row))
    return caller


def forget_recalled() -> None:
    """Forget every recalled caller (tests; a process that wants every token looked up again)."""
    _RECALLED.clear()


class TokenAuth(HttpBearer):
    """``recall``: this route's action checks a recalled caller's token in its own statement
    (module docstring); every other route looks the token up on every request."""

    openapi_description = "An API token (`nfs_…`) from `manage.py create_api_token` or the admin."

    def __init__(self, *, recall: bool = False) -> None:
        super().__init__()
        self.recall = recall

    def authenticate(self, request: HttpRequest, token: str) -> Caller | None:
        if self.recall:
            return recalled_caller(token, fresh=getattr(request, FRESH_TOKEN_ATTR, False))
        return caller_for_token(token)


#: The auth of the routes whose actions check a recalled token in their first statement: the
#: checkpoint and batch writes (the run lock), the graph put and writes (the thread's lock).
RECALL = TokenAuth(recall=True)

#: Set on a request answered again after a recalled caller's refusal: look the token up.
FRESH_TOKEN_ATTR = "_novelforge_fresh_token"
