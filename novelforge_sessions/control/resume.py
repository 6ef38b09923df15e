"""Resume: a fresh validation act (docs/model.md#resume), then runtime generation N+1 and a new run.

``resume_session`` runs every step of ``RESUME_STEPS`` against *current* state and returns a
report. If any step fails, nothing changes: the action raises ``ResumeRefused`` (409) with
the report and each failed step's repair route. ``dry_run`` returns the report and acts on
nothing. Resume never reads the transcript.

The steps are plain functions of a :class:`ResumeContext`, in the order of docs/model.md#resume:

    load → framework → authority → context → artifacts → approvals → capabilities → results
    → [one step per registered wait kind that revalidates: ``reviews``] → consumed → continue

What a checkpoint binds (typed and resolved when it was written, ``control/checkpoints.py``),
for the control-plane steps:

* ``approvals`` — write-intent refs, stored as ``{"write_intent_id", "approval_id" (named or
  null), "standing_approval_id", "before_fingerprint", "intent_state"}``: the write the cursor
  is about to make. *approvals* checks every unexecuted one: not rejected or refused and its
  before-state still current (else re-freeze); if the cursor relied on an approval (named, or
  standing at checkpoint time) or the intent is approved, the standing approval is valid: not
  revoked, same authority version (else re-approve).
* ``pending.handoffs`` — stored as ``{"handoff_id", "logical_id"}``: external results the cursor
  waits on. *capabilities* checks that every still-unbound handoff of the session can be served:
  a job by the runtime being attached or by another live runtime of the project declaring what it
  requires; a handoff of another purpose (an agent-review slot) only by whoever the wait kind
  owning that purpose says may claim it (``waits.claimants``: an eligible, independent reviewer
  session's live runtime), never by the resumed runtime, which runs the session that waits on it.
  It names runtimes only within the caller's reach (``caller.scope("routing")``); *results* that no
  delivery is in conflict (nor ``Session.open_conflict`` set) and every unbound result can
  still be bound to its frozen job (no named handoff missing, no invalid delivery waiting).
* other ``pending`` keys — each is a wait kind registered in ``control/waits.py`` (``gates``:
  review gates, registered by ``reviews``), revalidated by the kind's own step.
* ``artifacts`` — stored as ``{"artifact_id", "fingerprint", "head_version_id"}``: the version
  frozen and its artifact's head at checkpoint time. *artifacts* fails a ref only if the head
  moved since, other than to the cited version or by the checkpoint's own executed write
  intents (re-freeze).
* *consumed* — the saved cursor must not repeat an effect that already happened: a result it
  names was consumed and the session checkpointed past it since; a ``before_long_handoff``
  cursor names a handoff whose result is already consumed. Repair: re-freeze (resume from, or
  record, a later checkpoint). A write intent it names that was executed after the checkpoint
  (a crash right after the session's own write) is reported and carried past, not refused:
  executing it again answers with its recorded outcome, so nothing is repeated.

On success, everything the session still waits on (every wait kind's ``carry_over``) moves to
the new run; if any of it holds the run (``waits.holding``: a pending review gate), the session
waits in that wait's state — ``awaiting_user`` for a person's gate, ``awaiting_external`` for an
agent reviewer's — instead of running past it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from novelforge_sessions import event_types as ev
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.actions.lifecycle import Outbox, apply_transition, check, end_run, lock_session, open_run
from novelforge_sessions.control.intents import approval_problem, target_state
from novelforge_sessions.control.routing import live_runtimes_for
from novelforge_sessions.actions.runs import create_run
from novelforge_sessions.actions.runtimes import (
    RuntimeSpec, fail_without_runtime, insert_attachment, refuse_live_runtime,
)
from novelforge_sessions.errors import NotFound, ResumeRefused
from novelforge_sessions.models import Artifact, Checkpoint, Project, RuntimeAttachment, Session
from novelforge_sessions.control import waits
from novelforge_sessions.control.waits import Repair
from novelforge_sessions.control.models import (
    UNBOUND_STATES,
    Approval,
    ApprovalDecision,
    ConsumeReceipt,
    DeliveryOutcome,
    Handoff,
    HandoffState,
    IntentKind,
    IntentState,
    ResultDelivery,
    WriteIntent,
)
from novelforge_sessions.control.fingerprints import fingerprint
from novelforge_sessions.phrases import SEMICOLONS, Phrase, gettext_noop, joined

#: The detail of a step with nothing to check yet.
NOTHING_BOUND = gettext_noop("nothing bound yet")
#: The "continue" step's detail when a step failed (the resume page names the steps in its language).
NOT_CONTINUED = gettext_noop("not continued: %(steps)s failed")


@dataclass
class StepResult:
    step: str
    ok: bool
    #: In English, for the API; a phrase (``novelforge_sessions.phrases``), so the resume page says it
    #: in its own language. The step's name and its repair route are codes.
    detail: str
    data: dict[str, Any] = field(default_factory=dict)
    repair: str | None = None


@dataclass
class ResumeContext:
    caller: Caller
    session: Session
    project: Project
    checkpoint: Checkpoint | None
    runtime: RuntimeSpec
    #: filled by the steps as they go: e.g. the context rebuilt from current state
    facts: dict[str, Any] = field(default_factory=dict)


def step_load(ctx: ResumeContext) -> StepResult:
    cp = ctx.checkpoint
    if cp is None:
        return StepResult("load", True, Phrase(gettext_noop("no checkpoint yet: the new run starts from an empty cursor")),
                          {"session_id": ctx.session.id, "status": ctx.session.status})
    return StepResult("load", True, Phrase(gettext_noop("checkpoint %(id)s (run %(run)s, #%(seq)s, %(boundary)s)"),
                                           id=cp.id, run=cp.run_id, seq=cp.seq, boundary=cp.boundary),
                      {"session_id": ctx.session.id, "status": ctx.session.status, "checkpoint_id": cp.id,
                       "cursor": cp.cursor})


def step_framework(ctx: ResumeContext) -> StepResult:
    if ctx.checkpoint is None:
        return StepResult("framework", True, Phrase(NOTHING_BOUND))
    bound = ctx.checkpoint.authority.get("framework_version")
    current = ctx.project.framework_version
    if bound != current:
        return StepResult("framework", False, Phrase(gettext_noop("checkpoint bound framework %(bound)s; the project is on "
                                                                  "%(current)s"), bound=bound, current=current),
                          {"bound": bound, "current": current}, Repair.TERMINATE_AS_STALE)
    return StepResult("framework", True, Phrase(gettext_noop("framework %(version)s unchanged"), version=current),
                      {"framework_version": current})


def step_authority(ctx: ResumeContext) -> StepResult:
    if ctx.checkpoint is None:
        return StepResult("authority", True, Phrase(NOTHING_BOUND))
    bound = ctx.checkpoint.authority
    current = ctx.project.authority_ref()
    diffs = {k: {"bound": bound.get(k), "current": current[k]}
             for k in ("authority_version", "lock_fingerprint") if bound.get(k) != current[k]}
    if diffs:
        return StepResult("authority", False, Phrase(gettext_noop("authority or lock changed since the checkpoint")), diffs,
                          Repair.REFREEZE)
    return StepResult("authority", True, Phrase(gettext_noop("authority v%(version)s and lock unchanged"),
                                                version=current["authority_version"]),
                      {"authority_version": current["authority_version"]})


def step_context(ctx: ResumeContext) -> StepResult:
    """Sparse context from current state: the artifacts the checkpoint names, as they are now."""
    refs = ctx.checkpoint.artifacts if ctx.checkpoint else []
    ids = [r["artifact_id"] for r in refs]
    heads = {
        artifact_id: (version_id, fp) for artifact_id, version_id, fp in Artifact.objects.filter(
            id__in=ids, project=ctx.project).values_list("id", "current_version_id", "current_version__fingerprint")
    }
    ctx.facts["heads"] = heads
    return StepResult("context", True, Phrase(gettext_noop("rebuilt from current state (%(n)s artifacts); transcript not read"),
                                              n=len(heads)),
                      {"artifacts": len(heads)})


def step_artifacts(ctx: ResumeContext) -> StepResult:
    """Every artifact ref still stands: a checkpoint froze a version (immutable, by fingerprint),
    and fails only if the artifact's head moved since. A ref holds when

    * the cited version is the head now (whatever happened in between), or
    * the head is still the one the checkpoint recorded (``head_version_id``, stored since refs
      carry it): a frozen candidate need not be current, making it current is a write intent; or
    * the head moved only by write intents the checkpoint itself cites (its own consequential
      write, executed since: the *consumed* step reports it), each starting from the head it
      left or the cited version.

    A ref stored before refs recorded the head (no ``head_version_id``) keeps the earlier rule,
    the cited version must be the head, widened only by the checkpoint's own writes starting
    from the cited version. A ref that does not hold is ``changed`` (re-freeze).
    """
    refs = ctx.checkpoint.artifacts if ctx.checkpoint else []
    heads = ctx.facts.get("heads", {})
    current: list[int] = []
    unmoved: list[dict[str, Any]] = []
    written: list[dict[str, Any]] = []
    changed: list[dict[str, Any]] = []
    for r in refs:
        head_id, head_fp = heads.get(r["artifact_id"], (None, None))
        if head_fp == r["fingerprint"]:
            current.append(r["artifact_id"])
        elif head_id is not None and head_id == r.get("head_version_id"):
            unmoved.append({"artifact_id": r["artifact_id"], "bound": r["fingerprint"], "current": head_fp})
        elif (by := _moved_by_own_writes(ctx, r, head_id)):
            written.append({"artifact_id": r["artifact_id"], "bound": r["fingerprint"], "current": head_fp,
                            "write_intent_ids": by})
        else:
            changed.append({"artifact_id": r["artifact_id"], "bound": r["fingerprint"], "current": head_fp})
    if changed:
        return StepResult("artifacts", False,
                          Phrase(gettext_noop("%(n)s artifact(s) changed since the checkpoint"), n=len(changed)),
                          {"changed": changed}, Repair.REFREEZE)
    if not unmoved and not written:
        return StepResult("artifacts", True, Phrase(gettext_noop("%(n)s artifact fingerprint(s) still current"), n=len(refs)))
    parts = [Phrase(gettext_noop("%(n)s still current"), n=len(current))] if current else []
    if unmoved:
        parts.append(Phrase(gettext_noop("%(n)s frozen at a version that is not current, and nothing made another "
                                         "version current since"), n=len(unmoved)))
    if written:
        ids = sorted({i for w in written for i in w["write_intent_ids"]})
        parts.append(Phrase(gettext_noop("%(n)s made current since by the checkpoint's own write %(intents)s, already "
                                         "executed"), n=len(written),
                            intents=joined([Phrase(gettext_noop("intent #%(id)s"), id=i) for i in ids])))
    return StepResult("artifacts", True, Phrase(gettext_noop("%(n)s artifact fingerprint(s) hold: %(parts)s"), n=len(refs),
                                                parts=joined(parts, SEMICOLONS)),
                      {"current": current, "unmoved": unmoved, "written": written})


def _moved_by_own_writes(ctx: ResumeContext, ref: dict[str, Any], head_id: int | None) -> list[int]:
    """The executed ``artifact.make_current`` intents the checkpoint cites that carry the
    artifact's head, one after the other from the head the ref recorded (or the cited version),
    to ``head_id``; empty when the head got there any other way. Reads the cited intents only
    when a head moved (``_intents``, one query, shared with the approvals step)."""
    if head_id is None or not _intent_refs(ctx):
        return []
    cp = ctx.checkpoint
    writes = sorted(
        (i for i in _intents(ctx).values()
         if i.kind == IntentKind.ARTIFACT_MAKE_CURRENT and i.artifact_id == ref["artifact_id"]
         and i.state == IntentState.EXECUTED and i.executed_at > cp.created_at and isinstance(i.outcome, dict)),
        key=lambda i: (i.executed_at, i.id),
    )
    reached: dict[Any, list[int]] = {ref.get("head_version_id"): []} if ref.get("head_version_id") else {}
    for intent in writes:
        before, after = intent.outcome.get("before") or {}, intent.outcome.get("after") or {}
        if before.get("current_version_id") in reached:
            via = reached[before["current_version_id"]]
        elif before.get("fingerprint") == ref["fingerprint"]:
            via = []
        else:
            continue
        reached[after.get("current_version_id")] = [*via, intent.id]
    return reached.get(head_id) or []


# ---- control-plane steps ------------------------------------------------------------------------
def _id(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _intent_refs(ctx: ResumeContext) -> list[dict[str, Any]]:
    """The checkpoint's write-intent refs as stored: normalized at write time to
    ``{"write_intent_id", "approval_id", "standing_approval_id", "before_fingerprint",
    "intent_state"}``. A ref stored in another shape (before refs were typed) is kept with
    ``write_intent_id`` None, and the approvals step refuses it rather than ignore it."""
    refs = []
    for ref in (ctx.checkpoint.approvals if ctx.checkpoint else []) or []:
        if isinstance(ref, dict) and _id(ref.get("write_intent_id")) is not None:
            refs.append({**ref, "approval_id": _id(ref.get("approval_id"))})
        else:
            refs.append({"write_intent_id": None, "ref": ref})
    return refs


def _relied_on_approval(ref: dict[str, Any], approvals: list[Approval], checkpoint: Checkpoint) -> bool:
    """Did the cursor rely on an approval: one was named, or one stood when it checkpointed?"""
    if ref["approval_id"] is not None:
        return True
    if "standing_approval_id" in ref:
        return ref["standing_approval_id"] is not None
    # A ref stored before refs were resolved at write time: read the approvals' own history.
    at = checkpoint.created_at
    return any(a.decision == ApprovalDecision.APPROVED and a.created_at <= at and (a.revoked_at is None or a.revoked_at > at)
               for a in approvals)


def _intents(ctx: ResumeContext) -> dict[int, WriteIntent]:
    if "intents" not in ctx.facts:
        ids = [r["write_intent_id"] for r in _intent_refs(ctx) if r["write_intent_id"] is not None]
        ctx.facts["intents"] = {
            i.id: i for i in WriteIntent.objects.filter(id__in=ids, project=ctx.project).prefetch_related("approvals")
        } if ids else {}
    return ctx.facts["intents"]


def _handoff_refs(ctx: ResumeContext) -> list[str]:
    pending = (ctx.checkpoint.pending if ctx.checkpoint else {}) or {}
    refs = []
    for ref in pending.get("handoffs") or []:
        if isinstance(ref, dict):
            ref = ref.get("logical_id")
        if isinstance(ref, str):
            refs.append(ref)
    return refs


def _handoffs(ctx: ResumeContext) -> list[Handoff]:
    if "handoffs" not in ctx.facts:
        ctx.facts["handoffs"] = list(Handoff.objects.filter(session=ctx.session).select_related("receipt").order_by("id"))
    return ctx.facts["handoffs"]


def step_approvals(ctx: ResumeContext) -> StepResult:
    """Approvals and write preconditions of the writes the saved cursor is about to make.

    Every intent ref is checked, whatever the client wrote: a rejected or refused intent, or
    a before-state that went stale, is *re-freeze*; an approval the cursor relied on (named,
    or standing at checkpoint time) that is now revoked or stale is *re-approve* — also when
    the revocation put the intent back to ``proposed``. A re-approval that stands and is
    valid repairs it."""
    refs = _intent_refs(ctx)
    intents = _intents(ctx)
    problems: list[dict[str, Any]] = []
    checked = 0
    for ref in refs:
        if ref["write_intent_id"] is None:
            problems.append({"ref": ref["ref"], "problem": "unreadable write-intent ref", "repair": Repair.REFREEZE})
            continue
        intent = intents.get(ref["write_intent_id"])
        if intent is None:
            problems.append({"write_intent_id": ref["write_intent_id"], "problem": "unknown write intent",
                             "repair": Repair.REFREEZE})
            continue
        if intent.state == IntentState.EXECUTED:
            continue  # an effect that already happened: the "consumed" step's business
        checked += 1
        if intent.state in (IntentState.REJECTED, IntentState.REFUSED):
            problems.append({"write_intent_id": intent.id, "problem": f"write intent {intent.state}",
                             "repair": Repair.REFREEZE})
            continue
        current = fingerprint(target_state(intent, ctx.project))
        bound = ref.get("before_fingerprint") or intent.before_fingerprint
        if current != intent.before_fingerprint or bound != intent.before_fingerprint:
            problems.append({"write_intent_id": intent.id, "problem": "write precondition stale",
                             "before_fingerprint": bound, "current": current, "repair": Repair.REFREEZE})
            continue
        approvals = list(intent.approvals.all())
        standing = next((a for a in approvals if a.revoked_at is None), None)
        if ref["approval_id"] is not None and not any(a.id == ref["approval_id"] for a in approvals):
            problems.append({"write_intent_id": intent.id, "approval_id": ref["approval_id"],
                             "problem": "unknown approval", "repair": Repair.REAPPROVE})
            continue
        if not _relied_on_approval(ref, approvals, ctx.checkpoint) and intent.state != IntentState.APPROVED:
            continue  # no approval bound yet: the cursor is still waiting for one
        # The standing approval is what counts (a re-approval replaces a revoked one).
        why = approval_problem(intent, standing, ctx.project)
        if why is not None:
            problems.append({"write_intent_id": intent.id,
                             "approval_id": standing.id if standing else ref["approval_id"] or ref.get("standing_approval_id"),
                             "problem": f"approval stale ({'revoked' if why == 'missing' else why})",
                             "repair": Repair.REAPPROVE})
    if problems:
        repair = Repair.REFREEZE if any(p["repair"] == Repair.REFREEZE for p in problems) else Repair.REAPPROVE
        return StepResult("approvals", False, Phrase(gettext_noop("%(n)s approval/write precondition(s) no longer valid"),
                                                     n=len(problems)),
                          {"problems": problems}, repair)
    return StepResult("approvals", True, Phrase(gettext_noop("%(n)s pending write(s): approvals and preconditions valid"),
                                                n=checked),
                      {"checked": checked})


#: How many runtime ids the capabilities step names per served handoff (it counts them all).
SERVING_LISTED = 5


def _serving(ctx: ResumeContext, runtimes: QuerySet[RuntimeAttachment]) -> dict[str, Any] | None:
    """How many live runtimes could serve a handoff, and the ids of those the caller reaches (a
    token bound to a session reaches only its own session's runtimes: ``access.BOUND_TOKEN_MATRIX``,
    ``routing``, as ``GET /routing/runtimes`` answers it). ``None``: none could."""
    count = runtimes.count()
    if not count:
        return None
    visible = ctx.caller.scope("routing", runtimes).values_list("id", flat=True)[:SERVING_LISTED]
    return {"live_runtimes": count, "runtime_ids": list(visible)}


def step_capabilities(ctx: ResumeContext) -> StepResult:
    """Every unbound handoff can be served (docs/model.md#resume, docs/model.md#stop-conditions). A job: by the runtime being
    attached, or another live runtime declaring what it requires. A handoff of another purpose
    (an agent-review slot): only by a runtime its wait kind says may claim it
    (``waits.claimants``: an eligible reviewer session independent of the gate, live, declaring
    ``review``), never by the resumed runtime — the writer cannot review its own candidate."""
    offered = set(ctx.runtime.capabilities or [])
    pending = [h for h in _handoffs(ctx) if h.state in UNBOUND_STATES]
    missing: list[dict[str, Any]] = []
    served: dict[str, Any] = {}
    answers: dict[tuple[str, ...], dict[str, Any] | None] = {}
    for handoff in pending:
        needed = tuple(sorted(handoff.required_capabilities or []))
        claimants = waits.claimants(handoff)
        if claimants is None:  # a job: any live runtime declaring what it requires
            if set(needed) <= offered:
                served[handoff.logical_id] = "resumed runtime"
                continue
            if needed not in answers:
                answers[needed] = _serving(
                    ctx, live_runtimes_for([ctx.project.id], needed, exclude_session_id=ctx.session.id))
            serving = answers[needed]
        else:
            serving = _serving(ctx, claimants.exclude(session_id=ctx.session.id))
        if serving is not None:
            served[handoff.logical_id] = serving
        else:
            problem = {"logical_id": handoff.logical_id, "handoff_id": handoff.id, "purpose": handoff.purpose,
                       "missing": sorted(set(needed) - offered) if claimants is None else list(needed)}
            missing.append(problem)
    if missing:
        return StepResult("capabilities", False,
                          Phrase(gettext_noop("%(n)s pending handoff(s) have no live runtime that may take them and "
                                              "declares what they need"), n=len(missing)),
                          {"missing": missing}, Repair.ATTACH_CAPABLE_RUNTIME)
    return StepResult("capabilities", True, Phrase(gettext_noop("%(n)s pending handoff(s) can be served"), n=len(pending)),
                      {"served": served})


def step_results(ctx: ResumeContext) -> StepResult:
    """Returned results are bound to their frozen jobs; no conflict is open."""
    handoffs = _handoffs(ctx)
    conflicted = [h.logical_id for h in handoffs if h.state == HandoffState.CONFLICTED]
    if ctx.session.open_conflict or conflicted:
        return StepResult("results", False, Phrase(gettext_noop("a conflicting result is unresolved")),
                          {"open_conflict": ctx.session.open_conflict or None, "conflicted": conflicted},
                          Repair.RESOLVE_CONFLICT)
    by_logical = {h.logical_id: h for h in handoffs}
    unknown = [ref for ref in _handoff_refs(ctx) if ref not in by_logical]
    unbound_ids = [h.id for h in handoffs if h.state in UNBOUND_STATES]
    invalid = sorted(set(
        ResultDelivery.objects.filter(handoff_id__in=unbound_ids, outcome=DeliveryOutcome.INVALID)
        .values_list("handoff__logical_id", flat=True)
    )) if unbound_ids else []
    if unknown or invalid:
        return StepResult("results", False, Phrase(gettext_noop("a returned result cannot be bound to its frozen job")),
                          {"unknown_handoffs": unknown, "invalid_deliveries_for": invalid}, Repair.REFREEZE)
    bound = {h.logical_id: h.receipt.result_hash for h in handoffs
             if h.state == HandoffState.BOUND and _receipt(h) is not None}
    return StepResult("results", True, Phrase(gettext_noop("%(n)s result(s) bound to their frozen jobs"), n=len(bound)),
                      {"bound": bound})


def _receipt(handoff: Handoff) -> ConsumeReceipt | None:
    try:
        return handoff.receipt
    except ConsumeReceipt.DoesNotExist:
        return None


def step_consumed(ctx: ResumeContext) -> StepResult:
    """The saved cursor would not repeat an effect that has already happened.

    A write intent the checkpoint cites that was executed after it (the session's own
    consequential write, then a crash before the next checkpoint) is not repeated by
    continuing: executing it again answers with its recorded outcome. It is reported as
    consumed and the cursor continues (a completed logical effect is never repeated); its change of an artifact's head is
    accepted by the *artifacts* step. A consumed result the cursor would wait on again fails.
    """
    cp = ctx.checkpoint
    if cp is None:
        return StepResult("consumed", True, Phrase(NOTHING_BOUND))
    done: list[dict[str, Any]] = []
    repeated: list[dict[str, Any]] = []
    for ref in _intent_refs(ctx):
        intent = _intents(ctx).get(ref["write_intent_id"])
        if intent is not None and intent.state == IntentState.EXECUTED and intent.executed_at > cp.created_at:
            item = {"write_intent_id": intent.id, "kind": intent.kind, "executed_at": intent.executed_at.isoformat(),
                    "outcome": intent.outcome}
            # Its recorded outcome is what a repeat answers; without one it could not be told.
            (done if isinstance(intent.outcome, dict) and "after" in intent.outcome else repeated).append(item)
    refs = set(_handoff_refs(ctx))
    if refs:
        receipts = {r.logical_id: r for r in ConsumeReceipt.objects.filter(project=ctx.project, logical_id__in=refs)}
        for logical_id in sorted(receipts):
            receipt = receipts[logical_id]
            later = Checkpoint.objects.filter(session=ctx.session, id__gt=cp.id, created_at__gte=receipt.consumed_at)
            if cp.boundary == rt.CheckpointBoundary.BEFORE_LONG_HANDOFF or later.exists():
                repeated.append({"logical_id": logical_id, "receipt_id": receipt.id,
                                 "consumed_at": receipt.consumed_at.isoformat(), "result_hash": receipt.result_hash})
    if repeated:
        return StepResult("consumed", False, Phrase(gettext_noop("the saved cursor would repeat effects that were already "
                                                                 "consumed")),
                          {"already_consumed": repeated, **({"executed_writes": done} if done else {})}, Repair.REFREEZE)
    if done:
        names = joined([Phrase(gettext_noop("write intent #%(id)s (%(kind)s)"), id=d["write_intent_id"], kind=d["kind"])
                        for d in done])
        return StepResult(
            "consumed", True,
            Phrase(gettext_noop("%(writes)s already executed after the checkpoint: the write is done and is not made again "
                                "(executing it again returns its recorded outcome); the cursor continues past it"),
                   writes=names),
            {"executed_writes": done})
    return StepResult("consumed", True, Phrase(gettext_noop("no logical result or side effect would be repeated")))


ResumeStep = Callable[[ResumeContext], StepResult]

#: The order of docs/model.md#resume; the registered wait kinds' steps follow ``results`` (``run_steps``),
#: and "continue" is appended by ``resume_session``.
RESUME_STEPS: list[ResumeStep] = [
    step_load, step_framework, step_authority, step_context, step_artifacts,
    step_approvals, step_capabilities, step_results, step_consumed,
]


def step_waits(ctx: ResumeContext) -> list[StepResult]:
    """One step per registered wait kind that revalidates (e.g. ``reviews``), fed the
    checkpoint's refs under the kind's ``pending`` key."""
    pending = (ctx.checkpoint.pending if ctx.checkpoint else {}) or {}
    results = []
    for kind in waits.kinds():
        if kind.revalidate is None:
            continue
        refs = pending.get(kind.pending_key) or []
        found = kind.revalidate(waits.ResumeScope(ctx.session, ctx.project, ctx.checkpoint,
                                                  refs if isinstance(refs, list) else [refs]))
        results.append(StepResult(kind.step, found.ok, found.detail, dict(found.data), None if found.ok else found.repair))
    return results


def run_steps(ctx: ResumeContext) -> list[StepResult]:
    steps = []
    for step in RESUME_STEPS:
        steps.append(step(ctx))
        if step is step_results:
            steps.extend(step_waits(ctx))
    return steps


@dataclass
class ResumeOutcome:
    ok: bool
    dry_run: bool
    steps: list[StepResult]
    session: Session
    checkpoint_id: int | None
    runtime: RuntimeAttachment | None = None
    run_id: int | None = None

    def report(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "dry_run": self.dry_run,
            "session_id": self.session.id,
            "checkpoint_id": self.checkpoint_id,
            "steps": [asdict(s) for s in self.steps],
            "repairs": sorted({s.repair for s in self.steps if s.repair and not s.ok}),
            "generation": self.runtime.generation if self.runtime else None,
            "runtime_id": self.runtime.id if self.runtime else None,
            "run_id": self.run_id,
        }


def resume_session(
    caller: Caller, session_id: int, *, runtime: RuntimeSpec, checkpoint_id: int | None = None, dry_run: bool = False,
    reason: str = "resumed",
) -> ResumeOutcome:
    caller.require("write")
    check(rt.validate_name, runtime.runtime_family, "runtime_family")
    with transaction.atomic():
        session = lock_session(caller, session_id)
        if not lc.can_work(session.status):
            # The lifecycle refuses first (as attach does): this session can never run again
            # (completed, stale, terminated), whatever its runtimes say.
            check(lc.SESSION.check, session.status, rt.SessionStatus.RUNNING)
        # Liveness is the lease: an expired record is tidied first (a running session becomes
        # failed / runtime_lost, as the reconciler would make it), then resume proceeds.
        tidied = Outbox(caller.label)
        refuse_live_runtime(session, tidied, "a runtime is live for this session; close it before resuming")
        if session.status == rt.SessionStatus.RUNNING:
            # Running with no live runtime (and no record left to expire): nothing runs it — a
            # wait settled that way before such a session failed instead. Tidied the same way.
            fail_without_runtime(session, tidied)
        tidied.flush()
        check(lc.SESSION.check, session.status, rt.SessionStatus.RUNNING)
        checkpoints = Checkpoint.objects.filter(session=session)
        if checkpoint_id is not None:
            checkpoint = checkpoints.filter(id=checkpoint_id).first()
            if checkpoint is None:
                raise NotFound("checkpoint not found in this session", checkpoint_id=checkpoint_id)
        else:
            checkpoint = checkpoints.order_by("-id").first()
        ctx = ResumeContext(caller, session, session.project, checkpoint, runtime)
        steps = run_steps(ctx)
        ok = all(s.ok for s in steps)
        cursor = checkpoint.cursor if checkpoint else {}
        failed = [s.step for s in steps if not s.ok]
        steps.append(StepResult("continue", ok, Phrase(gettext_noop("continue the saved cursor in a new run")) if ok
                                else Phrase(NOT_CONTINUED, steps=", ".join(failed)),
                                {"cursor": cursor}))
        outcome = ResumeOutcome(ok, dry_run, steps, session, checkpoint.id if checkpoint else None)
        if not ok:
            raise ResumeRefused("resume stopped: a binding changed materially", report=outcome.report())
        if dry_run:
            transaction.set_rollback(True)  # acts on nothing, not even the tidying of an expired lease
            return outcome
        outbox = Outbox(caller.label)
        waiting = open_run(session)
        if waiting is not None:
            end_run(waiting, rt.RunState.INTERRUPTED, "superseded by resume", outbox, session)
        outcome.runtime = insert_attachment(session, runtime, outbox)
        run = create_run(
            session, outbox, task_mode=session.task_mode, cursor=cursor,
            frozen_inputs=checkpoint.artifacts if checkpoint else [], resumed_from=checkpoint,
        )
        outcome.run_id = run.id
        # The new run inherits everything still awaited (unbound handoffs, pending review
        # gates, …: every registered wait kind): whatever settles it later settles the run
        # that now continues the cursor, never the interrupted one.
        carried = waits.carry_over(session, run)
        outbox.add(session, ev.SESSION_RESUMED, run_id=run.id, generation=session.generation,
                   checkpoint_id=outcome.checkpoint_id, reason=reason,
                   pending_external=carried.get(waits.HANDOFFS.pending_key, []), carried_over=carried)
        # What holds the run (a pending review gate) holds the continuing one too: the session
        # waits in that wait's state (a person's gate: awaiting_user, docs/model.md#waits) rather than
        # running past it; binding the verdicts (or cancelling the gate) continues it.
        held = waits.holding(session, run) if carried else []
        awaiting = waits.awaiting_status(held)
        if awaiting is not None:
            apply_transition(session, awaiting, reason=f"waiting on {', '.join(h.label for h in held)}"[:200],
                             outbox=outbox, current_run=run)
            steps[-1].detail = Phrase(gettext_noop("%(detail)s; it waits on %(what)s (%(state)s)"), detail=steps[-1].detail,
                                      what=", ".join(h.label for h in held), state=awaiting.value)
            steps[-1].data["waiting_on"] = [h.as_dict() for h in held]
        outbox.flush()
    return outcome
