"""Who is calling, and what they may see (docs/model.md#access).

A :class:`Caller` is built at the edge — from a bearer token (agents) or from a logged-in
user's memberships (managers) — and handed to actions. Every object lookup goes through
``caller.sessions()``/``caller.projects()`` so an id from another project is simply not
found (404, never 403: ids are not an oracle).

A token bound to one session (``ApiToken.session``) is that session's identity: it sees and
touches only what its session owns or was given. :data:`BOUND_TOKEN_MATRIX` is the one table of
what that means per object kind; every API lookup of a kind goes through :meth:`Caller.scope`,
which applies it. The permission ``project`` ("project-wide despite the binding") lifts the
limit for the project-level kinds the table marks ``widened`` (artifacts, write intents,
authority history); the session-level kinds stay the session's own whatever the permissions.
"""
from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from enum import StrEnum
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db.models import QuerySet
from django.db.models.expressions import RawSQL

from novelforge_sessions.errors import Forbidden, NotFound, Unauthorized
from novelforge_sessions.models import ApiToken, Membership, Project, Session


#: PostgreSQL's bigint: a named id beyond it names no row (and must not reach the query as one).
_BIGINT_MAX = 2**63 - 1

#: The permission that widens a bound token's reach to the whole project (project-level kinds only).
PROJECT_WIDE = "project"


class Reach(StrEnum):
    """What a session-bound token reaches of one object kind."""

    PROJECT = "project"  # the whole project (the token's own project record)
    OWN_SESSION = "own_session"  # rows of its own session only (``path`` leads to the session id)
    GIVEN_ARTIFACTS = "given_artifacts"  # artifacts its session created or was given (``path`` → artifact id)
    ASSIGNED_PACKETS = "assigned_packets"  # review packets assigned to it or claimable by it (reviews.access)
    NOTHING = "nothing"  # none: lists are empty, ids are 404


@dataclass(frozen=True)
class Rule:
    bound: Reach
    path: str = ""  # the queryset lookup the rule filters on
    widened: bool = False  # the ``project`` permission lifts the limit
    note: str = ""


#: The bound-token matrix (docs/api.md#session-bound-tokens): object kind → what a token bound to a
#: session reaches. An unbound token reaches its whole project for every kind. Objects outside the
#: reach are 404 on reads and writes alike, and lists leave them out.
BOUND_TOKEN_MATRIX: dict[str, Rule] = {
    "project": Rule(Reach.PROJECT, note="its own project (current authority, framework)"),
    "session": Rule(Reach.OWN_SESSION, "id", note="its own session"),
    # Creating a session (POST /sessions, or opening a graph thread, which opens one): a bound
    # token is its session and makes no other — nor live runtimes declaring whatever it likes,
    # which routing and resume would count for other sessions' work. 403 forbidden, whatever the
    # permissions (``project`` widens reads of project-level kinds, not this).
    "new_session": Rule(Reach.NOTHING, note="none: creating sessions is an unbound token's job (403)"),
    "transcript": Rule(Reach.OWN_SESSION, "session_id", note="its session's transcript"),
    "runtime": Rule(Reach.OWN_SESSION, "session_id", note="its session's runtimes"),
    "run": Rule(Reach.OWN_SESSION, "session_id", note="its session's runs"),
    "checkpoint": Rule(Reach.OWN_SESSION, "session_id", note="its session's checkpoints"),
    "handoff": Rule(Reach.OWN_SESSION, "session_id", note="handoffs its session made, with deliveries"),
    "receipt": Rule(Reach.OWN_SESSION, "session_id", note="receipts of its session's handoffs"),
    "event": Rule(Reach.OWN_SESSION, "session_id", note="events of its session"),
    "review_gate": Rule(Reach.OWN_SESSION, "session_id", note="gates its session opened"),
    "graph_thread": Rule(Reach.OWN_SESSION, "session_id", note="its session's graph thread, with its checkpoints and writes"),
    "binding": Rule(Reach.OWN_SESSION, "id", note="its own session's binding"),
    "routing": Rule(Reach.OWN_SESSION, "session_id", note="its own session's live runtimes"),
    "review_packet": Rule(Reach.ASSIGNED_PACKETS, note="packets assigned to its session or claimable by it"),
    "artifact": Rule(Reach.GIVEN_ARTIFACTS, "id", widened=True,
                     note="artifacts its session created, or its runs, checkpoints, handoffs or gates cite"),
    "artifact_version": Rule(Reach.GIVEN_ARTIFACTS, "artifact_id", widened=True,
                             note="versions of those artifacts"),
    "write_intent": Rule(Reach.OWN_SESSION, "session_id", widened=True,
                         note="intents its session proposed, with their approvals"),
    "authority_change": Rule(Reach.NOTHING, widened=True, note="none"),
}


def token_label(name: str, token_id: int) -> str:
    """A token's actor label (every event, ``created_by``): fits every actor column. The reach
    of a bound token (``_given_sql``) builds the same label in SQL."""
    return f"token:{name[:100]}#{token_id}"


def artifact_ids_in(refs: Any) -> set[int]:
    """Artifact ids cited by a list of ``{"artifact_id": …}`` refs (frozen inputs, checkpoint refs)."""
    found: set[int] = set()
    if isinstance(refs, list):
        for ref in refs:
            if isinstance(ref, dict) and isinstance(ref.get("artifact_id"), int) and not isinstance(ref["artifact_id"], bool):
                found.add(ref["artifact_id"])
    return found


def _cited_ids_sql(table: str, column: str) -> str:
    """Artifact ids the ``column`` ref lists of ``table``'s rows of one session cite: list items
    whose ``artifact_id`` is an integer, as :func:`artifact_ids_in` reads them (no artifact has a
    negative id; the pattern keeps the cast from failing on anything else)."""
    return f"""
SELECT (e.ref ->> 'artifact_id')::bigint
  FROM {table} AS x
 CROSS JOIN LATERAL jsonb_array_elements(
       CASE WHEN jsonb_typeof(x.{column}) = 'array' THEN x.{column} ELSE '[]'::jsonb END) AS e(ref)
 WHERE x.session_id = %s AND jsonb_typeof(e.ref -> 'artifact_id') = 'number'
   AND (e.ref ->> 'artifact_id') ~ '^[0-9]{{1,18}}$'"""


@cache
def _given_sql() -> str:
    """:func:`artifacts_given_to` in SQL: one SELECT of artifact ids, its five ``%s`` the session
    id. It reads every ref list of the session's runs, checkpoints and handoffs (the ids are
    inside JSON), which a list needs; a lookup that names its rows uses :func:`given_among`."""
    from novelforge_sessions.models import ApiToken, ArtifactVersion, Checkpoint, Run

    # the control plane's handoffs and the review gates by their reverse names (no upward import)
    handoff = Session._meta.get_field("handoffs").related_model._meta
    gate = Session._meta.get_field("review_gates").related_model._meta
    versions, tokens = ArtifactVersion._meta.db_table, ApiToken._meta.db_table
    return f"""
SELECT v.artifact_id FROM {versions} AS v JOIN {tokens} AS t
    ON v.created_by = 'token:' || left(t.name, 100) || '#' || t.id::text
 WHERE t.session_id = %s
UNION ALL {_cited_ids_sql(Run._meta.db_table, "frozen_inputs")}
UNION ALL {_cited_ids_sql(Checkpoint._meta.db_table, "artifacts")}
UNION ALL {_cited_ids_sql(handoff.db_table, handoff.get_field("inputs").column)}
UNION ALL
SELECT v.artifact_id FROM {gate.db_table} AS g JOIN {versions} AS v ON v.id = g.{gate.get_field("candidate").column}
 WHERE g.session_id = %s"""


@cache
def _given_among_sql() -> str:
    """:func:`given_among` in SQL: its parameters the named artifact ids, the named version ids
    (``bigint[]`` each), then the session id five times."""
    from novelforge_sessions.models import ApiToken, ArtifactVersion, Checkpoint, Run

    handoff = Session._meta.get_field("handoffs").related_model._meta
    gate = Session._meta.get_field("review_gates").related_model._meta
    versions, tokens = ArtifactVersion._meta.db_table, ApiToken._meta.db_table
    cites = "@> jsonb_build_array(jsonb_build_object('artifact_id', a.id))"

    def cited_by(table: str, column: str) -> str:
        # NOT (… = '[]'): the condition of the table's partial GIN index, spelt as Django spells
        # it (models.CITES_ARTIFACTS, control.models.CITES_INPUTS), so the probe can use it.
        return f"SELECT 1 FROM {table} AS x WHERE x.session_id = %s AND NOT (x.{column} = '[]'::jsonb) AND x.{column} {cites}"

    # One branch per kind of grant, each its own semi-join (an OR of EXISTS would be planned
    # as sub-plans run to their first row, which prefers reading the session's rows in order).
    branches = [
        f"""SELECT 1 FROM {versions} AS v JOIN {tokens} AS t ON v.created_by = 'token:' || left(t.name, 100) || '#' || t.id::text
             WHERE v.artifact_id = a.id AND t.session_id = %s""",
        f"SELECT 1 FROM {Run._meta.db_table} AS x WHERE x.session_id = %s AND x.frozen_inputs {cites}",
        cited_by(Checkpoint._meta.db_table, "artifacts"),
        cited_by(handoff.db_table, handoff.get_field("inputs").column),
        f"""SELECT 1 FROM {gate.db_table} AS g JOIN {versions} AS v ON v.id = g.{gate.get_field("candidate").column}
             WHERE g.session_id = %s AND v.artifact_id = a.id""",
    ]
    named = f"SELECT unnest(%s::bigint[]) UNION SELECT artifact_id FROM {versions} WHERE id = ANY(%s::bigint[])"
    return f"WITH named(id) AS ({named})\n" + "\nUNION ALL ".join(
        f"SELECT a.id FROM named AS a WHERE EXISTS ({branch})" for branch in branches
    )


def given_among(session_id: int, *, artifacts: Iterable[Any] = (), versions: Iterable[Any] = ()) -> RawSQL:
    """Of the artifacts a lookup names — by id (``artifacts``), or as the artifacts of version
    ids (``versions``) — those given to the session (:func:`artifacts_given_to`), as a subquery
    of artifact ids. For lookups that name their rows (a read by id, the versions a write
    cites): each name is checked with one ``EXISTS`` probe per kind of grant, on an index — the
    checkpoints and handoffs that cite it through their partial GIN indexes (``jsonb_path_ops``;
    ``@>`` with ``[{"artifact_id": id}]`` matches exactly the list items :func:`artifact_ids_in`
    reads) — instead of reading every ref the session's checkpoints hold. A name that is no
    artifact id at all is simply not given."""
    def ids(values: Iterable[Any]) -> list[int]:
        return sorted({v for v in values if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= _BIGINT_MAX})

    return RawSQL(_given_among_sql(), [ids(artifacts), ids(versions)] + [session_id] * 5)


def artifacts_given_to(session_id: int) -> RawSQL:
    """Artifacts a session owns or was given, as a subquery of artifact ids (so a scoped lookup
    stays one statement): versions written under a token bound to it (``token_label``), and the
    artifacts its runs' frozen inputs, checkpoints, handoffs and review gates cite. A reviewer's
    packets are not a grant: a blind packet carries what the reviewer may read, nothing more.
    Nor is citing one: every citation is resolved within the citing caller's reach
    (``actions.artifacts.require_versions``), so a bound token cites only what it already reads."""
    return RawSQL(_given_sql(), [session_id] * 5)


@dataclass(frozen=True)
class TokenRow:
    """What a token's row said when a ``Caller`` was read from it (``apikit.auth``), to be checked
    again: the token still exists, unrevoked, with the same project, binding, permissions (the
    stored JSON, compared as jsonb) and name (the actor label)."""
    token_id: int
    project_id: int
    session_id: int | None
    permissions: str
    name: str


@dataclass(frozen=True)
class Caller:
    label: str
    project_ids: frozenset[int]
    permissions: frozenset[str]
    session_id: int | None = None  # a token bound to one session sees only that session
    token_id: int | None = None
    user_id: int | None = None
    project: Project | None = field(default=None, compare=False)  # the token's project, preloaded
    # Set on a caller recalled from the API's token cache (apikit/auth.py) and not yet checked in
    # this request: the action that accepts one checks it in its own first statement (the
    # checkpoint's run lock, ``TOKEN_STILL_VALID_SQL``); everything else never sees one.
    recheck: TokenRow | None = field(default=None, compare=False)

    def require(self, permission: str) -> None:
        if permission not in self.permissions:
            raise Forbidden(f"this caller lacks the '{permission}' permission", permission=permission)

    def projects(self) -> QuerySet[Project]:
        return Project.objects.filter(id__in=self.project_ids)

    def sessions(self) -> QuerySet[Session]:
        return self.scope("session", Session.objects.filter(project_id__in=self.project_ids))

    def bound_for(self, kind: str) -> Rule | None:
        """The matrix rule limiting this caller for ``kind``, or None when it reaches the whole project."""
        if self.session_id is None:
            return None
        rule = BOUND_TOKEN_MATRIX[kind]
        if rule.bound == Reach.PROJECT or (rule.widened and PROJECT_WIDE in self.permissions):
            return None
        return rule

    def scope(
        self, kind: str, qs: QuerySet, *, artifacts: Iterable[Any] | None = None, versions: Iterable[Any] | None = None,
    ) -> QuerySet:
        """``qs`` (already limited to the caller's projects) limited by the bound-token matrix.

        ``artifacts`` / ``versions``: the artifact or version ids the lookup names (a read by id,
        the versions a write cites; every row it can return is among them). A bound token's given
        artifacts are then checked name by name (:func:`given_among`, index probes) instead of
        as the session's whole reach (:func:`artifacts_given_to`, which a list needs)."""
        rule = self.bound_for(kind)
        if rule is None:
            return qs
        if rule.bound == Reach.OWN_SESSION:
            if kind == "event":  # the log's reads stay on the (session_id, …, id) indexes: models.AnyId
                return qs.filter(**{f"{rule.path}__any": [self.session_id]})
            return qs.filter(**{rule.path: self.session_id})
        if rule.bound == Reach.GIVEN_ARTIFACTS:
            if artifacts is not None or versions is not None:
                named = given_among(self.session_id, artifacts=artifacts or (), versions=versions or ())
                return qs.filter(**{f"{rule.path}__in": named})
            return qs.filter(**{f"{rule.path}__in": artifacts_given_to(self.session_id)})  # a subquery: no extra statement
        if rule.bound == Reach.NOTHING:
            return qs.none()
        raise ValueError(f"{kind}: {rule.bound} is applied by its own module")  # review packets: reviews.access

    def sees_session(self, session: Session) -> bool:
        return session.project_id in self.project_ids and (self.session_id in (None, session.id))

    def single_project(self) -> Project:
        """The project a write lands in: a token's own project."""
        if self.project is not None:
            return self.project
        if len(self.project_ids) == 1:
            return Project.objects.get(id=next(iter(self.project_ids)))
        raise NotFound("this caller is not scoped to one project")


SYSTEM = Caller(label="system", project_ids=frozenset(), permissions=frozenset())


# ---------------------------------------------------------------- recalled callers (apikit/auth.py)
#: A boolean SQL expression for an action's first statement: true when its caller has nothing
#: to recheck (read from its token in this request), else whether the token's row still says
#: what it said when the caller was read (``TokenRow``). Parameters: ``recheck_params``.
TOKEN_STILL_VALID_SQL = f"""(%(recheck_token)s::bigint IS NULL OR EXISTS (
  SELECT 1 FROM {ApiToken._meta.db_table} AS t
   WHERE t.id = %(recheck_token)s::bigint AND t.revoked_at IS NULL AND t.project_id = %(recheck_project)s::bigint
     AND t.session_id IS NOT DISTINCT FROM %(recheck_session)s::bigint
     AND t.permissions = %(recheck_permissions)s::jsonb AND t.name = %(recheck_name)s::text))"""

_NO_RECHECK = {"recheck_token": None, "recheck_project": None, "recheck_session": None, "recheck_permissions": None,
               "recheck_name": None}


def recheck_params(caller: Caller) -> dict[str, Any]:
    row = caller.recheck
    if row is None:
        return _NO_RECHECK
    return {"recheck_token": row.token_id, "recheck_project": row.project_id, "recheck_session": row.session_id,
            "recheck_permissions": row.permissions, "recheck_name": row.name}


#: Whether the action of the current request confirmed its recalled caller's token (the API's
#: answer to a recalled caller stands only then; ``api.answered_with_a_fresh_token``).
_CONFIRMED: ContextVar[bool] = ContextVar("novelforge_token_confirmed", default=False)


def token_confirmed(caller: Caller, still_valid: bool) -> None:
    """The action's statement evaluated ``TOKEN_STILL_VALID_SQL`` for ``caller``: a recalled
    caller whose token no longer says the same is refused (401, and the API answers again with
    the token looked up); one whose token does is confirmed for this request."""
    if caller.recheck is None:
        return
    if not still_valid:
        raise Unauthorized("the token changed while this request was answered")
    _CONFIRMED.set(True)


@contextmanager
def confirming() -> Iterator[Callable[[], bool]]:
    """One answer's confirmation: starts unconfirmed; yields what says whether it was confirmed."""
    token = _CONFIRMED.set(False)
    try:
        yield _CONFIRMED.get
    finally:
        _CONFIRMED.reset(token)

MANAGER_PERMISSIONS = frozenset({"read", "write", "approve"})


def caller_for_user(user) -> Caller:
    """A logged-in human: managers act on the projects they manage."""
    if not user.is_authenticated:
        return Caller(label="anonymous", project_ids=frozenset(), permissions=frozenset())
    managed = frozenset(
        Membership.objects.filter(user=user, role=Membership.Role.MANAGER).values_list("project_id", flat=True)
    )
    return Caller(label=f"user:{user.get_username()}", project_ids=managed, permissions=MANAGER_PERMISSIONS, user_id=user.pk)
