"""Clients that keep a history: every request is an *invoke* followed by *ok* (2xx), *fail*
(a typed refusal, or a connection that was refused so nothing was sent) or *unknown* (the
request may have been executed: the connection broke after it was sent). Idempotent steps are
retried with the same logical ids until they are ok; the checks compare the histories with
the database afterwards."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

SESSION = {"role": "writer", "memory_policy": "bounded", "task_mode": "drafting", "runtime_family": "harness"}
RUNTIME = {"runtime_family": "harness", "capabilities": ["draft"], "lease_seconds": 600}
SCHEMA = {"text": "string"}


@dataclass
class Op:
    agent: str
    op: str
    key: str
    started: float
    ended: float = 0.0
    outcome: str = ""  # ok | fail | unknown
    http: int = 0  # the HTTP status (0: no answer)
    code: str = ""


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, op: Op) -> None:
        with self.lock:
            self.ops.append(op)

    def acked(self, op: str) -> set[str]:
        return {o.key for o in self.ops if o.op == op and o.outcome == "ok"}

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.ops:
            out[o.outcome] = out.get(o.outcome, 0) + 1
        return out

    def server_errors(self) -> list[Op]:
        return [o for o in self.ops if o.http >= 500]


class Stopped(Exception):
    pass


class Agent:
    def __init__(self, name: str, base_url: str, token: str, history: History, stop: threading.Event,
                 *, retry_for: float = 60.0) -> None:
        self.name = name
        self.http = httpx.Client(base_url=base_url + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                                 timeout=httpx.Timeout(30.0, connect=2.0))
        self.history = history
        self.stop = stop
        self.retry_for = retry_for
        self.latencies: list[float] = []

    def close(self) -> None:
        self.http.close()

    # One attempt, recorded.
    def call(self, method: str, path: str, body: Any = None, *, op: str, key: str) -> tuple[str, int, Any]:
        rec = Op(self.name, op, key, time.monotonic())
        try:
            resp = self.http.request(method, path, json=body)
            rec.http = resp.status_code
            data = resp.json() if resp.content else None
            if resp.is_success:
                rec.outcome = "ok"
            else:
                rec.outcome = "fail"
                rec.code = (data or {}).get("error", {}).get("code", "") if isinstance(data, dict) else ""
        except httpx.ConnectError:
            rec.outcome, data = "fail", None  # refused: nothing was sent
            rec.code = "connect"
        except httpx.HTTPError as exc:  # sent, then the connection broke: it may have happened
            rec.outcome, data = "unknown", None
            rec.code = type(exc).__name__
        rec.ended = time.monotonic()
        if rec.outcome != "unknown" and rec.code != "connect":
            self.latencies.append(rec.ended - rec.started)
        self.history.add(rec)
        return rec.outcome, rec.http, data

    # Retried with the same logical id until ok (or a refusal the caller expects).
    def until_ok(self, method: str, path: str, body: Any = None, *, op: str, key: str,
                 accept: tuple[str, ...] = ()) -> tuple[int, Any]:
        deadline = time.monotonic() + self.retry_for
        delay = 0.02
        while True:
            outcome, status, data = self.call(method, path, body, op=op, key=key)
            if outcome == "ok":
                return status, data
            code = (data or {}).get("error", {}).get("code") if isinstance(data, dict) else None
            if code in accept:
                return status, data
            if outcome == "fail" and 400 <= status < 500:
                raise AssertionError(f"{self.name} {op} {key}: unexpected refusal {status} {data}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} {op} {key}: no answer within {self.retry_for} s")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    # ---- the steps -------------------------------------------------------------------------------
    def open_session(self, *, attach_separately: bool = False) -> tuple[int, int, int]:
        """A session with a live runtime and an open run: (session, runtime, run)."""
        if attach_separately:
            _, s = self.until_ok("POST", "/sessions", SESSION, op="create_session", key=self.name)
            _, r = self.until_ok("POST", f"/sessions/{s['id']}/runtimes", RUNTIME, op="attach", key=str(s["id"]))
            runtime_id = r["id"]
        else:
            _, s = self.until_ok("POST", "/sessions", {**SESSION, "runtime": RUNTIME}, op="create_session", key=self.name)
            runtime_id = s["runtime_id"]
        _, run = self.until_ok("POST", f"/sessions/{s['id']}/runs", {"cursor": {"step": 0}, "runtime_id": runtime_id},
                               op="start_run", key=str(s["id"]))
        return s["id"], runtime_id, run["id"]

    def handoff(self, run_id: int, logical_id: str) -> dict:
        _, h = self.until_ok("POST", f"/runs/{run_id}/handoffs", {"logical_id": logical_id, "result_schema": SCHEMA},
                             op="create_handoff", key=logical_id)
        return h

    def claim(self, handoff: dict) -> int:
        """The fencing token of this worker's claim. A claim whose answer was lost is found again
        by reading the handoff: its lease holder is this worker."""
        key = handoff["logical_id"]
        deadline = time.monotonic() + self.retry_for
        while True:
            outcome, status, data = self.call("POST", "/handoffs/claim",
                                              {"worker": self.name, "capabilities": [], "handoff_id": handoff["id"]},
                                              op="claim", key=key)
            if outcome == "ok" and data["handoff"]:
                return data["handoff"]["fencing_token"]
            if outcome != "fail" or status == 409:
                o2, _, h = self.call("GET", f"/handoffs/{handoff['id']}", op="read_handoff", key=key)
                if o2 == "ok" and h.get("lease_holder") == self.name and h.get("fencing_token"):
                    return h["fencing_token"]
            elif 400 <= status < 500:
                raise AssertionError(f"{self.name} claim {key}: {status} {data}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} claim {key}: no answer within {self.retry_for} s")
            time.sleep(0.05)

    def deliver(self, handoff: dict, token: int, text: str, *, op: str = "deliver",
                accept: tuple[str, ...] = ()) -> tuple[int, Any]:
        return self.until_ok("POST", f"/handoffs/{handoff['id']}/results",
                             {"fencing_token": token, "job_fingerprint": handoff["job_fingerprint"],
                              "result": {"text": text}},
                             op=op, key=handoff["logical_id"], accept=accept)

    def checkpoint(self, run_id: int, step: int) -> None:
        # Not idempotent (no logical id): one attempt; the load counts its outcome.
        self.call("POST", f"/runs/{run_id}/checkpoints", {"boundary": "context_freeze", "cursor": {"step": step}},
                  op="checkpoint", key=f"{run_id}:{step}")

    def heartbeat(self, runtime_id: int) -> None:
        """Extend the runtime's lease (idempotent: a repeat extends it again), until ok."""
        self.until_ok("POST", f"/runtimes/{runtime_id}/heartbeat", {"lease_seconds": RUNTIME["lease_seconds"]},
                      op="heartbeat", key=str(runtime_id))

    def job(self, run_id: int, logical_id: str) -> None:
        """create → claim → deliver, every step retried until acknowledged."""
        h = self.handoff(run_id, logical_id)
        token = self.claim(h)
        self.deliver(h, token, f"result of {logical_id}")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))
    return ordered[idx]
