"""Review gates as a thing a run waits on: the ``gates`` wait kind (``control/waits.py``).

Registered by :class:`reviews.apps.ReviewsConfig` at start-up, so that checkpoints type and
resolve ``pending.gates`` refs, resume reports a ``reviews`` step, and resume hands pending
gates to the new run — without the control plane importing anything from ``reviews``.

* A ref is ``{"gate_id": int}``, a gate of the checkpointing session; it is stored as
  ``{"gate_id", "route", "state", "candidate_version_id", "candidate_fingerprint"}``.
* Resume's ``reviews`` step fails (repair ``re-review``) when a pending gate's candidate is no
  longer what the review would judge — the artifact's head moved to anything other than the
  frozen candidate or the version that was current when it was frozen (the rule verdict
  binding applies) — or when a gate the checkpoint waits on was cancelled; a referenced gate
  that no longer exists fails with ``re-freeze``. A complete gate the checkpoint cites is
  reported with its outcome while its candidate is still what the artifact's head may be (the
  same rule); once the head moved on, its verdict no longer counts: the step fails with
  ``re-review`` and the same ``candidate changed`` problem as a pending gate, whatever the outcome.
* Carry-over moves every pending gate of the session to the new run (``ReviewGate.run``), so
  a verdict bound afterwards settles the run that now continues the cursor.
* An agent gate's slots are ``review`` handoffs, and who may claim one is this kind's rule
  (``claimants``), not a matching capability: resume's ``capabilities`` step counts only the
  live runtimes of eligible reviewer sessions independent of the gate, never the writer's.
* Every pending gate of a run *holds* it (docs/model.md#waits): a page or relay gate keeps the session
  ``awaiting_user``, an agent gate (its review not done: verdicts still unbound) ``awaiting_external``.
  Until the required verdicts are bound or the gate is cancelled, the run may not continue by a
  plain transition nor end ``completed``, and resume leaves the continuing run in that state.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db.models import Q, QuerySet

from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import token_label
from novelforge_sessions.control.models import Handoff
from novelforge_sessions.control.service import (
    HandoffPurpose, Hold, Repair, ResumeScope, WaitCheck, WaitKind, WriteScope,
)
from novelforge_sessions.errors import ValidationFailed
from novelforge_sessions.models import ApiToken, Run, RuntimeAttachment, Session
from novelforge_sessions.phrases import Phrase, gettext_noop
from reviews.access import reviewer_runtimes
from reviews.models import ReviewAssignment, ReviewGate

_ID_MAX = 2**63 - 1
KIND = "review_gate"


def _gate_id(ref: Any) -> int | None:
    value = ref.get("gate_id") if isinstance(ref, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _ID_MAX else None


def resolve(scope: WriteScope, refs: list[Any], where: str) -> list[dict[str, Any]]:
    ids: list[int] = []
    for index, ref in enumerate(refs):
        at = f"{where}[{index}]"
        if not isinstance(ref, Mapping) or set(ref) != {"gate_id"}:
            raise ValidationFailed("a gate ref is an object {gate_id}", field=at)
        gate_id = _gate_id(ref)
        if gate_id is None:
            raise ValidationFailed("gate_id must be a positive integer", field=f"{at}.gate_id")
        if gate_id in ids:
            raise ValidationFailed("each review gate is referenced once", field=f"{at}.gate_id")
        ids.append(gate_id)
    gates = {
        g["id"]: g for g in ReviewGate.objects.filter(session_id=scope.session_id, id__in=ids)
        .values("id", "route", "state", "candidate_id", "candidate_fingerprint")
    }
    resolved = []
    for index, gate_id in enumerate(ids):
        gate = gates.get(gate_id)
        if gate is None:
            raise ValidationFailed("no review gate of this session has this id", field=f"{where}[{index}].gate_id")
        resolved.append({"gate_id": gate_id, "route": gate["route"], "state": gate["state"],
                         "candidate_version_id": gate["candidate_id"], "candidate_fingerprint": gate["candidate_fingerprint"]})
    return resolved


def waiting(session: Session, run: Run) -> list[dict[str, Any]]:
    return list(
        ReviewGate.objects.filter(session=session, run=run, state=ReviewGate.State.PENDING).order_by("id")
        .values("id", "route", "state")
    )


def waiting_many(session_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
    """Pending review gates of these sessions (the overview's "waiting for" column), one query."""
    found: dict[int, list[dict[str, Any]]] = {}
    rows = (ReviewGate.objects.filter(session_id__in=list(session_ids), state=ReviewGate.State.PENDING)
            .order_by("id").values("id", "session_id", "route", "created_at"))
    for row in rows:
        found.setdefault(row["session_id"], []).append(
            {"id": row["id"], "label": f"review gate #{row['id']} ({row['route']} route)", "since": row["created_at"]})
    return found


def holds(session: Session, run: Run) -> list[Hold]:
    """Pending gates of ``run``: each holds it in its route's awaiting state. One query."""
    rows = ReviewGate.objects.filter(session=session, run=run, state=ReviewGate.State.PENDING).order_by("id")
    return [
        Hold(KIND, gate_id, f"review gate #{gate_id} ({route} route)",
             rt.SessionStatus.AWAITING_USER if route in ReviewGate.USER_ROUTES else rt.SessionStatus.AWAITING_EXTERNAL)
        for gate_id, route in rows.values_list("id", "route")
    ]


def _candidate_moved(row: Mapping[str, Any]) -> bool:
    """The artifact's head is neither the candidate nor the version that was current when it
    was frozen (the rule verdict binding applies; a head moved away and back again is fine)."""
    return row["candidate__artifact__current_version_id"] not in {row["head_version_id"], row["candidate_id"]}


def _candidate_changed(row: Mapping[str, Any]) -> dict[str, Any]:
    """The ``candidate changed`` problem, in the shape the pending-gate check reports it."""
    return {
        "gate_id": row["id"], "problem": "candidate changed", "route": row["route"],
        "candidate_fingerprint": row["candidate_fingerprint"],
        "current": row["candidate__artifact__current_version__fingerprint"], "repair": Repair.REREVIEW,
    }


def revalidate(scope: ResumeScope) -> WaitCheck:
    unreadable = [ref for ref in scope.refs if _gate_id(ref) is None]
    wanted = [gid for gid in (_gate_id(ref) for ref in scope.refs) if gid is not None]
    rows = list(
        ReviewGate.objects.filter(session=scope.session)
        .filter(Q(state=ReviewGate.State.PENDING) | Q(id__in=wanted))
        .order_by("id")
        .values("id", "state", "route", "outcome", "candidate_id", "candidate_fingerprint", "head_version_id",
                "candidate__artifact__current_version_id", "candidate__artifact__current_version__fingerprint")
    )
    found = {row["id"] for row in rows}
    problems: list[dict[str, Any]] = [
        {"ref": ref, "problem": "unreadable review gate ref", "repair": Repair.REFREEZE} for ref in unreadable
    ] + [
        {"gate_id": gid, "problem": "unknown review gate", "repair": Repair.REFREEZE} for gid in wanted if gid not in found
    ]
    pending: list[int] = []
    complete: list[dict[str, Any]] = []
    for row in rows:
        if row["state"] == ReviewGate.State.CANCELLED:
            problems.append({"gate_id": row["id"], "problem": "review gate cancelled", "repair": Repair.REREVIEW})
        elif row["state"] == ReviewGate.State.COMPLETE:
            # A verdict judged the candidate, not the artifact: once the head moved on, whatever
            # the outcome, it no longer speaks for what the cursor would continue on (docs/model.md#stop-conditions).
            if _candidate_moved(row):
                problems.append(_candidate_changed(row))
            else:
                complete.append({"gate_id": row["id"], "outcome": row["outcome"]})
        elif _candidate_moved(row):
            problems.append(_candidate_changed(row))
        else:
            pending.append(row["id"])
    data = {"pending": pending, "complete": complete}
    if problems:
        repair = Repair.REFREEZE if any(p["repair"] == Repair.REFREEZE for p in problems) else Repair.REREVIEW
        return WaitCheck(False, Phrase(gettext_noop("%(n)s review gate(s) no longer valid"), n=len(problems)),
                         {**data, "problems": problems}, repair)
    return WaitCheck(True, Phrase(gettext_noop("%(n)s pending review gate(s) still judge the current candidate"), n=len(pending)),
                     data)


def carry_over(session: Session, run: Run) -> list[int]:
    moved = ReviewGate.objects.filter(session=session, state=ReviewGate.State.PENDING).exclude(run=run)
    ids = list(moved.order_by("id").values_list("id", flat=True))
    if ids:
        ReviewGate.objects.filter(id__in=ids).update(run=run)
    return ids


_TOKEN_LABEL = re.compile(r"token:.*#(\d{1,18})", re.DOTALL)


def _sessions_labelled(labels: Iterable[str]) -> set[int]:
    """Sessions whose bound tokens write under one of these actor labels (``access.token_label``)."""
    wanted = {label for label in labels if label}
    ids = {int(m.group(1)) for m in (_TOKEN_LABEL.fullmatch(label) for label in wanted) if m}
    if not ids:
        return set()
    rows = ApiToken.objects.filter(id__in=ids, session__isnull=False).values_list("id", "name", "session_id")
    return {session_id for token_id, name, session_id in rows if token_label(name, token_id) in wanted}


def claimants(handoff: Handoff) -> QuerySet[RuntimeAttachment]:
    """Who may claim this agent-review slot now: the claim's eligibility (``actions._SLOT_ELIGIBLE_SQL``,
    ``access.check_reviewer_can_work``) seen from the slot. The live runtimes declaring ``review``
    of eligible reviewer sessions (``access.reviewer_runtimes``) that are not the gate's session,
    not the sessions whose tokens opened the gate or wrote the candidate, and hold no other slot of
    its packet; a slot pre-assigned to a session and not claimed yet, only that session's. Nobody
    for a slot that no longer waits (its gate is not pending, or its verdict is bound)."""
    slot = (ReviewAssignment.objects.select_related("packet__gate__candidate").filter(handoff_id=handoff.id)
            .first())
    if slot is None or slot.packet.gate.state != ReviewGate.State.PENDING \
            or slot.state == ReviewAssignment.State.SUBMITTED:
        return RuntimeAttachment.objects.none()
    gate = slot.packet.gate
    runtimes = reviewer_runtimes([gate.project_id]).exclude(session_id=gate.session_id)
    authors = _sessions_labelled([gate.opened_by, gate.candidate.created_by])
    if authors:
        runtimes = runtimes.exclude(session_id__in=authors)
    others = (ReviewAssignment.objects.filter(packet_id=slot.packet_id, reviewer_session__isnull=False)
              .exclude(id=slot.id).values("reviewer_session_id"))
    runtimes = runtimes.exclude(session_id__in=others)
    if slot.reviewer and handoff.state == lc.HandoffState.PENDING:  # pre-assigned: only its reviewer
        if slot.reviewer_session_id is None:  # that session was forgotten: nobody else may take the slot
            return RuntimeAttachment.objects.none()
        runtimes = runtimes.filter(session_id=slot.reviewer_session_id)
    return runtimes


REVIEW_GATES = WaitKind(
    name=KIND, pending_key="gates", resolve=resolve, waiting=waiting, revalidate=revalidate,
    carry_over=carry_over, step="reviews", waiting_many=waiting_many, holds=holds,
    handoff_purpose=HandoffPurpose.REVIEW.value, claimants=claimants,
)
