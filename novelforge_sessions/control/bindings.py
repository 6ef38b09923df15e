"""Binding invalidation (docs/model.md#stale-bindings).

A session is *bound* to the authority its latest checkpoint recorded (authority version,
lock fingerprint, framework version). When the project's authority or framework moves on,
those sessions are not silently continued: resume refuses them (its framework/authority
steps), ``invalidated_bindings`` lists them, and ``mark_stale`` — an explicit manager action
(permission ``approve``) — moves the ``idle``/``completed`` ones to ``stale`` with an event.
Sessions in other states are reported, not touched: a running or waiting session is stopped
by resume's revalidation, not behind its back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import OuterRef, QuerySet, Subquery

from novelforge_sessions import event_types as ev
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.actions.lifecycle import Outbox, apply_transition
from novelforge_sessions.errors import ValidationFailed
from novelforge_sessions.models import Checkpoint, Project, Session

MARKABLE = (rt.SessionStatus.IDLE.value, rt.SessionStatus.COMPLETED.value)
_KEYS = ("authority_version", "lock_fingerprint", "framework_version")


@dataclass
class Binding:
    session: Session
    checkpoint_id: int
    bound: dict[str, Any]
    changed: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def markable(self) -> bool:
        return self.session.status in MARKABLE

    def reason(self) -> str:
        parts = []
        if "framework_version" in self.changed:
            c = self.changed["framework_version"]
            parts.append(f"framework {c['bound']}→{c['current']}")
        if "authority_version" in self.changed or "lock_fingerprint" in self.changed:
            c = self.changed.get("authority_version") or {"bound": self.bound.get("authority_version"), "current": "?"}
            parts.append(f"authority v{c['bound']}→v{c['current']}")
        return "binding invalidated: " + ", ".join(parts)


def _with_binding(qs: QuerySet[Session]) -> QuerySet[Session]:
    latest = Checkpoint.objects.filter(session=OuterRef("pk")).order_by("-id")
    return qs.annotate(
        bound_checkpoint_id=Subquery(latest.values("id")[:1]),
        bound_authority=Subquery(latest.values("authority")[:1]),
    ).filter(bound_checkpoint_id__isnull=False)


def _compare(session: Session, project: Project) -> Binding | None:
    bound = session.bound_authority or {}
    current = project.authority_ref()
    changed = {k: {"bound": bound.get(k), "current": current[k]} for k in _KEYS if bound.get(k) != current[k]}
    if not changed:
        return None
    return Binding(session, session.bound_checkpoint_id, {k: bound.get(k) for k in _KEYS}, changed)


def invalidated_bindings(caller: Caller) -> list[Binding]:
    """Sessions (not terminated) whose latest checkpoint binds outdated authority/framework."""
    caller.require("read")
    project = Project.objects.get(id=caller.single_project().id)
    qs = _with_binding(caller.sessions().filter(project=project).exclude(status=rt.SessionStatus.TERMINATED))
    return [b for s in qs.order_by("id") if (b := _compare(s, project)) is not None]


@dataclass
class MarkStaleResult:
    marked: list[Binding]
    skipped: list[dict[str, Any]]


#: One mark-stale call names at most this many sessions (one transaction locks them all).
MAX_MARK_STALE = 500


def mark_stale(caller: Caller, *, session_ids: list[int] | None = None) -> MarkStaleResult:
    """Move idle/completed sessions bound to outdated authority to ``stale`` (one transaction).

    ``session_ids`` limits the action; ids that are not eligible are reported in ``skipped``.
    """
    caller.require("approve")
    if session_ids is not None and (
        not isinstance(session_ids, list) or len(session_ids) > MAX_MARK_STALE
        or any(not isinstance(i, int) for i in session_ids)
    ):
        raise ValidationFailed(f"session_ids must be a list of at most {MAX_MARK_STALE} session ids", field="session_ids",
                               limit=MAX_MARK_STALE)
    project_id = caller.single_project().id
    marked: list[Binding] = []
    skipped: list[dict[str, Any]] = []
    with transaction.atomic():
        project = Project.objects.get(id=project_id)
        scope = caller.sessions().filter(project=project)
        if session_ids is not None:
            scope = scope.filter(id__in=session_ids)
        # Lock the candidate sessions in primary-key order (deadlock-free against other
        # batch writers); the binding is re-read under the lock.
        candidates = list(scope.filter(status__in=MARKABLE).order_by("id").select_for_update(of=("self",)))
        bound = {s.id: s for s in _with_binding(Session.objects.filter(id__in=[c.id for c in candidates]))}
        outbox = Outbox(caller.label)
        for session in candidates:
            annotated = bound.get(session.id)
            binding = _compare(annotated, project) if annotated is not None else None
            if binding is None:
                skipped.append({"session_id": session.id, "reason": "binding is current" if annotated else "no checkpoint"})
                continue
            binding.session = session
            apply_transition(session, rt.SessionStatus.STALE, reason=binding.reason()[:200], outbox=outbox, current_run=None)
            outbox.add(session, ev.SESSION_BINDING_INVALIDATED, checkpoint_id=binding.checkpoint_id, bound=binding.bound,
                       changed=binding.changed, status=session.status)
            marked.append(binding)
        if session_ids is not None:
            seen = {c.id for c in candidates}
            visible = dict(scope.values_list("id", "status"))
            for sid in session_ids:
                if sid in seen:
                    continue
                skipped.append({"session_id": sid, "reason": f"status {visible[sid]} is not idle/completed"
                                if sid in visible else "not found"})
        outbox.flush()
    return MarkStaleResult(marked, skipped)
