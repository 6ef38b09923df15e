"""Who is reviewing, and which packets they may see (DESIGN §9–§10; contract §02, §13.8).

A :class:`ReviewerIdentity` is built at the edge — from a logged-in human with a reviewer
membership, or from an agent's bearer token bound to its own ``semantic_reviewer`` session —
and handed to the actions. Every packet lookup goes through :func:`assignment_for`, so a
packet that is not assigned to the caller is simply not found (404, never 403: ids are not an
oracle).
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.errors import IndependenceViolation, NotFound
from novelforge_sessions.models import Membership, Session
from reviews.models import ReviewAssignment, ReviewGate

#: Memory policies an independent reviewer may run with (contract §03).
INDEPENDENT_MEMORY = frozenset({rt.MemoryPolicy.NONE.value, rt.MemoryPolicy.BOUNDED.value})


@dataclass(frozen=True)
class ReviewerIdentity:
    key: str  # "user:<id>" or "session:<id>": the execution identity a verdict is bound to
    name: str  # for pages: a username, or "session #<id>"
    labels: frozenset[str]  # actor labels this executor writes under (compared with authorship)
    project_ids: frozenset[int]
    user_id: int | None = None
    session_id: int | None = None

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


def reviewer_for_caller(caller: Caller) -> ReviewerIdentity:
    """An agent reviewer: a token with the ``review`` permission, bound to its own session."""
    caller.require("review")
    if caller.session_id is None:
        raise IndependenceViolation(
            "agent reviewers review as their own semantic_reviewer session: use a token bound to that session"
        )
    try:
        session = caller.sessions().get(id=caller.session_id)
    except Session.DoesNotExist:
        raise NotFound("session not found", session_id=caller.session_id) from None
    check_agent_reviewer_session(session)
    return ReviewerIdentity(
        key=session_key(session.id), name=f"session #{session.id}", labels=frozenset({caller.label}),
        project_ids=frozenset({session.project_id}), session_id=session.id,
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
    candidate's author (contract §13.8); a human reviewer still cannot see past the packet
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
