"""Who is calling, and what they may see (DESIGN §10).

A :class:`Caller` is built at the edge — from a bearer token (agents) or from a logged-in
user's memberships (managers) — and handed to actions. Every object lookup goes through
``caller.sessions()``/``caller.projects()`` so an id from another project is simply not
found (404, never 403: ids are not an oracle).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import QuerySet

from novelforge_sessions.errors import Forbidden, NotFound
from novelforge_sessions.models import Membership, Project, Session


@dataclass(frozen=True)
class Caller:
    label: str
    project_ids: frozenset[int]
    permissions: frozenset[str]
    session_id: int | None = None  # a token bound to one session sees only that session
    token_id: int | None = None
    user_id: int | None = None
    project: Project | None = field(default=None, compare=False)  # the token's project, preloaded

    def require(self, permission: str) -> None:
        if permission not in self.permissions:
            raise Forbidden(f"this caller lacks the '{permission}' permission", permission=permission)

    def projects(self) -> QuerySet[Project]:
        return Project.objects.filter(id__in=self.project_ids)

    def sessions(self) -> QuerySet[Session]:
        qs = Session.objects.filter(project_id__in=self.project_ids)
        if self.session_id is not None:
            qs = qs.filter(id=self.session_id)
        return qs

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

MANAGER_PERMISSIONS = frozenset({"read", "write", "approve"})


def caller_for_user(user) -> Caller:
    """A logged-in human: managers act on the projects they manage."""
    if not user.is_authenticated:
        return Caller(label="anonymous", project_ids=frozenset(), permissions=frozenset())
    managed = frozenset(
        Membership.objects.filter(user=user, role=Membership.Role.MANAGER).values_list("project_id", flat=True)
    )
    return Caller(label=f"user:{user.get_username()}", project_ids=managed, permissions=MANAGER_PERMISSIONS, user_id=user.pk)
