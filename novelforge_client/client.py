"""Sync :class:`Client` and async :class:`AsyncClient` of the NovelForge agent API.

Both share every operation (:class:`_Operations`): each method builds one :class:`~._core.Call`
(method, path, validated body, response model, retry safety) and hands it to the transport, which
is ``httpx.Client`` for :class:`Client` (methods return the model) and ``httpx.AsyncClient`` for
:class:`AsyncClient` (the same methods return awaitables of the model: ``_async_ops.py``, generated
from :class:`_Operations` by ``scripts/gen_async_client.py``, declares them ``async def`` for type
checkers; rerun it after changing an operation's signature). Listing methods come in
two forms: ``list_x(...)`` returns one page (``items``, ``next_after``), ``x(...)`` iterates every
item across pages (an async iterator on :class:`AsyncClient`).

Generation fencing: the client remembers the runtime it attached to each session (created with
``runtime=``, ``attach``, ``resume``) and names it as ``runtime_id`` in that session's writes, so
a superseded generation is refused (``StaleRuntime``) instead of moving the new one's session.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import httpx

from novelforge_client import models as m
from novelforge_client._async_ops import _AsyncOperations
from novelforge_client._core import (
    JSON_CONTENT, Call, RetryPolicy, body_of, decode_body, should_retry, transport_error,
)
from novelforge_client._wire import AsyncWire, Socket, Wire, usable

if TYPE_CHECKING:
    from novelforge_client.runtime import AsyncRuntimeLease, RuntimeLease

__all__ = ["AsyncClient", "Client"]

USER_AGENT = "novelforge-client/0.1"


def _dump(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_unset=True, by_alias=True)
    return value


class _Operations:
    """Every operation of the agent API, transport-free. ``_call`` is the transport's."""

    base_url: str

    def __init__(self, base_url: str, token: str, *, timeout: float, retry: RetryPolicy | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._runtimes: dict[int, int] = {}  # session id → the runtime this client attached to it
        self._run_sessions: dict[int, int] = {}  # run id → its session id

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Accept": "application/json", "User-Agent": USER_AGENT}

    def _call(self, call: Call[Any]) -> Any:  # pragma: no cover - provided by the transports
        raise NotImplementedError

    # ---- generation fencing ------------------------------------------------------------
    def runtime_for(self, session_id: int) -> int | None:
        """The runtime this client attached to ``session_id`` (named in its writes), if any."""
        return self._runtimes.get(session_id)

    def _fence(self, session_id: int | None, runtime_id: int | None) -> int | None:
        if runtime_id is not None:
            return runtime_id
        return self._runtimes.get(session_id) if session_id is not None else None

    def _remember_session(self, s: m.SessionCreatedOut) -> m.SessionCreatedOut:
        if s.runtime_id is not None:
            self._runtimes[s.id] = s.runtime_id
        return s

    def _remember_runtime(self, r: m.RuntimeOut) -> m.RuntimeOut:
        self._runtimes[r.session_id] = r.id
        return r

    def _forget_runtime(self, r: m.RuntimeOut) -> m.RuntimeOut:
        if self._runtimes.get(r.session_id) == r.id:
            del self._runtimes[r.session_id]
        return r

    def _remember_run(self, run: m.RunOut) -> m.RunOut:
        self._run_sessions[run.id] = run.session_id
        return run

    def _remember_resume(self, report: m.ResumeReportOut) -> m.ResumeReportOut:
        if not report.dry_run and report.runtime_id is not None:
            self._runtimes[report.session_id] = report.runtime_id
        if not report.dry_run and report.run_id is not None:
            self._run_sessions[report.run_id] = report.session_id
        return report

    # ---- project, artifacts -------------------------------------------------------------
    def project(self) -> m.ProjectOut:
        return self._call(Call("GET", "/project", m.ProjectOut))

    def create_artifact(self, name: str, content: str, *, kind: str = "document") -> m.ArtifactOut:
        return self._call(Call("POST", "/artifacts", m.ArtifactOut,
                               body_of(m.ArtifactIn, name=name, content=content, kind=kind)))

    def list_artifacts(self, *, after: int | None = None, limit: int | None = None) -> m.Page_ArtifactOut_:
        return self._call(Call("GET", "/artifacts", m.Page_ArtifactOut_, params={"after": after, "limit": limit}))

    def artifact(self, artifact_id: int) -> m.ArtifactOut:
        return self._call(Call("GET", f"/artifacts/{artifact_id}", m.ArtifactOut))

    def add_version(self, artifact_id: int, content: str) -> m.ArtifactVersionOut:
        return self._call(Call("POST", f"/artifacts/{artifact_id}/versions", m.ArtifactVersionOut,
                               body_of(m.ArtifactVersionIn, content=content)))

    def artifact_version(self, version_id: int) -> m.ArtifactVersionContentOut:
        return self._call(Call("GET", f"/artifact-versions/{version_id}", m.ArtifactVersionContentOut))

    # ---- sessions ----------------------------------------------------------------------
    def create_session(
        self, *, role: str, memory_policy: str, task_mode: str, runtime_family: str, role_extension: str | None = None,
        provider_metadata: dict[str, Any] | None = None, runtime: m.RuntimeIn | dict[str, Any] | None = None,
    ) -> m.SessionCreatedOut:
        """Create a session; with ``runtime`` also attach runtime generation 1 in the same
        transaction: its id is ``.runtime_id`` (heartbeat it: :meth:`keep_alive`)."""
        body = body_of(m.SessionIn, role=role, memory_policy=memory_policy, task_mode=task_mode,
                       runtime_family=runtime_family, role_extension=role_extension,
                       provider_metadata=provider_metadata, runtime=_dump(runtime))
        return self._call(Call("POST", "/sessions", m.SessionCreatedOut, body, then=self._remember_session))

    def list_sessions(self, *, status: str | None = None, role: str | None = None, runtime_family: str | None = None,
                      task_mode: str | None = None, after: int | None = None, limit: int | None = None) -> m.Page_SessionOut_:
        return self._call(Call("GET", "/sessions", m.Page_SessionOut_, params={
            "status": status, "role": role, "runtime_family": runtime_family, "task_mode": task_mode,
            "after": after, "limit": limit}))

    def session(self, session_id: int) -> m.SessionOut:
        return self._call(Call("GET", f"/sessions/{session_id}", m.SessionOut))

    def transition(self, session_id: int, to: str, *, reason: str | None = None, expected_version: int | None = None,
                   runtime_id: int | None = None) -> m.SessionOut:
        return self._call(Call("POST", f"/sessions/{session_id}/transition", m.SessionOut, body_of(
            m.TransitionIn, to=to, reason=reason, expected_version=expected_version,
            runtime_id=self._fence(session_id, runtime_id))))

    def close(self, session_id: int, *, reason: str | None = None, runtime_id: int | None = None) -> m.CloseOut:
        def then(out: m.CloseOut) -> m.CloseOut:
            self._runtimes.pop(session_id, None)  # its generation has ended
            return out

        return self._call(Call("POST", f"/sessions/{session_id}/close", m.CloseOut, body_of(
            m.CloseIn, reason=reason, runtime_id=self._fence(session_id, runtime_id)), idempotent=True, then=then))

    def abort(self, session_id: int, reason: str | None = None, *, runtime_id: int | None = None) -> m.AbortOut:
        """Ask the open run to stop (cooperative): its runtime learns it on its next heartbeat."""
        return self._call(Call("POST", f"/sessions/{session_id}/abort", m.AbortOut, body_of(
            m.AbortIn, reason=reason, runtime_id=self._fence(session_id, runtime_id)), idempotent=True))

    def resume(self, session_id: int, runtime: m.RuntimeIn | dict[str, Any], *, checkpoint_id: int | None = None,
               dry_run: bool = False) -> m.ResumeReportOut:
        """Revalidate and resume (generation N+1, a new run at the checkpoint's cursor). A failed
        step raises :class:`~novelforge_client.errors.ResumeRefused` whose ``report`` is the step
        report; ``dry_run`` only reports."""
        body = body_of(m.ResumeIn, runtime=_dump(runtime), checkpoint_id=checkpoint_id, dry_run=dry_run)
        return self._call(Call("POST", f"/sessions/{session_id}/resume", m.ResumeReportOut, body,
                               idempotent=dry_run, then=self._remember_resume))

    def forget(self, session_id: int) -> None:
        def then(_: Any) -> None:
            self._runtimes.pop(session_id, None)

        return self._call(Call("DELETE", f"/sessions/{session_id}", None, idempotent=False, then=then))

    def append_transcript(self, session_id: int, role: str, content: str, *,
                          runtime_id: int | None = None) -> m.TranscriptOut:
        return self._call(Call("POST", f"/sessions/{session_id}/transcript", m.TranscriptOut, body_of(
            m.TranscriptIn, role=role, content=content, runtime_id=self._fence(session_id, runtime_id))))

    def list_transcript(self, session_id: int, *, after: int | None = None,
                        limit: int | None = None) -> m.Page_TranscriptOut_:
        return self._call(Call("GET", f"/sessions/{session_id}/transcript", m.Page_TranscriptOut_,
                               params={"after": after, "limit": limit}))

    # ---- runtimes ----------------------------------------------------------------------
    def attach(self, session_id: int, runtime_family: str, *, capabilities: list[str] | None = None,
               provider_metadata: dict[str, Any] | None = None, lease_seconds: int | None = None,
               idempotency_key: str | None = None) -> m.RuntimeOut:
        """Attach runtime generation N+1 (heartbeat it: :meth:`runtime` does both). It carries an
        idempotency key (a fresh one unless you pass yours), so a retry after a dropped answer gets
        the runtime the server attached instead of a second attach."""
        body = body_of(m.AttachIn, runtime_family=runtime_family, capabilities=capabilities,
                       provider_metadata=provider_metadata, lease_seconds=lease_seconds,
                       idempotency_key=idempotency_key or uuid.uuid4().hex)
        return self._call(Call("POST", f"/sessions/{session_id}/runtimes", m.RuntimeOut, body, idempotent=True,
                               then=self._remember_runtime))

    def list_runtimes(self, session_id: int, *, after: int | None = None,
                      limit: int | None = None) -> m.Page_RuntimeOut_:
        return self._call(Call("GET", f"/sessions/{session_id}/runtimes", m.Page_RuntimeOut_,
                               params={"after": after, "limit": limit}))

    def get_runtime(self, runtime_id: int) -> m.RuntimeOut:
        return self._call(Call("GET", f"/runtimes/{runtime_id}", m.RuntimeOut))

    def heartbeat(self, runtime_id: int, lease_seconds: int | None = None) -> m.HeartbeatOut:
        """Extend the runtime's lease; ``abort_requested`` says the open run was asked to stop."""
        return self._call(Call("POST", f"/runtimes/{runtime_id}/heartbeat", m.HeartbeatOut,
                               body_of(m.HeartbeatIn, lease_seconds=lease_seconds), idempotent=True))

    def detach(self, runtime_id: int) -> m.RuntimeOut:
        return self._call(Call("POST", f"/runtimes/{runtime_id}/detach", m.RuntimeOut, {}, idempotent=True,
                               then=self._forget_runtime))

    # ---- runs & checkpoints --------------------------------------------------------------
    def start_run(self, session_id: int, *, cursor: dict[str, Any] | None = None, task_mode: str | None = None,
                  target: str | None = None, frozen_inputs: list[Any] | None = None,
                  runtime_id: int | None = None, idempotency_key: str | None = None) -> m.RunOut:
        """Start run N+1. It carries an idempotency key (a fresh one unless you pass yours), so a
        retry after a dropped answer gets the run the server started instead of a second one."""
        body = body_of(m.RunIn, cursor=cursor, task_mode=task_mode, target=target, frozen_inputs=frozen_inputs,
                       runtime_id=self._fence(session_id, runtime_id), idempotency_key=idempotency_key or uuid.uuid4().hex)
        return self._call(Call("POST", f"/sessions/{session_id}/runs", m.RunOut, body, idempotent=True,
                               then=self._remember_run))

    def list_runs(self, session_id: int, *, state: str | None = None, after: int | None = None,
                  limit: int | None = None) -> m.Page_RunOut_:
        return self._call(Call("GET", f"/sessions/{session_id}/runs", m.Page_RunOut_,
                               params={"state": state, "after": after, "limit": limit}))

    def run(self, run_id: int) -> m.RunOut:
        return self._call(Call("GET", f"/runs/{run_id}", m.RunOut, then=self._remember_run))

    def advance(self, run_id: int, cursor: dict[str, Any], *, runtime_id: int | None = None) -> m.RunOut:
        body = body_of(m.CursorIn, cursor=cursor, runtime_id=self._fence(self._run_sessions.get(run_id), runtime_id))
        return self._call(Call("POST", f"/runs/{run_id}/cursor", m.RunOut, body, then=self._remember_run))

    def end_run(self, run_id: int, outcome: str, *, session_status: str | None = None, reason: str | None = None,
                runtime_id: int | None = None) -> m.RunOut:
        body = body_of(m.RunEndIn, outcome=outcome, session_status=session_status, reason=reason,
                       runtime_id=self._fence(self._run_sessions.get(run_id), runtime_id))
        return self._call(Call("POST", f"/runs/{run_id}/end", m.RunOut, body, then=self._remember_run))

    def checkpoint(self, run_id: int, *, boundary: str, cursor: dict[str, Any],
                   artifacts: list[m.ArtifactRefIn | dict[str, Any]] | None = None,
                   authority: dict[str, Any] | None = None, pending: dict[str, Any] | None = None,
                   approvals: list[Any] | None = None, resume_policy: str | None = None,
                   idempotency_key: str | None = None) -> m.CheckpointOut:
        """Write a checkpoint. It carries an idempotency key (a fresh one unless you pass yours), so
        a retry after a dropped answer replays the checkpoint the server wrote instead of a second one."""
        body = body_of(m.CheckpointIn, boundary=boundary, cursor=cursor,
                       artifacts=[_dump(a) for a in artifacts] if artifacts is not None else None,
                       authority=authority, pending=pending, approvals=approvals, resume_policy=resume_policy,
                       idempotency_key=idempotency_key or uuid.uuid4().hex)
        return self._call(Call("POST", f"/runs/{run_id}/checkpoints", m.CheckpointOut, body, idempotent=True,
                               socket=True))

    def batch(self, run_id: int, items: list[dict[str, Any]], *, idempotency_key: str | None = None) -> m.BatchOut:
        """Several checkpoints and cursor advances of one run in one transaction (all or nothing):
        ``{"kind": "checkpoint", "checkpoint": {...}}`` or ``{"kind": "cursor", "cursor": {...}}``.
        It carries an idempotency key (a fresh one unless you pass yours), so a retry after a dropped
        answer gets what the first batch wrote instead of a second batch."""
        body = body_of(m.BatchIn, items=[_dump(i) for i in items], idempotency_key=idempotency_key or uuid.uuid4().hex)
        return self._call(Call("POST", f"/runs/{run_id}/batch", m.BatchOut, body, idempotent=True))

    def list_checkpoints(self, run_id: int, *, after: int | None = None,
                         limit: int | None = None) -> m.Page_CheckpointOut_:
        return self._call(Call("GET", f"/runs/{run_id}/checkpoints", m.Page_CheckpointOut_,
                               params={"after": after, "limit": limit}))

    def get_checkpoint(self, checkpoint_id: int) -> m.CheckpointOut:
        return self._call(Call("GET", f"/checkpoints/{checkpoint_id}", m.CheckpointOut))

    # ---- events --------------------------------------------------------------------------
    def list_events(self, *, after: int | None = None, session_id: int | None = None, type: str | None = None,
                    limit: int | None = None) -> m.Page_EventOut_:
        return self._call(Call("GET", "/events", m.Page_EventOut_, params={
            "after": after, "session_id": session_id, "type": type, "limit": limit}))

    # ---- control plane: handoffs, results --------------------------------------------------
    def hand_off(self, run_id: int, logical_id: str, *, inputs: list[m.InputRefIn | dict[str, Any]] | None = None,
                 params: dict[str, Any] | None = None, result_schema: dict[str, Any] | None = None,
                 required_capabilities: list[str] | None = None, timeout_seconds: int | None = None,
                 idempotency_key: str | None = None) -> m.HandoffOut:
        """Freeze a job for an external worker (the session waits in ``awaiting_external``). Safe
        to retry: it carries an idempotency key (a fresh one unless you pass yours), and an
        identical repeat with the same ``logical_id`` answers the same handoff."""
        body = body_of(m.HandoffIn, logical_id=logical_id,
                       inputs=[_dump(i) for i in inputs] if inputs is not None else None, params=params,
                       result_schema=result_schema, required_capabilities=required_capabilities,
                       timeout_seconds=timeout_seconds, idempotency_key=idempotency_key or uuid.uuid4().hex)
        return self._call(Call("POST", f"/runs/{run_id}/handoffs", m.HandoffOut, body, idempotent=True))

    def claim(self, worker: str, capabilities: list[str], *, handoff_id: int | None = None) -> m.HandoffOut | None:
        """Claim an eligible handoff under a lease; ``None`` when nothing is waiting."""
        body = body_of(m.ClaimIn, worker=worker, capabilities=capabilities, handoff_id=handoff_id)
        return self._call(Call("POST", "/handoffs/claim", m.ClaimOut, body, then=lambda out: out.handoff))

    def list_handoffs(self, *, session_id: int | None = None, state: str | None = None, logical_id: str | None = None,
                      after: int | None = None, limit: int | None = None) -> m.Page_HandoffOut_:
        return self._call(Call("GET", "/handoffs", m.Page_HandoffOut_, params={
            "session_id": session_id, "state": state, "logical_id": logical_id, "after": after, "limit": limit}))

    def handoff(self, handoff_id: int) -> m.HandoffOut:
        return self._call(Call("GET", f"/handoffs/{handoff_id}", m.HandoffOut))

    def renew_lease(self, handoff_id: int, fencing_token: int) -> m.LeaseOut:
        return self._call(Call("POST", f"/handoffs/{handoff_id}/heartbeat", m.LeaseOut,
                               body_of(m.LeaseIn, fencing_token=fencing_token), idempotent=True))

    def deliver(self, handoff_id: int, *, fencing_token: int, job_fingerprint: str, result: dict[str, Any],
                result_hash: str | None = None) -> m.DeliveryOut:
        """Deliver a result. Safe to retry: a repeat answers ``already_consumed`` with the
        ``original`` outcome and the same receipt (consumed once)."""
        body = body_of(m.ResultIn, fencing_token=fencing_token, job_fingerprint=job_fingerprint, result=result,
                       result_hash=result_hash)
        return self._call(Call("POST", f"/handoffs/{handoff_id}/results", m.DeliveryOut, body, idempotent=True))

    def list_deliveries(self, handoff_id: int, *, after: int | None = None,
                        limit: int | None = None) -> m.Page_DeliveryLogOut_:
        return self._call(Call("GET", f"/handoffs/{handoff_id}/deliveries", m.Page_DeliveryLogOut_,
                               params={"after": after, "limit": limit}))

    def cancel_handoff(self, handoff_id: int, reason: str | None = None) -> m.HandoffOut:
        return self._call(Call("POST", f"/handoffs/{handoff_id}/cancel", m.HandoffOut, body_of(m.ReasonIn, reason=reason)))

    def resolve_conflict(self, handoff_id: int, resolution: str) -> m.HandoffOut:
        return self._call(Call("POST", f"/handoffs/{handoff_id}/resolve-conflict", m.HandoffOut,
                               body_of(m.ResolveIn, resolution=resolution)))

    def list_receipts(self, *, logical_id: str | None = None, after: int | None = None,
                      limit: int | None = None) -> m.Page_ReceiptOut_:
        return self._call(Call("GET", "/receipts", m.Page_ReceiptOut_,
                               params={"logical_id": logical_id, "after": after, "limit": limit}))

    # ---- write intents, bindings, routing --------------------------------------------------
    def before_state(self, kind: str, *, artifact_id: int | None = None) -> m.BeforeStateOut:
        return self._call(Call("GET", "/write-intents/before-state", m.BeforeStateOut,
                               params={"kind": kind, "artifact_id": artifact_id}))

    def propose_write(self, kind: str, *, idempotency_key: str, before_fingerprint: str,
                      params: dict[str, Any] | None = None, artifact_id: int | None = None,
                      session_id: int | None = None, **fields: Any) -> m.WriteIntentOut:
        """Propose a consequential write. Safe to retry: the same ``idempotency_key`` replays it."""
        body = body_of(m.WriteIntentIn, kind=kind, idempotency_key=idempotency_key,
                       before_fingerprint=before_fingerprint, params=params, artifact_id=artifact_id,
                       session_id=session_id, **fields)
        return self._call(Call("POST", "/write-intents", m.WriteIntentOut, body, idempotent=True))

    def list_write_intents(self, *, state: str | None = None, session_id: int | None = None, after: int | None = None,
                           limit: int | None = None) -> m.Page_WriteIntentOut_:
        return self._call(Call("GET", "/write-intents", m.Page_WriteIntentOut_, params={
            "state": state, "session_id": session_id, "after": after, "limit": limit}))

    def write_intent(self, intent_id: int) -> m.WriteIntentOut:
        return self._call(Call("GET", f"/write-intents/{intent_id}", m.WriteIntentOut))

    def approve(self, intent_id: int, note: str | None = None) -> m.WriteIntentOut:
        return self._call(Call("POST", f"/write-intents/{intent_id}/approve", m.WriteIntentOut, body_of(m.NoteIn, note=note)))

    def reject(self, intent_id: int, note: str | None = None) -> m.WriteIntentOut:
        return self._call(Call("POST", f"/write-intents/{intent_id}/reject", m.WriteIntentOut, body_of(m.NoteIn, note=note)))

    def revoke_approval(self, intent_id: int, note: str | None = None) -> m.WriteIntentOut:
        return self._call(Call("POST", f"/write-intents/{intent_id}/revoke-approval", m.WriteIntentOut,
                               body_of(m.NoteIn, note=note)))

    def execute(self, intent_id: int) -> m.WriteIntentOut:
        """Execute an approved write intent. Safe to retry: a repeat answers it ``replayed``."""
        return self._call(Call("POST", f"/write-intents/{intent_id}/execute", m.WriteIntentOut, {}, idempotent=True))

    def authority_changes(self, *, after: int | None = None, limit: int | None = None) -> m.Page_AuthorityChangeOut_:
        return self._call(Call("GET", "/authority/changes", m.Page_AuthorityChangeOut_,
                               params={"after": after, "limit": limit}))

    def invalidated_bindings(self) -> list[m.BindingOut]:
        return self._call(Call("GET", "/bindings/invalidated", list[m.BindingOut]))

    def mark_stale(self, session_ids: list[int] | None = None) -> m.MarkStaleOut:
        return self._call(Call("POST", "/bindings/mark-stale", m.MarkStaleOut,
                               body_of(m.MarkStaleIn, session_ids=session_ids), idempotent=True))

    def runtimes_for(self, capability: str | list[str]) -> list[m.RoutedRuntimeOut]:
        caps = [capability] if isinstance(capability, str) else list(capability)
        return self._call(Call("GET", "/routing/runtimes", list[m.RoutedRuntimeOut], params={"capability": caps}))

    # ---- review gates and packets -------------------------------------------------------------
    def open_review_gate(self, session_id: int, *, candidate_version_id: int, rubric: m.RubricIn | dict[str, Any],
                         route: str, evidence: list[Any] | None = None, required_verdicts: int | None = None,
                         reviewers: list[str] | None = None, reviewer_session_ids: list[int] | None = None,
                         calibration: m.CalibrationIn | dict[str, Any] | None = None,
                         runtime_id: int | None = None, idempotency_key: str | None = None) -> m.GateOut:
        """Freeze a candidate and rubric for blind review; a ``page``/``relay`` route moves the
        session to ``awaiting_user`` until the verdicts are bound (:meth:`wait_for_verdict`). It
        carries an idempotency key (a fresh one unless you pass yours), so a retry after a dropped
        answer gets the gate the server opened instead of a second gate."""
        body = body_of(m.GateIn, candidate_version_id=candidate_version_id, rubric=_dump(rubric), route=route,
                       evidence=[_dump(e) for e in evidence] if evidence is not None else None,
                       required_verdicts=required_verdicts, reviewers=reviewers,
                       reviewer_session_ids=reviewer_session_ids, calibration=_dump(calibration),
                       runtime_id=self._fence(session_id, runtime_id), idempotency_key=idempotency_key or uuid.uuid4().hex)
        return self._call(Call("POST", f"/sessions/{session_id}/review-gates", m.GateOut, body, idempotent=True))

    def list_review_gates(self, session_id: int, *, after: int | None = None,
                          limit: int | None = None) -> m.Page_GateOut_:
        return self._call(Call("GET", f"/sessions/{session_id}/review-gates", m.Page_GateOut_,
                               params={"after": after, "limit": limit}))

    def review_gate(self, gate_id: int) -> m.GateOut:
        return self._call(Call("GET", f"/review-gates/{gate_id}", m.GateOut))

    def cancel_review_gate(self, gate_id: int) -> m.GateOut:
        return self._call(Call("POST", f"/review-gates/{gate_id}/cancel", m.GateOut, {}))

    def claim_review_packet(self) -> m.PacketClaimOut:
        """``packet`` and ``lease`` (both ``None`` when nothing waits); cite ``lease.fencing_token``."""
        return self._call(Call("POST", "/review-packets/claim", m.PacketClaimOut, {}))

    def heartbeat_review_packet(self, packet_id: int, fencing_token: int) -> m.PacketLeaseOut:
        return self._call(Call("POST", f"/review-packets/{packet_id}/heartbeat", m.PacketLeaseOut,
                               body_of(m.PacketHeartbeatIn, fencing_token=fencing_token), idempotent=True))

    def list_review_packets(self, *, state: str | None = None, after: int | None = None,
                            limit: int | None = None) -> m.Page_PacketSummaryOut_:
        return self._call(Call("GET", "/review-packets", m.Page_PacketSummaryOut_,
                               params={"state": state, "after": after, "limit": limit}))

    def review_packet(self, packet_id: int) -> m.PacketOut:
        return self._call(Call("GET", f"/review-packets/{packet_id}", m.PacketOut))

    def submit_verdict(self, packet_id: int, verdict: dict[str, Any], fencing_token: int) -> m.VerdictOut:
        """Bind a typed verdict. Safe to retry: an identical resubmission answers the same verdict."""
        return self._call(Call("POST", f"/review-packets/{packet_id}/verdicts", m.VerdictOut,
                               {**verdict, "fencing_token": fencing_token}, idempotent=True))


GATE_OPEN = "pending"  # the review gate state of a gate still waiting for verdicts (wire value)


class Client(_Operations):
    """Synchronous client. Use as a context manager or call :meth:`close_client`.

    Requests go over keep-alive connections of the standard library (:mod:`novelforge_client._wire`:
    the same timeouts, TLS trust and retry rules as ``httpx``, for a fraction of the CPU per call);
    through ``httpx.Client`` when ``transport`` is given or the environment sets a proxy."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0, retry: RetryPolicy | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(base_url, token, timeout=timeout, retry=retry)
        self._wire: Wire | None = None
        self._http: httpx.Client | None = None
        if transport is None and usable(self.base_url):
            self._wire = Wire(self.base_url + "/api/v1", self._headers(), timeout,
                              socket=Socket(self.base_url, self._headers(), timeout))
        else:
            self._http = httpx.Client(base_url=self.base_url + "/api/v1", headers=self._headers(), timeout=timeout,
                                      transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close_client()

    def close_client(self) -> None:
        if self._wire is not None:
            self._wire.close()
        if self._http is not None:
            self._http.close()

    def _send(self, call: Call[Any]) -> tuple[int, bytes]:
        if self._wire is not None:
            content = call.content()
            return self._wire.request(call.method, call.target(), content,
                                      JSON_CONTENT if content is not None else {}, socket=call.socket)
        assert self._http is not None
        response = self._http.request(call.method, call.path, **call.request_kwargs())
        return response.status_code, response.content

    def _call(self, call: Call[Any]) -> Any:
        attempt = 0
        while True:
            attempt += 1
            try:
                status, content = self._send(call)
            except httpx.TransportError as exc:
                if attempt < self.retry.attempts and should_retry(call, exc=exc):
                    time.sleep(self.retry.delay(attempt))
                    continue
                raise transport_error(call, exc) from exc
            if attempt < self.retry.attempts and should_retry(call, status=status):
                time.sleep(self.retry.delay(attempt))
                continue
            return decode_body(call, status, content)

    def _iterate(self, page_method: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        after = kwargs.pop("after", None)
        while True:
            page = getattr(self, page_method)(*args, after=after, **kwargs)
            yield from page.items
            after = page.next_after
            if after is None:
                return

    def sessions(self, **filters: Any) -> Iterator[m.SessionOut]:
        return self._iterate("list_sessions", **filters)

    def transcript(self, session_id: int, **kw: Any) -> Iterator[m.TranscriptOut]:
        return self._iterate("list_transcript", session_id, **kw)

    def runtimes(self, session_id: int, **kw: Any) -> Iterator[m.RuntimeOut]:
        return self._iterate("list_runtimes", session_id, **kw)

    def runs(self, session_id: int, **kw: Any) -> Iterator[m.RunOut]:
        return self._iterate("list_runs", session_id, **kw)

    def checkpoints(self, run_id: int, **kw: Any) -> Iterator[m.CheckpointOut]:
        return self._iterate("list_checkpoints", run_id, **kw)

    def events(self, **filters: Any) -> Iterator[m.EventOut]:
        """Every event after ``after`` (all pages), optionally of one session or type."""
        return self._iterate("list_events", **filters)

    def handoffs(self, **filters: Any) -> Iterator[m.HandoffOut]:
        return self._iterate("list_handoffs", **filters)

    def deliveries(self, handoff_id: int, **kw: Any) -> Iterator[m.DeliveryLogOut]:
        return self._iterate("list_deliveries", handoff_id, **kw)

    def receipts(self, **filters: Any) -> Iterator[m.ReceiptOut]:
        return self._iterate("list_receipts", **filters)

    def write_intents(self, **filters: Any) -> Iterator[m.WriteIntentOut]:
        return self._iterate("list_write_intents", **filters)

    def review_gates(self, session_id: int, **kw: Any) -> Iterator[m.GateOut]:
        return self._iterate("list_review_gates", session_id, **kw)

    def review_packets(self, **filters: Any) -> Iterator[m.PacketSummaryOut]:
        return self._iterate("list_review_packets", **filters)

    def artifacts(self, **kw: Any) -> Iterator[m.ArtifactOut]:
        return self._iterate("list_artifacts", **kw)

    def wait_for_verdict(self, gate_id: int, *, timeout: float = 600.0, poll: float = 0.5) -> m.GateOut:
        """Block until the gate is no longer pending (its verdicts are bound, or it was cancelled);
        :class:`TimeoutError` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            gate = self.review_gate(gate_id)
            if gate.state != GATE_OPEN:
                return gate
            if time.monotonic() >= deadline:
                raise TimeoutError(f"review gate {gate_id} still pending after {timeout} s")
            time.sleep(poll)

    def runtime(self, session_id: int, runtime_family: str, **attach: Any) -> RuntimeLease:
        """Attach a runtime and keep it alive while the ``with`` block runs (see :class:`RuntimeLease`)."""
        from novelforge_client.runtime import RuntimeLease

        return RuntimeLease.attaching(self, session_id, runtime_family, **attach)

    def keep_alive(self, runtime_id: int, *, lease_seconds: int | None = None, detach: bool = True) -> RuntimeLease:
        """Heartbeat an already attached runtime (``create_session(runtime=…)``, ``resume``) while
        the ``with`` block runs, then detach it (unless ``detach=False``)."""
        from novelforge_client.runtime import RuntimeLease

        return RuntimeLease(self, runtime_id, lease_seconds=lease_seconds, detach=detach)


class AsyncClient(_AsyncOperations, _Operations):
    """Asynchronous client: the same methods as :class:`Client`, awaited; the iterating ones are
    async iterators. Each operation is declared ``async def`` in :mod:`novelforge_client._async_ops`,
    generated from :class:`_Operations` by ``scripts/gen_async_client.py``, so a type checker sees
    the awaitable and the model it resolves to. Use ``async with`` or ``await aclose()``. Requests go over keep-alive
    ``http.client`` connections from a worker thread (:class:`~novelforge_client._wire.AsyncWire`),
    through ``httpx.AsyncClient`` when ``transport`` is given or the environment sets a proxy."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0, retry: RetryPolicy | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(base_url, token, timeout=timeout, retry=retry)
        self._wire: AsyncWire | None = None
        self._http: httpx.AsyncClient | None = None
        if transport is None and usable(self.base_url):
            self._wire = AsyncWire(self.base_url + "/api/v1", self._headers(), timeout,
                                   socket=Socket(self.base_url, self._headers(), timeout))
        else:
            self._http = httpx.AsyncClient(base_url=self.base_url + "/api/v1", headers=self._headers(),
                                           timeout=timeout, transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._wire is not None:
            await self._wire.aclose()
        if self._http is not None:
            await self._http.aclose()

    async def _send(self, call: Call[Any]) -> tuple[int, bytes]:
        if self._wire is not None:
            content = call.content()
            return await self._wire.request(call.method, call.target(), content,
                                            JSON_CONTENT if content is not None else {}, socket=call.socket)
        assert self._http is not None
        response = await self._http.request(call.method, call.path, **call.request_kwargs())
        return response.status_code, response.content

    async def _call(self, call: Call[Any]) -> Any:
        attempt = 0
        while True:
            attempt += 1
            try:
                status, content = await self._send(call)
            except httpx.TransportError as exc:
                if attempt < self.retry.attempts and should_retry(call, exc=exc):
                    await asyncio.sleep(self.retry.delay(attempt))
                    continue
                raise transport_error(call, exc) from exc
            if attempt < self.retry.attempts and should_retry(call, status=status):
                await asyncio.sleep(self.retry.delay(attempt))
                continue
            return decode_body(call, status, content)

    async def _iterate(self, page_method: str, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        after = kwargs.pop("after", None)
        while True:
            page = await getattr(self, page_method)(*args, after=after, **kwargs)
            for item in page.items:
                yield item
            after = page.next_after
            if after is None:
                return

    def sessions(self, **filters: Any) -> AsyncIterator[m.SessionOut]:
        return self._iterate("list_sessions", **filters)

    def transcript(self, session_id: int, **kw: Any) -> AsyncIterator[m.TranscriptOut]:
        return self._iterate("list_transcript", session_id, **kw)

    def runtimes(self, session_id: int, **kw: Any) -> AsyncIterator[m.RuntimeOut]:
        return self._iterate("list_runtimes", session_id, **kw)

    def runs(self, session_id: int, **kw: Any) -> AsyncIterator[m.RunOut]:
        return self._iterate("list_runs", session_id, **kw)

    def checkpoints(self, run_id: int, **kw: Any) -> AsyncIterator[m.CheckpointOut]:
        return self._iterate("list_checkpoints", run_id, **kw)

    def events(self, **filters: Any) -> AsyncIterator[m.EventOut]:
        return self._iterate("list_events", **filters)

    def handoffs(self, **filters: Any) -> AsyncIterator[m.HandoffOut]:
        return self._iterate("list_handoffs", **filters)

    def deliveries(self, handoff_id: int, **kw: Any) -> AsyncIterator[m.DeliveryLogOut]:
        return self._iterate("list_deliveries", handoff_id, **kw)

    def receipts(self, **filters: Any) -> AsyncIterator[m.ReceiptOut]:
        return self._iterate("list_receipts", **filters)

    def write_intents(self, **filters: Any) -> AsyncIterator[m.WriteIntentOut]:
        return self._iterate("list_write_intents", **filters)

    def review_gates(self, session_id: int, **kw: Any) -> AsyncIterator[m.GateOut]:
        return self._iterate("list_review_gates", session_id, **kw)

    def review_packets(self, **filters: Any) -> AsyncIterator[m.PacketSummaryOut]:
        return self._iterate("list_review_packets", **filters)

    def artifacts(self, **kw: Any) -> AsyncIterator[m.ArtifactOut]:
        return self._iterate("list_artifacts", **kw)

    async def wait_for_verdict(self, gate_id: int, *, timeout: float = 600.0, poll: float = 0.5) -> m.GateOut:
        deadline = time.monotonic() + timeout
        while True:
            gate = await self.review_gate(gate_id)
            if gate.state != GATE_OPEN:
                return gate
            if time.monotonic() >= deadline:
                raise TimeoutError(f"review gate {gate_id} still pending after {timeout} s")
            await asyncio.sleep(poll)

    def runtime(self, session_id: int, runtime_family: str, **attach: Any) -> AsyncRuntimeLease:
        from novelforge_client.runtime import AsyncRuntimeLease

        return AsyncRuntimeLease.attaching(self, session_id, runtime_family, **attach)

    def keep_alive(self, runtime_id: int, *, lease_seconds: int | None = None,
                   detach: bool = True) -> AsyncRuntimeLease:
        from novelforge_client.runtime import AsyncRuntimeLease

        return AsyncRuntimeLease(self, runtime_id, lease_seconds=lease_seconds, detach=detach)

