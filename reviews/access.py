"""Who is reviewing, and which packets they may see (docs/model.md#reviews-and-independence, docs/model.md#access).

A :class:`ReviewerIdentity` is built at the edge — from a logged-in human with a reviewer
membership, or from an agent's bearer token bound to its own ``semantic_reviewer`` session —
and handed to the actions. Every packet lookup goes through :func:`assignment_for`, so a
packet that is not assigned to the caller is simply not found (404, never 403: ids are not an
oracle).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db.models import JSONField, OuterRef, QuerySet, Subquery

from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.errors import (
    HandoffNotClaimable, IndependenceViolation, NoLiveRuntime, NotFound, SessionTerminated,
)
from novelforge_sessions.models import Membership, RuntimeAttachment, Session
from reviews.models import ReviewAssignment, ReviewGate

#: Memory policies an independent reviewer may run with (docs/model.md#roles-and-memory-policies).
INDEPENDENT_MEMORY = frozenset({rt.MemoryPolicy.NONE.value, rt.MemoryPolicy.BOUNDED.value})
#: The capability an agent reviewer's runtime declares to take review slots: every agent-review
#: handoff requires it, routing looks for it, and a reviewer whose live runtime does not declare
#: it claims nothing and binds nothing (docs/model.md#runtime-routing: capabilities are proven, not assumed).
REVIEW_CAPABILITY = "review"


@dataclass(frozen=True)
class ReviewerIdentity:
    key: str  # "user:<id>" or "session:<id>": the execution identity a verdict is bound to
    name: str  # for pages: a username, or "session #<id>"
    labels: frozenset[str]  # actor labels this executor writes under (compared with authorship)
    project_ids: frozenset[int]
    user_id: int | None = None
    session_id: int | None = None
    #: an agent reviewer at work (claim, heartbeat, verdict): its session's live runtime when the
    #: identity was built, and the capabilities that runtime declares
    runtime_id: int | None = None
    capabilities: tuple[str, ...] = ()

    @property
    def is_agent(self) -> bool:
        return self.session_id is not None


def user_key(user_id: int) -> str:
    return f"user:{user_id}"


def session_key(session_id: int) -> str:
    return f"session:{session_id}"


def reviewer_for_user(user) -> ReviewerIdentity:
    """A logged-in human; they review in the projects where they hold the reviewer role."""
    projects = frozenset(
        Membership.objects.filter(user=user, role=Membership.Role.REVIEWER).values_list("project_id", flat=True)
    )
    return ReviewerIdentity(
        key=user_key(user.pk), name=user.get_username(), labels=frozenset({f"user:{user.get_username()}"}),
        project_ids=projects, user_id=user.pk,
    )


def check_agent_reviewer_session(session: Session, *, field: str = "session") -> None:
    """An agent reviewer is its own semantic_reviewer session with memory none/bounded."""
    if session.role != rt.SessionRole.SEMANTIC_REVIEWER:
        raise IndependenceViolation(
            "an agent reviewer must be a semantic_reviewer session", field=field, session_id=session.id, role=session.role
        )
    if session.memory_policy not in INDEPENDENT_MEMORY:
        raise IndependenceViolation(
            "an independent reviewer runs with memory policy none or bounded", field=field, session_id=session.id,
            memory_policy=session.memory_policy,
        )


def eligible_reviewer_sessions(project_ids: Iterable[int]) -> QuerySet[Session]:
    """Sessions that may be agent reviewers in these projects: ``semantic_reviewer`` sessions with
    memory ``none``/``bounded`` that can still run (``lifecycles.can_work``). Whether one may take
    a given slot is the slot's business (not the gate's session, opener or author)."""
    return Session.objects.filter(
        project_id__in=list(project_ids), role=rt.SessionRole.SEMANTIC_REVIEWER, memory_policy__in=INDEPENDENT_MEMORY,
    ).exclude(status__in=sorted(lc.CLOSED_STATUSES))


def reviewer_runtimes(project_ids: Iterable[int], *, now: datetime | None = None) -> QuerySet[RuntimeAttachment]:
    """Who could claim an agent-review slot now: the live runtimes (by their lease) of eligible
    reviewer sessions (:func:`eligible_reviewer_sessions`) that declare ``review`` — the same
    rule :func:`check_reviewer_can_work` applies to a reviewer at work."""
    return RuntimeAttachment.objects.live(now).filter(
        session__project_id__in=list(project_ids), session__role=rt.SessionRole.SEMANTIC_REVIEWER,
        session__memory_policy__in=INDEPENDENT_MEMORY, capabilities__contains=[REVIEW_CAPABILITY],
    ).exclude(session__status__in=sorted(lc.CLOSED_STATUSES))


def check_reviewer_can_work(session_id: int, status: str, runtime_id: int | None, capabilities: Sequence[str]) -> None:
    """An agent reviewer's claim, heartbeat and verdict are work of its own session (a verdict is
    bound to ``session:<id>``), so that session must be able to work (docs/model.md#runtimes-and-leases: liveness is
    the lease). Refused, nothing written, most fundamental first: the session can never run again
    (``completed``, ``stale``, ``terminated``: 409 ``session_terminated``) → it has no live
    runtime by its lease (none attached, closed, lost or its lease ran out: 409
    ``no_live_runtime``) → that runtime does not declare ``review`` (409
    ``handoff_not_claimable`` with ``missing_capabilities``)."""
    if not lc.can_work(status):
        raise SessionTerminated(
            f"this reviewer session is {status} and can never run again: it claims no packet and binds no verdict",
            session_id=session_id, status=status,
        )
    if runtime_id is None:
        raise NoLiveRuntime(
            "this reviewer session has no live runtime (none attached, or it was closed or lost, or its lease ran out): "
            f"nothing was written; attach a runtime declaring '{REVIEW_CAPABILITY}', or resume the session",
            session_id=session_id, status=status,
        )
    if REVIEW_CAPABILITY not in capabilities:
        raise HandoffNotClaimable(
            f"this reviewer session's live runtime does not declare the capability '{REVIEW_CAPABILITY}': "
            "nothing was written; attach (or resume with) a runtime that declares it",
            session_id=session_id, runtime_id=runtime_id, missing_capabilities=[REVIEW_CAPABILITY],
        )


def reviewer_for_caller(caller: Caller, *, working: bool = False) -> ReviewerIdentity:
    """An agent reviewer: a token with the ``review`` permission, bound to its own session.

    ``working``: the caller is about to claim, renew or bind (not just read its packets), so its
    session must be able to work too (:func:`check_reviewer_can_work`); the session's live
    runtime is read in the same statement, and the identity carries what it declares. The
    actions check it again under their locks (``actions._lock_reviewer``)."""
    caller.require("review")
    if caller.session_id is None:
        raise IndependenceViolation(
            "agent reviewers review as their own semantic_reviewer session: use a token bound to that session"
        )
    sessions = caller.sessions()
    if working:
        live = RuntimeAttachment.objects.live().filter(session=OuterRef("pk")).order_by("id")
        sessions = sessions.annotate(
            live_runtime_id=Subquery(live.values("id")[:1]),
            live_capabilities=Subquery(live.values("capabilities")[:1], output_field=JSONField()),
        )
    try:
        session = sessions.get(id=caller.session_id)
    except Session.DoesNotExist:
        raise NotFound("session not found", session_id=caller.session_id) from None
    check_agent_reviewer_session(session)
    runtime_id, capabilities = None, ()
    if working:
        runtime_id, capabilities = session.live_runtime_id, tuple(session.live_capabilities or ())
        check_reviewer_can_work(session.id, session.status, runtime_id, capabilities)
    return ReviewerIdentity(
        key=session_key(session.id), name=f"session #{session.id}", labels=frozenset({caller.label}),
        project_ids=frozenset({session.project_id}), session_id=session.id, runtime_id=runtime_id,
        capabilities=capabilities,
    )


def sighted_reason(user, project_id: int) -> str | None:
    """Why this human can see past a blind packet of ``project_id`` — ``"superuser"``,
    ``"manager"`` (opens the writer's session page) or ``"staff"`` (holds any admin permission)
    — or None: they can review blind.

    Any: a list of the permissions that show the writer's side proved incomplete (an outside
    check: token admin lets a staff user mint a project token and read every verdict through
    the API; artifact admin names the candidate's author; the auth admin grants the rest). A
    staff user with no permission at all sees nothing in the admin and stays blind."""
    if user.is_superuser:
        return "superuser"
    if Membership.objects.filter(user=user, project_id=project_id, role=Membership.Role.MANAGER).exists():
        return "manager"
    if user.is_staff and user.get_all_permissions():
        return "staff"
    return None


SIGHTED_MESSAGES = {
    "superuser": "is a superuser and sees every record in the admin",
    "manager": "manages this project and can open the writer's session page",
    "staff": "holds admin permissions that can read past the packet",
}


def check_blind(user, project_id: int, *, field: str | None = None, **details) -> None:
    """403 ``independence_violation`` when ``user`` cannot review this project's packets blind."""
    reason = sighted_reason(user, project_id)
    if reason is not None:
        where = {"field": field} if field else {}
        raise IndependenceViolation(
            f"{user.get_username()} {SIGHTED_MESSAGES[reason]}, so they cannot review its candidate blind: "
            "choose a reviewer who is not a manager", reason=reason, **where, **details,
        )


def check_independence(identity: ReviewerIdentity, gate: ReviewGate, candidate_created_by: str) -> None:
    """The reviewer is not the writer: not its session, not who opened the gate, not the
    candidate's author (docs/model.md#reviews-and-independence); a human reviewer still cannot see past the packet
    (not a manager of the project, not a superuser, no admin view of the writer's records:
    checked again here, at verdict time, since a role can be granted after the assignment).
    Otherwise 403 ``independence_violation``."""
    if identity.user_id is not None:
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.filter(pk=identity.user_id).first()
        if user is None:
            raise NotFound("review packet not found", gate_id=gate.id)
        check_blind(user, gate.project_id, gate_id=gate.id)
    if identity.session_id is not None and identity.session_id == gate.session_id:
        raise IndependenceViolation("a session cannot review its own candidate", gate_id=gate.id)
    if candidate_created_by in identity.labels:
        raise IndependenceViolation("a reviewer cannot review their own work", gate_id=gate.id)
    if gate.opened_by in identity.labels:
        raise IndependenceViolation("whoever opened the gate cannot review it", gate_id=gate.id)


def assignments_for(identity: ReviewerIdentity) -> QuerySet[ReviewAssignment]:
    """The caller's own reviewer slots, in projects where they still hold the reviewer role."""
    return ReviewAssignment.objects.filter(reviewer=identity.key, packet__gate__project_id__in=identity.project_ids)


def assignment_for(identity: ReviewerIdentity, packet_id: int) -> ReviewAssignment:
    try:
        return assignments_for(identity).select_related("packet__gate").get(packet_id=packet_id)
    except ReviewAssignment.DoesNotExist:
        raise NotFound("review packet not found", packet_id=packet_id) from None


def managed_project_ids(user) -> frozenset[int]:
    if not user.is_authenticated:
        return frozenset()
    return frozenset(
        Membership.objects.filter(user=user, role=Membership.Role.MANAGER).values_list("project_id", flat=True)
    )
