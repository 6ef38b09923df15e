"""Resume: a fresh validation act (contract §07), then runtime generation N+1 and a new run.

``resume_session`` runs every step of ``RESUME_STEPS`` against *current* state and returns a
report. If any step fails, nothing changes: the action raises ``ResumeRefused`` (409) with
the report and each failed step's repair route. ``dry_run`` returns the report and acts on
nothing. Resume never reads the transcript.

The steps are plain functions of a :class:`ResumeContext`; the control plane adds its own
(approvals, capabilities, results, consumption) by extending ``RESUME_STEPS``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import transaction

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.actions.lifecycle import Outbox, check, end_run, live_runtime, lock_session, open_run
from novelforge_sessions.actions.runs import create_run
from novelforge_sessions.actions.runtimes import RuntimeSpec, insert_attachment
from novelforge_sessions.errors import Conflict, LiveRuntimeExists, NotFound
from novelforge_sessions.models import Artifact, Checkpoint, Project, RuntimeAttachment, Session


class Repair:
    REFREEZE = "re-freeze"
    REREVIEW = "re-review"
    REAPPROVE = "re-approve"
    TERMINATE_AS_STALE = "terminate-as-stale"
    ATTACH_CAPABLE_RUNTIME = "attach-capable-runtime"
    RESOLVE_CONFLICT = "resolve-conflict"


@dataclass
class StepResult:
    step: str
    ok: bool
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
        return StepResult("load", True, "no checkpoint yet: the new run starts from an empty cursor",
                          {"session_id": ctx.session.id, "status": ctx.session.status})
    return StepResult("load", True, f"checkpoint {cp.id} (run {cp.run_id}, #{cp.seq}, {cp.boundary})",
                      {"session_id": ctx.session.id, "status": ctx.session.status, "checkpoint_id": cp.id,
                       "cursor": cp.cursor})


def step_framework(ctx: ResumeContext) -> StepResult:
    if ctx.checkpoint is None:
        return StepResult("framework", True, "nothing bound yet")
    bound = ctx.checkpoint.authority.get("framework_version")
    current = ctx.project.framework_version
    if bound != current:
        return StepResult("framework", False, f"checkpoint bound framework {bound}; the project is on {current}",
                          {"bound": bound, "current": current}, Repair.TERMINATE_AS_STALE)
    return StepResult("framework", True, f"framework {current} unchanged", {"framework_version": current})


def step_authority(ctx: ResumeContext) -> StepResult:
    if ctx.checkpoint is None:
        return StepResult("authority", True, "nothing bound yet")
    bound = ctx.checkpoint.authority
    current = ctx.project.authority_ref()
    diffs = {k: {"bound": bound.get(k), "current": current[k]}
             for k in ("authority_version", "lock_fingerprint") if bound.get(k) != current[k]}
    if diffs:
        return StepResult("authority", False, "authority or lock changed since the checkpoint", diffs, Repair.REFREEZE)
    return StepResult("authority", True, f"authority v{current['authority_version']} and lock unchanged",
                      {"authority_version": current["authority_version"]})


def step_context(ctx: ResumeContext) -> StepResult:
    """Sparse context from current state: the artifacts the checkpoint names, as they are now."""
    refs = ctx.checkpoint.artifacts if ctx.checkpoint else []
    ids = [r["artifact_id"] for r in refs]
    current = dict(
        Artifact.objects.filter(id__in=ids, project=ctx.project).values_list("id", "current_version__fingerprint")
    )
    ctx.facts["current_fingerprints"] = current
    return StepResult("context", True, f"rebuilt from current state ({len(current)} artifacts); transcript not read",
                      {"artifacts": len(current)})


def step_artifacts(ctx: ResumeContext) -> StepResult:
    refs = ctx.checkpoint.artifacts if ctx.checkpoint else []
    current = ctx.facts.get("current_fingerprints", {})
    changed = [
        {"artifact_id": r["artifact_id"], "bound": r["fingerprint"], "current": current.get(r["artifact_id"])}
        for r in refs if current.get(r["artifact_id"]) != r["fingerprint"]
    ]
    if changed:
        return StepResult("artifacts", False, f"{len(changed)} artifact(s) changed since the checkpoint",
                          {"changed": changed}, Repair.REFREEZE)
    return StepResult("artifacts", True, f"{len(refs)} artifact fingerprint(s) still current")


ResumeStep = Callable[[ResumeContext], StepResult]

#: Contract §07 order. The control plane inserts its steps before "continue".
RESUME_STEPS: list[ResumeStep] = [step_load, step_framework, step_authority, step_context, step_artifacts]


class ResumeRefused(Conflict):
    code = "resume_refused"


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
        existing = live_runtime(session, lock=False)
        if existing is not None:
            raise LiveRuntimeExists(
                "a runtime is live for this session; close it before resuming",
                runtime_id=existing.id, generation=existing.generation,
            )
        check(rt.check_transition, session.status, rt.SessionStatus.RUNNING)
        checkpoints = Checkpoint.objects.filter(session=session)
        if checkpoint_id is not None:
            checkpoint = checkpoints.filter(id=checkpoint_id).first()
            if checkpoint is None:
                raise NotFound("checkpoint not found in this session", checkpoint_id=checkpoint_id)
        else:
            checkpoint = checkpoints.order_by("-id").first()
        ctx = ResumeContext(caller, session, session.project, checkpoint, runtime)
        steps = [step(ctx) for step in RESUME_STEPS]
        ok = all(s.ok for s in steps)
        cursor = checkpoint.cursor if checkpoint else {}
        steps.append(StepResult("continue", ok, "continue the saved cursor in a new run" if ok else "not continued",
                                {"cursor": cursor}))
        outcome = ResumeOutcome(ok, dry_run, steps, session, checkpoint.id if checkpoint else None)
        if not ok:
            raise ResumeRefused("resume stopped: a binding changed materially", report=outcome.report())
        if dry_run:
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
        outbox.add(session, "session.resumed", run_id=run.id, generation=session.generation,
                   checkpoint_id=outcome.checkpoint_id, reason=reason)
        outbox.flush()
    return outcome
