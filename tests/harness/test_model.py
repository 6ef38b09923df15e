"""Model-based test of the session lifecycle and the result pipeline, over the API.

A hypothesis ``RuleBasedStateMachine`` drives a project through random sequences of session
creation, attaches, runs, transitions (legal and illegal), closes, handoffs (and their replays),
claims, deliveries (first, repeated, conflicting, with a superseded fencing token), runtime
crashes (the lease expired in the database) and reconciler passes. Its model is written here,
independently of ``lifecycles.py``/``session_runtime.py`` (the contract's tables copied by hand,
as tests/sessions/test_lifecycles.py does): after every step the server's state equals the
model's, and every refusal is the typed 4xx the model predicts — never a 500.

``NF_MODEL_EXAMPLES`` sets the number of examples (default 6 of up to 25 steps here, `NF_MODEL_STEPS`; ``python -m harness`` runs more).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test,
)

from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.lifecycles import runtime_move
from novelforge_sessions.models import RuntimeAttachment
from tests.support.factories import Api, make_project
from tests.support.lifecycle import SESSION_TRANSITIONS

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("NF_MODEL_EXAMPLES", "6"))
STEPS = int(os.environ.get("NF_MODEL_STEPS", "25"))

# ---- the model's own tables (the contract, written out by hand) --------------------------------------
LEGAL = SESSION_TRANSITIONS  # the contract's table, written out by hand (tests/support/lifecycle.py)
STATUSES = sorted(LEGAL)
HOLDS_RUN = {"running", "awaiting_user", "awaiting_external"}
NEVER_AGAIN = {"completed", "stale", "terminated"}  # can never run again
WORK_CLOSED = {"terminated", "stale"}  # take no more external work: their unbound handoffs are cancelled
#: the run's end when a transition leaves the run-holding states
RUN_END = {"idle": "completed", "completed": "completed", "failed": "failed", "terminated": "terminated",
           "stale": "interrupted"}
SCHEMA = {"text": "string"}
SESSION = {"role": "writer", "memory_policy": "bounded", "task_mode": "drafting", "runtime_family": "model"}
RUNTIME = {"runtime_family": "model", "capabilities": [], "lease_seconds": 600}


@dataclass
class MSession:
    id: int
    status: str = "created"
    runtime: int | None = None  # the live runtime's id
    generations: int = 0
    runs: dict[int, str] = field(default_factory=dict)  # run id → state
    open_run: int | None = None
    conflict: bool = False


@dataclass
class MHandoff:
    id: int
    logical_id: str
    session: int
    run: int
    fingerprint: str
    state: str = "pending"
    token: int = 0
    consumed: str | None = None  # the consumed result's text


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        project = make_project(f"model-{id(self)}-{timezone.now().timestamp()}"[:50])
        _, raw = create_token(project, name="model", permissions=ALL_PERMISSIONS)
        self.api = Api(raw)
        self.sessions: list[MSession] = []
        self.handoffs: list[MHandoff] = []
        self.n = 0
        self.touched: set[int] = set()

    # ---- helpers ----------------------------------------------------------------------------------
    def expect(self, resp, status: int | tuple[int, ...], code: str | None = None) -> dict:
        body = resp.json()
        assert resp.status_code < 500, (resp.status_code, body)
        wanted = status if isinstance(status, tuple) else (status,)
        assert resp.status_code in wanted, (resp.status_code, body, "expected", status, code)
        if code is not None:
            assert body["error"]["code"] == code, (body, "expected", code)
        return body

    def fenced(self, s: MSession, body: dict) -> dict:
        return {**body, "runtime_id": s.runtime} if s.runtime else body

    def leave_run(self, s: MSession, target: str, end: str | None = None) -> None:
        if s.status in HOLDS_RUN and target not in HOLDS_RUN and s.open_run is not None:
            s.runs[s.open_run] = end or RUN_END[target]
            s.open_run = None

    def move(self, s: MSession, target: str, end: str | None = None) -> None:
        self.leave_run(s, target, end)
        if target == "terminated":
            s.runtime = None
        if target in WORK_CLOSED:  # what the session waits on is withdrawn with the move
            for h in self.handoffs:
                if h.session == s.id and h.state in ("pending", "claimed"):
                    h.state = "cancelled"
        s.status = target

    def settle(self, s: MSession, h: MHandoff) -> None:
        """A handoff stopped waiting: a session awaiting it on its open run runs again — if a
        runtime is live to run it; else it fails as a running session whose runtime is gone."""
        waiting = [x for x in self.handoffs if x.run == h.run and x.state in ("pending", "claimed")]
        if not waiting and s.status == "awaiting_external" and s.open_run == h.run:
            if s.runtime:
                s.status = "running"
            else:
                self.move(s, "failed", end="interrupted")

    def session_of(self, h: MHandoff) -> MSession:
        self.touched.add(h.session)
        return next(s for s in self.sessions if s.id == h.session)

    def pick(self, data, sessions: list[MSession]) -> MSession:
        s = data.draw(st.sampled_from(sessions))
        self.touched.add(s.id)
        return s

    def prefer(self, data, preferred: list, others: list):
        """Mostly the interesting candidates (so runs reach the result pipeline), sometimes any."""
        if preferred and (not others or data.draw(st.integers(0, 3), label="prefer") > 0):
            return data.draw(st.sampled_from(preferred))
        return data.draw(st.sampled_from(others))

    # ---- rules ------------------------------------------------------------------------------------
    @initialize()
    def a_session_waiting_on_a_claimed_job(self):
        """Every example starts mid-pipeline: a running session whose run handed off a job that a
        worker claimed (the session awaits it), so the delivery rules have work from step one."""
        got = self.expect(self.api.post("/sessions", {**SESSION, "runtime": RUNTIME}), 201)
        s = MSession(got["id"], runtime=got["runtime_id"], generations=1)
        run = self.expect(self.api.post(f"/sessions/{s.id}/runs", {"cursor": {"step": 0}, "runtime_id": s.runtime}), 201)
        s.runs[run["id"]], s.open_run, s.status = "open", run["id"], "running"
        self.sessions.append(s)
        self.touched.add(s.id)
        self.n += 1
        h = self.expect(self.api.post(f"/runs/{run['id']}/handoffs", {"logical_id": f"job-{self.n}", "result_schema": SCHEMA}), 201)
        s.status = "awaiting_external"
        claimed = self.expect(self.api.post("/handoffs/claim", {"worker": "model", "capabilities": [], "handoff_id": h["id"]}), 200)
        self.handoffs.append(MHandoff(h["id"], f"job-{self.n}", s.id, run["id"], h["job_fingerprint"], state="claimed",
                                      token=claimed["handoff"]["fencing_token"]))

    @rule(with_runtime=st.booleans())
    def create_session(self, with_runtime):
        body = {**SESSION, "runtime": RUNTIME} if with_runtime else SESSION
        got = self.expect(self.api.post("/sessions", body), 201)
        s = MSession(got["id"])
        if with_runtime:
            s.runtime, s.generations = got["runtime_id"], 1
        self.sessions.append(s)
        self.touched.add(s.id)

    @precondition(lambda self: self.sessions)
    @rule(data=st.data())
    def attach(self, data):
        # Only a first generation, or a refused one: a second generation makes unnamed writes
        # `runtime_required` (fencing), which this model keeps out of scope.
        candidates = [s for s in self.sessions if s.generations == 0 or s.runtime]
        if not candidates:
            return
        s = self.pick(data, candidates)
        resp = self.api.post(f"/sessions/{s.id}/runtimes", RUNTIME)
        if s.status in NEVER_AGAIN:
            self.expect(resp, 409, "illegal_transition")
        elif s.runtime:
            self.expect(resp, 409, "live_runtime_exists")
        elif s.status in HOLDS_RUN:  # a new runtime never takes over an open run: resume does
            self.expect(resp, 409, "open_run_exists")
        else:
            s.runtime, s.generations = self.expect(resp, 201)["id"], 1

    @precondition(lambda self: self.sessions)
    @rule(data=st.data())
    def start_run(self, data):
        s = self.pick(data, self.sessions)
        resp = self.api.post(f"/sessions/{s.id}/runs", self.fenced(s, {"cursor": {"step": 0}}))
        if s.status in HOLDS_RUN:
            self.expect(resp, 409, "open_run_exists")
        elif "running" not in LEGAL[s.status]:
            self.expect(resp, 409, "illegal_transition")
        elif not s.runtime:
            self.expect(resp, 409, "no_live_runtime")
        elif s.conflict:
            self.expect(resp, 409, "open_conflict")
        else:
            run = self.expect(resp, 201)
            s.runs[run["id"]] = "open"
            s.open_run, s.status = run["id"], "running"

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), to=st.sampled_from(STATUSES))
    def transition(self, data, to):
        target = to
        s = self.pick(data, self.sessions)
        resp = self.api.post(f"/sessions/{s.id}/transition", self.fenced(s, {"to": target, "reason": "model"}))
        if target not in LEGAL[s.status]:
            self.expect(resp, 409, "illegal_transition")
        elif target == "running" and (s.status not in HOLDS_RUN or s.open_run is None):
            self.expect(resp, 409, "no_open_run")
        elif target == "running" and not s.runtime:
            self.expect(resp, 409, "no_live_runtime")
        elif runtime_move(s.status, target) and not s.runtime:  # the runtime's own move needs it live
            self.expect(resp, 409, "no_live_runtime")
        elif target == "running" and s.conflict:
            self.expect(resp, 409, "open_conflict")
        else:
            self.expect(resp, 200)
            self.move(s, target)

    @precondition(lambda self: self.sessions)
    @rule(data=st.data())
    def close(self, data):
        s = self.pick(data, self.sessions)
        got = self.expect(self.api.post(f"/sessions/{s.id}/close", self.fenced(s, {})), 200)
        assert got["already_closed"] == (s.runtime is None), got
        if s.runtime:
            if s.status == "running":
                self.move(s, "idle", end="interrupted")
            s.runtime = None

    @precondition(lambda self: any(s.runtime for s in self.sessions))
    @rule(data=st.data())
    def crash_and_reconcile(self, data):
        """The runtime stops heartbeating: its lease runs out (in the database), the reconciler runs."""
        s = self.pick(data, [s for s in self.sessions if s.runtime])
        RuntimeAttachment.objects.filter(id=s.runtime).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        call_command("reconcile_runtimes", verbosity=0)
        s.runtime = None
        if s.status == "running":
            self.move(s, "failed", end="interrupted")

    @precondition(lambda self: any(s.runs for s in self.sessions))
    @rule(data=st.data(), replay=st.booleans())
    def hand_off(self, data, replay):
        with_runs = [s for s in self.sessions if s.runs]
        s = self.prefer(data, [s for s in with_runs if s.open_run and s.status in ("running", "awaiting_external")], with_runs)
        self.touched.add(s.id)
        mine = [h for h in self.handoffs if h.session == s.id]
        if replay and mine:  # the same logical id and job again: the first handoff is the answer
            h = data.draw(st.sampled_from(mine))
            got = self.expect(self.api.post(f"/runs/{h.run}/handoffs", {"logical_id": h.logical_id,
                                                                       "result_schema": SCHEMA}), (200, 201))
            assert got["id"] == h.id
            return
        run = s.open_run if s.open_run is not None else max(s.runs)
        self.n += 1
        logical_id = f"job-{self.n}"
        resp = self.api.post(f"/runs/{run}/handoffs", {"logical_id": logical_id, "result_schema": SCHEMA})
        if s.runs[run] != "open":
            self.expect(resp, 409, "run_not_open")
        elif s.status not in ("running", "awaiting_external"):
            self.expect(resp, 409, "session_not_running")
        elif not s.runtime:  # a runtime that was closed or lost hands nothing off (a replay still answers)
            self.expect(resp, 409, "no_live_runtime")
        else:
            got = self.expect(resp, 201)
            self.handoffs.append(MHandoff(got["id"], logical_id, s.id, run, got["job_fingerprint"]))
            if s.status == "running":
                s.status = "awaiting_external"

    @precondition(lambda self: self.handoffs)
    @rule(data=st.data())
    def claim(self, data):
        h = self.prefer(data, [h for h in self.handoffs if h.state == "pending"], self.handoffs)
        resp = self.api.post("/handoffs/claim", {"worker": "model", "capabilities": [], "handoff_id": h.id})
        if h.state != "pending" or self.session_of(h).status in ("terminated", "stale"):
            self.expect(resp, 409, "handoff_not_claimable")
        else:
            got = self.expect(resp, 200)["handoff"]
            h.state, h.token = "claimed", h.token + 1
            assert got["fencing_token"] == h.token

    @precondition(lambda self: any(h.token for h in self.handoffs))
    @rule(data=st.data(), text=st.sampled_from(["a", "b"]), stale=st.booleans())
    def deliver(self, data, text, stale):
        claimed = [h for h in self.handoffs if h.token]
        h = self.prefer(data, [h for h in claimed if h.state == "claimed"], claimed)
        token = h.token - 1 if stale and h.token > 1 else h.token
        resp = self.api.post(f"/handoffs/{h.id}/results",
                             {"fencing_token": token, "job_fingerprint": h.fingerprint, "result": {"text": text}})
        s = self.session_of(h)
        if h.consumed == text:
            assert self.expect(resp, 200)["outcome"] == "already_consumed"
        elif token != h.token:
            self.expect(resp, 409, "stale_lease")
        elif h.state == "cancelled":  # withdrawn when its session was terminated or went stale
            self.expect(resp, 409, "handoff_closed")
        elif h.consumed is not None:
            self.expect(resp, 409, "conflicting_result")
            if h.state != "conflicted":
                h.state = "conflicted"
                if "failed" in LEGAL[s.status]:
                    self.move(s, "failed")
                s.conflict = True
        else:
            assert self.expect(resp, 200)["outcome"] == "consumed"
            h.state, h.consumed = "bound", text
            self.settle(s, h)

    # The result pipeline takes several steps in a row: weigh its rules up (each name is a rule).
    hand_off_again, claim_again, deliver_again, deliver_once_more = hand_off, claim, deliver, deliver

    # ---- the server equals the model ------------------------------------------------------------
    @invariant()
    def server_equals_model(self):
        # Every session's status and conflict flag and every handoff's state and fencing token
        # (one list each); runtimes and runs of the sessions this step touched.
        sessions = {x["id"]: x for x in self.expect(self.api.get("/sessions", limit=200), 200)["items"]}
        assert set(sessions) == {s.id for s in self.sessions}
        for s in self.sessions:
            got = sessions[s.id]
            assert got["status"] == s.status, (got, s)
            assert bool(got["open_conflict"]) == s.conflict, (got, s)
        handoffs = {x["id"]: x for x in self.expect(self.api.get("/handoffs", limit=200), 200)["items"]}
        assert set(handoffs) == {h.id for h in self.handoffs}
        for h in self.handoffs:
            got = handoffs[h.id]
            assert (got["state"], got["fencing_token"]) == (h.state, h.token), (got, h)
        for s in self.sessions:
            if s.id not in self.touched:
                continue
            runtimes = self.expect(self.api.get(f"/sessions/{s.id}/runtimes"), 200)["items"]
            live = [r["id"] for r in runtimes if r["live"]]
            assert live == ([s.runtime] if s.runtime else []), (runtimes, s)
            runs = {r["id"]: r["state"] for r in self.expect(self.api.get(f"/sessions/{s.id}/runs"), 200)["items"]}
            assert runs == s.runs, (runs, s)
        self.touched.clear()


def test_the_server_always_equals_the_model():
    run_state_machine_as_test(
        LifecycleMachine,
        settings=settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck)),
    )
