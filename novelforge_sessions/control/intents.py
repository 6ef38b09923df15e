"""Write intents: consequential writes with before-state, idempotency, approval and
post-condition (docs/model.md#write-intents-and-authority).

Kinds (the consequential writes of the service):

* ``artifact.make_current`` — make a version of an artifact its current version;
  params ``{"version_id"}``; before-state: the artifact's current version and fingerprint.
* ``authority.settle`` — a Canon settlement: the cited artifact versions (which must be
  current) become the project's authority; ``authority_version`` + 1 and a new server-computed
  ``lock_fingerprint``; params ``{"artifacts": [{"artifact_id", "fingerprint"}], "note"}``;
  before-state: authority version and lock.
* ``framework.change`` — move the project to another framework version; params
  ``{"framework_version"}``; before-state: the framework version.

A before-state fingerprint is ``sha256`` over the canonical JSON of that state; read it with
``read_before_state`` (``GET /write-intents/before-state``). Creating an intent states the
fingerprint the caller saw; it must be current. Executing is a compare-and-swap on it: a
stale before-state is refused (``stale_precondition``) and the refusal is the intent's final,
recorded outcome. Replaying (the same idempotency key, or executing again) returns the first
outcome. When ``Project.requires_write_approval`` is set, only a standing approval by a caller
holding the ``approve`` permission lets it execute: nothing about the session — its status, its
role, its provider metadata — is consulted: session state never grants write authority.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from novelforge_sessions import events
from novelforge_sessions import lifecycles as lc
from novelforge_sessions.access import Caller, artifact_ids_in
from novelforge_sessions.actions.artifacts import require_versions
from novelforge_sessions.actions.lifecycle import check, move
from novelforge_sessions.control.fingerprints import fingerprint
from novelforge_sessions.control.models import (
    INTENT_EXECUTED_EVENTS,
    Approval,
    ApprovalDecision,
    AuthorityChange,
    IntentKind,
    IntentState,
    WriteIntent,
)
from novelforge_sessions import event_types as ev
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.errors import (
    ApprovalRequired,
    Conflict,
    IdempotencyKeyReused,
    IntentClosed,
    NotApproved,
    NotFound,
    PostconditionFailed,
    ServiceError,
    StalePrecondition,
    ValidationFailed,
)
from novelforge_sessions.models import Artifact, ArtifactVersion, Project, Run

KEY_RE = rt.IDEMPOTENCY_KEY_RE
FRAMEWORK_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
MAX_PARAMS_BYTES = 16 * 1024


# ---- before-states ----------------------------------------------------------------------------
def artifact_state(artifact: Artifact) -> dict[str, Any]:
    version = artifact.current_version
    return {
        "artifact_id": artifact.id,
        "current_version_id": artifact.current_version_id,
        "fingerprint": version.fingerprint if version else None,
    }


def authority_state(project: Project) -> dict[str, Any]:
    return {"authority_version": project.authority_version, "lock_fingerprint": project.lock_fingerprint}


def framework_state(project: Project) -> dict[str, Any]:
    return {"framework_version": project.framework_version}


def current_state(project: Project, kind: str, artifact: Artifact | None) -> dict[str, Any]:
    if kind == IntentKind.ARTIFACT_MAKE_CURRENT:
        assert artifact is not None
        return artifact_state(artifact)
    if kind == IntentKind.AUTHORITY_SETTLE:
        return authority_state(project)
    return framework_state(project)


def _kind(value: Any) -> str:
    if value not in IntentKind.values:
        raise ValidationFailed("kind is not a write-intent kind", field="kind", allowed=list(IntentKind.values))
    return value


def _artifact(caller: Caller, project: Project, artifact_id: Any) -> Artifact:
    if not isinstance(artifact_id, int) or isinstance(artifact_id, bool):
        raise ValidationFailed("artifact.make_current needs an integer artifact_id", field="artifact_id")
    try:
        return caller.scope("artifact", Artifact.objects.select_related("current_version"), artifacts=[artifact_id]).get(id=artifact_id, project=project)
    except Artifact.DoesNotExist:
        raise NotFound("artifact not found", artifact_id=artifact_id) from None


@dataclass(frozen=True)
class BeforeState:
    kind: str
    artifact_id: int | None
    state: dict[str, Any]
    fingerprint: str


def read_before_state(caller: Caller, *, kind: str, artifact_id: int | None = None) -> BeforeState:
    caller.require("read")
    kind = _kind(kind)
    project = Project.objects.get(id=caller.single_project().id)
    artifact = _artifact(caller, project, artifact_id) if kind == IntentKind.ARTIFACT_MAKE_CURRENT else None
    state = current_state(project, kind, artifact)
    return BeforeState(kind, artifact.id if artifact else None, state, fingerprint(state))


# ---- create -----------------------------------------------------------------------------------------
def _params(project: Project, kind: str, artifact: Artifact | None, params: Any) -> dict[str, Any]:
    params = check(rt.validate_metadata, params, "params", MAX_PARAMS_BYTES)
    if kind == IntentKind.ARTIFACT_MAKE_CURRENT:
        assert artifact is not None
        version_id = params.get("version_id")
        if set(params) != {"version_id"} or not isinstance(version_id, int) or isinstance(version_id, bool):
            raise ValidationFailed("params must be {\"version_id\": <int>}", field="params.version_id")
        if not ArtifactVersion.objects.filter(id=version_id, artifact=artifact).exists():
            raise ValidationFailed("version_id must name a version of this artifact", field="params.version_id")
        return {"version_id": version_id}
    if kind == IntentKind.AUTHORITY_SETTLE:
        if set(params) - {"artifacts", "note"}:
            raise ValidationFailed("params take artifacts and note", field="params")
        raw = params.get("artifacts")
        if not isinstance(raw, list) or not raw or len(raw) > 200:
            raise ValidationFailed("a settlement cites 1–200 artifact versions", field="params.artifacts")
        refs: set[tuple[int, str]] = set()
        for index, ref in enumerate(raw):
            if not isinstance(ref, dict) or not isinstance(ref.get("artifact_id"), int) or set(ref) - {"artifact_id", "fingerprint"}:
                raise ValidationFailed("each ref is {artifact_id, fingerprint}", field=f"params.artifacts[{index}]")
            refs.add((ref["artifact_id"], check(rt.validate_fingerprint, ref.get("fingerprint"), f"params.artifacts[{index}].fingerprint")))
        # reach: create_intent checked it first; nothing to hold (garbage collection reads no settlement)
        require_versions(None, project.id, refs, what="a settlement", hold=False)
        note = params.get("note", "")
        if not isinstance(note, str) or len(note) > 500:
            raise ValidationFailed("note is a string of at most 500 characters", field="params.note")
        return {"artifacts": [{"artifact_id": a, "fingerprint": f} for a, f in sorted(refs)], "note": note}
    version = params.get("framework_version")
    if set(params) != {"framework_version"} or not isinstance(version, str) or not FRAMEWORK_RE.match(version):
        raise ValidationFailed("params must be {\"framework_version\": <short version name>}", field="params.framework_version")
    return {"framework_version": version}


@dataclass(frozen=True)
class CreatedIntent:
    intent: WriteIntent
    created: bool


def create_intent(
    caller: Caller, *, kind: str, idempotency_key: str, before_fingerprint: str, params: dict[str, Any] | None = None,
    artifact_id: int | None = None, session_id: int | None = None, run_id: int | None = None,
) -> CreatedIntent:
    """Record a write intent. Its session/run are provenance only: they grant nothing."""
    caller.require("write")
    kind = _kind(kind)
    if not isinstance(idempotency_key, str) or not KEY_RE.match(idempotency_key):
        raise ValidationFailed("idempotency_key must be 1–200 printable ASCII characters", field="idempotency_key")
    check(rt.validate_fingerprint, before_fingerprint, "before_fingerprint")
    if kind != IntentKind.ARTIFACT_MAKE_CURRENT and artifact_id is not None:
        raise ValidationFailed(f"{kind} takes no artifact_id", field="artifact_id")
    project = Project.objects.get(id=caller.single_project().id)
    if session_id is None and caller.session_id is not None:
        session_id = caller.session_id  # a bound token proposes as its session (the intents it then sees)
    if session_id is not None and not caller.sessions().filter(id=session_id).exists():
        raise NotFound("session not found", session_id=session_id)
    if run_id is not None and not Run.objects.filter(id=run_id, session__in=caller.sessions()).filter(
        **({"session_id": session_id} if session_id is not None else {})
    ).exists():
        raise NotFound("run not found", run_id=run_id)
    artifact = _artifact(caller, project, artifact_id) if kind == IntentKind.ARTIFACT_MAKE_CURRENT else None
    if kind == IntentKind.AUTHORITY_SETTLE and caller.bound_for("artifact") is not None and isinstance(params, dict):
        cited = artifact_ids_in(params.get("artifacts"))
        unseen = cited - set(caller.scope("artifact", Artifact.objects.filter(id__in=cited), artifacts=cited).values_list("id", flat=True))
        if unseen:  # before any fingerprint check: what a bound token cannot see is simply not found
            raise NotFound("artifact not found", artifact_id=min(unseen))
    clean = _params(project, kind, artifact, params)
    if kind == IntentKind.FRAMEWORK_CHANGE and clean["framework_version"] == project.framework_version:
        raise ValidationFailed("the project is already on this framework version", field="params.framework_version")
    request_fp = fingerprint({
        "kind": kind, "artifact_id": artifact.id if artifact else None, "params": clean,
        "before_fingerprint": before_fingerprint, "session_id": session_id, "run_id": run_id,
    })
    existing = WriteIntent.objects.filter(project=project, idempotency_key=idempotency_key).first()
    if existing is not None:
        return CreatedIntent(_same_request(caller, existing, request_fp), False)
    state = current_state(project, kind, artifact)
    if fingerprint(state) != before_fingerprint:
        raise StalePrecondition(
            "the before-state you saw is no longer current", stated=before_fingerprint, current=fingerprint(state),
            current_state=state,
        )
    try:
        with transaction.atomic():
            if session_id is not None:
                events.order_lock(session_id)  # the intent's events are its session's (events.order_lock)
            intent = WriteIntent.objects.create(
                project=project, session_id=session_id, run_id=run_id, kind=kind, artifact=artifact, params=clean,
                before_fingerprint=before_fingerprint, before_state=state, idempotency_key=idempotency_key,
                request_fingerprint=request_fp, created_by=caller.label,
            )
            _event(intent, ev.WRITE_INTENT_CREATED, caller, kind=kind, artifact_id=intent.artifact_id, params=clean,
                   before_fingerprint=before_fingerprint, idempotency_key=idempotency_key,
                   requires_approval=project.requires_write_approval)
    except IntegrityError:
        # Another request with the same key won the insert: replay it (or refuse a different one).
        existing = WriteIntent.objects.get(project=project, idempotency_key=idempotency_key)
        return CreatedIntent(_same_request(caller, existing, request_fp), False)
    return CreatedIntent(intent, True)


def _same_request(caller: Caller, existing: WriteIntent, request_fp: str) -> WriteIntent:
    if existing.request_fingerprint != request_fp:
        # the key is taken either way; its intent is named only to a caller that may see it
        seen = caller.bound_for("write_intent") is None or existing.session_id == caller.session_id
        raise IdempotencyKeyReused(
            "this idempotency key already names a different write intent", **({"intent_id": existing.id} if seen else {}),
        )
    return existing  # same request: same session, so a bound caller's own


def _event(intent: WriteIntent, type: ev.EventType, caller: Caller, **payload: Any) -> None:
    events.append(
        project_id=intent.project_id, session_id=intent.session_id, run_id=intent.run_id, type=type, actor=caller.label,
        payload={"intent_id": intent.id, **payload},
    )


# ---- approvals ------------------------------------------------------------------------------------
def standing_approval(intent: WriteIntent) -> Approval | None:
    return intent.approvals.filter(revoked_at__isnull=True).first()


def approval_problem(intent: WriteIntent, approval: Approval | None, project: Project) -> str | None:
    """Why ``approval`` does not (or no longer) authorise ``intent`` — None if it does."""
    if approval is None:
        return "missing"
    if approval.decision != ApprovalDecision.APPROVED:
        return "rejected"
    if approval.before_fingerprint != intent.before_fingerprint:
        return "before_state_changed"
    if approval.authority_version != project.authority_version:
        return "authority_changed"
    return None


def _lock_intent(caller: Caller, intent_id: int) -> WriteIntent:
    # An intent of a session writes that session's events: its ordering lock first (events.order_lock;
    # an intent's session never changes, so the lock-free read names the right one).
    session_id = (
        WriteIntent.objects.filter(id=intent_id).values_list("session_id", flat=True).first()
        if 0 < intent_id <= 2**63 - 1 else None
    )
    if session_id is not None:
        events.order_lock(session_id)
    try:
        return (
            caller.scope("write_intent", WriteIntent.objects.select_for_update(of=("self",)))
            .select_related("artifact__current_version").get(id=intent_id, project_id__in=caller.project_ids)
        )
    except WriteIntent.DoesNotExist:
        raise NotFound("write intent not found", intent_id=intent_id) from None


def target_state(intent: WriteIntent, project: Project) -> dict[str, Any]:
    artifact = None
    if intent.artifact_id is not None:
        artifact = Artifact.objects.select_related("current_version").get(id=intent.artifact_id)
    return current_state(project, intent.kind, artifact)


def _closed(intent: WriteIntent) -> Conflict:
    return IntentClosed(f"this write intent is {intent.state}", intent_id=intent.id, state=intent.state)


def _approver_fields(caller: Caller) -> dict[str, Any]:
    return {"approver": caller.label, "approver_token_id": caller.token_id, "approver_user_id": caller.user_id}


#: A decision's note is stored cut to this many characters (``Approval.note``).
MAX_NOTE = 500


def _decision_note(note: str) -> str:
    """A decision's note as it is stored: text PostgreSQL can hold (else 422 ``validation_error``,
    field ``note``, nothing written: the same refusal from the API and the pages) cut to
    :data:`MAX_NOTE` characters."""
    check(rt.check_storable_text, note, "note")
    return note[:MAX_NOTE]


def approve_intent(caller: Caller, intent_id: int, *, note: str = "") -> WriteIntent:
    """Approve (or re-approve) an intent. The approval binds its before-state and the
    project's current authority version; approving one whose before-state is already stale is
    refused (nothing to approve)."""
    caller.require("approve")
    note = _decision_note(note)
    with transaction.atomic():
        intent = _lock_intent(caller, intent_id)
        if intent.state in (IntentState.EXECUTED, IntentState.REFUSED, IntentState.REJECTED):
            raise _closed(intent)
        project = Project.objects.get(id=intent.project_id)
        standing = standing_approval(intent)
        if intent.state == IntentState.APPROVED and approval_problem(intent, standing, project) is None:
            return intent  # idempotent: a valid approval stands
        state = target_state(intent, project)
        if fingerprint(state) != intent.before_fingerprint:
            raise StalePrecondition(
                "the intent's before-state is no longer current; create a new intent", intent_id=intent.id,
                stated=intent.before_fingerprint, current=fingerprint(state), current_state=state,
            )
        now = timezone.now()
        if standing is not None:
            Approval.objects.filter(id=standing.id).update(revoked_at=now, revoked_by=f"superseded by {caller.label}")
        approval = Approval.objects.create(
            intent=intent, decision=ApprovalDecision.APPROVED, before_fingerprint=intent.before_fingerprint,
            authority_version=project.authority_version, note=note, **_approver_fields(caller),
        )
        move(intent, lc.WRITE_INTENT, IntentState.APPROVED)
        _event(intent, ev.WRITE_INTENT_APPROVED, caller, approval_id=approval.id, reapproval=standing is not None,
               authority_version=project.authority_version)
    return intent


def reject_intent(caller: Caller, intent_id: int, *, note: str = "") -> WriteIntent:
    caller.require("approve")
    note = _decision_note(note)
    with transaction.atomic():
        intent = _lock_intent(caller, intent_id)
        if intent.state == IntentState.REJECTED:
            return intent
        if intent.state in (IntentState.EXECUTED, IntentState.REFUSED):
            raise _closed(intent)
        project = Project.objects.get(id=intent.project_id)
        now = timezone.now()
        intent.approvals.filter(revoked_at__isnull=True).update(revoked_at=now, revoked_by=f"rejected by {caller.label}")
        approval = Approval.objects.create(
            intent=intent, decision=ApprovalDecision.REJECTED, before_fingerprint=intent.before_fingerprint,
            authority_version=project.authority_version, note=note, **_approver_fields(caller),
        )
        move(intent, lc.WRITE_INTENT, IntentState.REJECTED)
        _event(intent, ev.WRITE_INTENT_REJECTED, caller, approval_id=approval.id, note=note)
    return intent


def revoke_approval(caller: Caller, intent_id: int, *, note: str = "") -> WriteIntent:
    caller.require("approve")
    note = _decision_note(note)
    with transaction.atomic():
        intent = _lock_intent(caller, intent_id)
        if intent.state != IntentState.APPROVED:
            raise NotApproved("only an approved, unexecuted intent has an approval to revoke",
                              intent_id=intent.id, state=intent.state)
        revoked = intent.approvals.filter(revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_by=caller.label,
        )
        move(intent, lc.WRITE_INTENT, IntentState.PROPOSED)
        _event(intent, ev.WRITE_INTENT_APPROVAL_REVOKED, caller, revoked=revoked, note=note)
    return intent


# ---- execute ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Executed:
    intent: WriteIntent
    replayed: bool


def execute_intent(caller: Caller, intent_id: int) -> Executed:
    """Compare-and-swap the write; record the post-condition; replays return the first outcome."""
    caller.require("write")
    refusal: ServiceError | None = None
    with transaction.atomic():
        # The intent row lock serialises executions of one intent (the second one replays).
        intent = _lock_intent(caller, intent_id)
        if intent.state == IntentState.EXECUTED:
            return Executed(intent, True)
        if intent.state == IntentState.REFUSED:
            raise StalePrecondition("this write intent was refused: its before-state was stale", replayed=True,
                                    intent_id=intent.id, **(intent.outcome or {}))
        if intent.state == IntentState.REJECTED:
            raise _closed(intent)
        project = Project.objects.get(id=intent.project_id)
        if project.requires_write_approval:
            standing = standing_approval(intent)
            problem = approval_problem(intent, standing, project)
            if problem is not None:
                # Only the approval counts: the session's status, role and provider metadata
                # are not even read here (docs/model.md#write-intents-and-authority).
                raise ApprovalRequired(
                    "this project requires an approval by a manager before the write", intent_id=intent.id,
                    reason=problem, approval_id=standing.id if standing else None,
                )
        now = timezone.now()
        expected_after, swapped, stale_detail = _compare_and_swap(intent, project)
        if not swapped:
            current = target_state(intent, Project.objects.get(id=intent.project_id))
            detail = {"stated": intent.before_fingerprint, "current": fingerprint(current), "current_state": current,
                      **stale_detail}
            move(intent, lc.WRITE_INTENT, IntentState.REFUSED, refusal_code=StalePrecondition.code, outcome=detail)
            _event(intent, ev.WRITE_INTENT_REFUSED, caller, code=StalePrecondition.code, **detail)
            refusal = StalePrecondition("the before-state changed: the write was not applied", intent_id=intent.id, **detail)
        else:
            # Post-condition: read the state back and compare with what the write promised.
            observed = target_state(intent, Project.objects.get(id=intent.project_id))
            post = {"expected": fingerprint(expected_after), "observed": fingerprint(observed)}
            post["ok"] = post["expected"] == post["observed"]
            if not post["ok"]:
                raise PostconditionFailed("the write did not produce its promised state; rolled back",
                                          intent_id=intent.id, **post)
            move(
                intent, lc.WRITE_INTENT, IntentState.EXECUTED, after_fingerprint=post["expected"], postcondition=post,
                executed_at=now, executed_by=caller.label,
                outcome={"before": intent.before_state, "after": observed, "after_fingerprint": post["expected"]},
            )
            if intent.kind in (IntentKind.AUTHORITY_SETTLE, IntentKind.FRAMEWORK_CHANGE):
                AuthorityChange.objects.create(
                    project_id=intent.project_id, intent=intent, kind=intent.kind, before=intent.before_state, after=observed,
                )
            _event(intent, ev.WRITE_INTENT_EXECUTED, caller, kind=intent.kind, before=intent.before_state, after=observed,
                   postcondition=post)
            follow = INTENT_EXECUTED_EVENTS[IntentKind(intent.kind)]
            _event(intent, follow, caller, before=intent.before_state, after=observed, params=intent.params)
    if refusal is not None:
        raise refusal
    return Executed(intent, False)


def _compare_and_swap(intent: WriteIntent, project: Project) -> tuple[dict[str, Any], bool, dict[str, Any]]:
    """Apply the write only if the before-state is still the one the intent names.

    Each branch is one conditional UPDATE whose row count is the verdict.
    Returns (expected after-state, applied?, extra detail when not applied).
    """
    before = intent.before_state
    if intent.kind == IntentKind.ARTIFACT_MAKE_CURRENT:
        version = ArtifactVersion.objects.get(id=intent.params["version_id"])
        swapped = Artifact.objects.filter(
            id=intent.artifact_id, current_version_id=before["current_version_id"],
        ).update(current_version_id=version.id)
        after = {"artifact_id": intent.artifact_id, "current_version_id": version.id, "fingerprint": version.fingerprint}
        return after, swapped == 1, {}
    if intent.kind == IntentKind.AUTHORITY_SETTLE:
        refs = intent.params["artifacts"]
        current = dict(
            Artifact.objects.filter(project_id=project.id, id__in=[r["artifact_id"] for r in refs])
            .values_list("id", "current_version__fingerprint")
        )
        moved = [r for r in refs if current.get(r["artifact_id"]) != r["fingerprint"]]
        new_version = before["authority_version"] + 1
        lock = fingerprint({"previous_lock": before["lock_fingerprint"], "authority_version": new_version, "artifacts": refs})
        after = {"authority_version": new_version, "lock_fingerprint": lock}
        if moved:
            return after, False, {"settled_artifacts_not_current": moved}
        swapped = Project.objects.filter(
            id=project.id, authority_version=before["authority_version"], lock_fingerprint=before["lock_fingerprint"],
        ).update(authority_version=new_version, lock_fingerprint=lock)
        return after, swapped == 1, {}
    after = {"framework_version": intent.params["framework_version"]}
    swapped = Project.objects.filter(id=project.id, framework_version=before["framework_version"]).update(
        framework_version=after["framework_version"],
    )
    return after, swapped == 1, {}
