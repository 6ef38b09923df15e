"""A small Python client for the agent API (standard library only).

    from novelforge_sessions.client import Client, ApiError
    nf = Client("http://127.0.0.1:8000", token="nfs_…")
    s = nf.create_session(role="writer", memory_policy="bounded", task_mode="drafting",
                          runtime_family="claude-code", runtime={"runtime_family": "claude-code"})
    run = nf.start_run(s["id"], cursor={"step": "outline"})
    nf.checkpoint(run["id"], boundary="context_freeze", cursor={"step": "outline"})
    for event in nf.iter_events(after=0): ...

Every error is raised as :class:`ApiError` carrying the service's typed ``code``.

Generation fencing: the client remembers the runtime it attached to each session (create with
``runtime``, ``attach``, ``resume``) and names it as ``runtime_id`` in that session's writes
(transition, transcript, runs, cursor, end, close, abort), so a superseded generation is
refused (``stale_runtime``) instead of moving the new one's session. Pass ``runtime_id=`` to
name another one explicitly.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, details: dict[str, Any]) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.details = status, code, message, details


class Client:
    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0) -> None:
        self.base = base_url.rstrip("/") + "/api/v1"
        self.token = token
        self.timeout = timeout
        self._runtimes: dict[int, int] = {}  # session id → the runtime this client attached to it
        self._run_sessions: dict[int, int] = {}  # run id → its session id

    # ---- transport -------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        query = {k: v for k, v in params.items() if v is not None}
        url = self.base + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
                return json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                err = json.loads(raw)["error"]
            except (ValueError, KeyError, TypeError):
                err = {"code": "http_error", "message": raw.decode(errors="replace")[:200], "details": {}}
            raise ApiError(exc.code, err["code"], err["message"], err.get("details", {})) from None

    def _pages(self, path: str, **params: Any) -> Iterator[dict]:
        after = params.pop("after", None)
        while True:
            page = self.request("GET", path, after=after, **params)
            yield from page["items"]
            after = page["next_after"]
            if after is None:
                return

    # ---- generation fencing ------------------------------------------------------------------
    def runtime_for(self, session_id: int) -> int | None:
        """The runtime this client attached to ``session_id`` (named in its writes), if any."""
        return self._runtimes.get(session_id)

    def _fenced(self, session_id: int | None, body: dict[str, Any], runtime_id: int | None) -> dict[str, Any]:
        rid = runtime_id if runtime_id is not None else (self._runtimes.get(session_id) if session_id is not None else None)
        if rid is not None:
            body["runtime_id"] = rid
        return body

    def _run(self, run: dict) -> dict:
        self._run_sessions[run["id"]] = run["session_id"]
        return run

    # ---- sessions ----------------------------------------------------------------------------
    def project(self) -> dict:
        return self.request("GET", "/project")

    def create_session(self, **fields: Any) -> dict:
        session = self.request("POST", "/sessions", fields)
        if session.get("runtime_id") is not None:
            self._runtimes[session["id"]] = session["runtime_id"]
        return session

    def sessions(self, **filters: Any) -> Iterator[dict]:
        return self._pages("/sessions", **filters)

    def session(self, session_id: int) -> dict:
        return self.request("GET", f"/sessions/{session_id}")

    def transition(self, session_id: int, to: str, *, reason: str = "", expected_version: int | None = None,
                   runtime_id: int | None = None) -> dict:
        return self.request("POST", f"/sessions/{session_id}/transition", self._fenced(
            session_id, {"to": to, "reason": reason, "expected_version": expected_version}, runtime_id))

    def close(self, session_id: int, *, runtime_id: int | None = None) -> dict:
        result = self.request("POST", f"/sessions/{session_id}/close", self._fenced(session_id, {}, runtime_id))
        self._runtimes.pop(session_id, None)  # its generation has ended
        return result

    def abort(self, session_id: int, reason: str = "", *, runtime_id: int | None = None) -> dict:
        return self.request("POST", f"/sessions/{session_id}/abort", self._fenced(session_id, {"reason": reason}, runtime_id))

    def resume(self, session_id: int, runtime: dict, *, checkpoint_id: int | None = None, dry_run: bool = False) -> dict:
        report = self.request("POST", f"/sessions/{session_id}/resume",
                              {"runtime": runtime, "checkpoint_id": checkpoint_id, "dry_run": dry_run})
        if report.get("runtime_id") is not None:
            self._runtimes[session_id] = report["runtime_id"]
        if report.get("run_id") is not None:
            self._run_sessions[report["run_id"]] = session_id
        return report

    def forget(self, session_id: int) -> None:
        self.request("DELETE", f"/sessions/{session_id}")
        self._runtimes.pop(session_id, None)

    def append_transcript(self, session_id: int, role: str, content: str, *, runtime_id: int | None = None) -> dict:
        return self.request("POST", f"/sessions/{session_id}/transcript",
                            self._fenced(session_id, {"role": role, "content": content}, runtime_id))

    # ---- runtimes ------------------------------------------------------------------------------
    def attach(self, session_id: int, runtime_family: str, **fields: Any) -> dict:
        runtime = self.request("POST", f"/sessions/{session_id}/runtimes", {"runtime_family": runtime_family, **fields})
        self._runtimes[session_id] = runtime["id"]
        return runtime

    def heartbeat(self, runtime_id: int, lease_seconds: int | None = None) -> dict:
        return self.request("POST", f"/runtimes/{runtime_id}/heartbeat", {"lease_seconds": lease_seconds})

    def detach(self, runtime_id: int) -> dict:
        runtime = self.request("POST", f"/runtimes/{runtime_id}/detach", {})
        if self._runtimes.get(runtime["session_id"]) == runtime_id:
            del self._runtimes[runtime["session_id"]]
        return runtime

    # ---- runs & checkpoints ----------------------------------------------------------------------
    def start_run(self, session_id: int, *, runtime_id: int | None = None, **fields: Any) -> dict:
        return self._run(self.request("POST", f"/sessions/{session_id}/runs", self._fenced(session_id, fields, runtime_id)))

    def advance(self, run_id: int, cursor: dict, *, runtime_id: int | None = None) -> dict:
        return self._run(self.request("POST", f"/runs/{run_id}/cursor",
                                      self._fenced(self._run_sessions.get(run_id), {"cursor": cursor}, runtime_id)))

    def end_run(self, run_id: int, outcome: str, *, session_status: str | None = None, reason: str = "",
                runtime_id: int | None = None) -> dict:
        return self._run(self.request("POST", f"/runs/{run_id}/end", self._fenced(
            self._run_sessions.get(run_id), {"outcome": outcome, "session_status": session_status, "reason": reason},
            runtime_id)))

    def checkpoint(self, run_id: int, *, boundary: str, cursor: dict, **fields: Any) -> dict:
        return self.request("POST", f"/runs/{run_id}/checkpoints", {"boundary": boundary, "cursor": cursor, **fields})

    # ---- artifacts & events ------------------------------------------------------------------------
    def create_artifact(self, name: str, content: str, kind: str = "document") -> dict:
        return self.request("POST", "/artifacts", {"name": name, "content": content, "kind": kind})

    def add_version(self, artifact_id: int, content: str) -> dict:
        return self.request("POST", f"/artifacts/{artifact_id}/versions", {"content": content})

    def iter_events(self, *, after: int | None = None, session_id: int | None = None) -> Iterator[dict]:
        return self._pages("/events", after=after, session_id=session_id)

    # ---- control plane: handoffs, results, write intents, routing ----------------------------------
    def hand_off(self, run_id: int, logical_id: str, **fields: Any) -> dict:
        """Freeze a job for an external worker; the session waits in ``awaiting_external``."""
        return self.request("POST", f"/runs/{run_id}/handoffs", {"logical_id": logical_id, **fields})

    def claim(self, worker: str, capabilities: list[str], *, handoff_id: int | None = None) -> dict | None:
        """Claim an eligible handoff under a lease; ``None`` when nothing is waiting."""
        return self.request("POST", "/handoffs/claim",
                            {"worker": worker, "capabilities": capabilities, "handoff_id": handoff_id})["handoff"]

    def renew_lease(self, handoff_id: int, fencing_token: int) -> dict:
        return self.request("POST", f"/handoffs/{handoff_id}/heartbeat", {"fencing_token": fencing_token})

    def deliver(self, handoff_id: int, *, fencing_token: int, job_fingerprint: str, result: dict) -> dict:
        """Deliver a result (at-least-once is safe: a repeat answers ``already_consumed``)."""
        return self.request("POST", f"/handoffs/{handoff_id}/results",
                            {"fencing_token": fencing_token, "job_fingerprint": job_fingerprint, "result": result})

    def handoffs(self, **filters: Any) -> Iterator[dict]:
        return self._pages("/handoffs", **filters)

    def before_state(self, kind: str, *, artifact_id: int | None = None) -> dict:
        return self.request("GET", "/write-intents/before-state", kind=kind, artifact_id=artifact_id)

    def propose_write(self, kind: str, *, idempotency_key: str, before_fingerprint: str, **fields: Any) -> dict:
        return self.request("POST", "/write-intents", {"kind": kind, "idempotency_key": idempotency_key,
                                                       "before_fingerprint": before_fingerprint, **fields})

    def approve(self, intent_id: int) -> dict:
        return self.request("POST", f"/write-intents/{intent_id}/approve", {})

    def execute(self, intent_id: int) -> dict:
        return self.request("POST", f"/write-intents/{intent_id}/execute", {})

    def runtimes_for(self, capability: str) -> Any:
        return self.request("GET", "/routing/runtimes", capability=capability)

    # ---- review --------------------------------------------------------------------------------------
    def open_review_gate(self, session_id: int, *, runtime_id: int | None = None, **fields: Any) -> dict:
        return self.request("POST", f"/sessions/{session_id}/review-gates", self._fenced(session_id, fields, runtime_id))

    def claim_review_packet(self) -> dict:
        """``{"packet", "lease"}`` (both null when nothing waits); cite ``lease["fencing_token"]``."""
        return self.request("POST", "/review-packets/claim", {})

    def heartbeat_review_packet(self, packet_id: int, fencing_token: int) -> dict:
        return self.request("POST", f"/review-packets/{packet_id}/heartbeat", {"fencing_token": fencing_token})

    def submit_verdict(self, packet_id: int, verdict: dict, fencing_token: int) -> dict:
        return self.request("POST", f"/review-packets/{packet_id}/verdicts", {**verdict, "fencing_token": fencing_token})
