"""The most fundamental refusal wins (docs/model.md#refusal-order): one table of (state, action) → code.

The order every session/run write checks in: not found → lifecycle legality → stale generation
→ missing runtime/run → conflict flags → business checks. So starting a run in a terminated,
completed or stale session is ``illegal_transition`` (with the allowed targets), never
``no_live_runtime`` ("attach a runtime" — which would not help). Every refusal writes nothing.
A runtime's own work on its run (here the cursor) needs a live runtime: after a close in a waiting
state the run stays open, but its cursor is ``no_live_runtime`` (docs/lifecycles.md, "Liveness is the lease").

States are built through the HTTP API with one token (generation 1, so unnamed writes are
accepted), except the ``resumed*`` rows (generation 2: an unnamed token write is
``runtime_required`` once the lifecycle allows the write at all).
"""
from __future__ import annotations

import pytest
from django.conf import settings

from novelforge_sessions.models import Session
from tests.support.factories import RUNTIME
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

OK = None
ACTIONS = ["to_running", "to_terminated", "close", "abort", "forget", "start_run", "cursor", "end_run", "transcript"]
I, NOR, NLR, LRE, ORE, RNO, RR = (
    "illegal_transition", "no_open_run", "no_live_runtime", "live_runtime_exists", "open_run_exists", "run_not_open",
    "runtime_required",
)
#                         to_running       to_terminated close abort forget start_run  cursor       end_run      transcript
EXPECTED = {
    "created":                [NOR,            I,          OK,  NOR,  LRE,   OK,          "not_found", "not_found", OK],
    "created_bare":           [NOR,            I,          OK,  NOR,  OK,    NLR,         "not_found", "not_found", OK],
    "running":                [I,              OK,         OK,  OK,   LRE,   ORE,         OK,          OK,          OK],
    "idle":                   [NOR,            OK,         OK,  NOR,  LRE,   OK,          RNO,         RNO,         OK],
    "idle_closed":            [NOR,            OK,         OK,  NOR,  OK,    NLR,         RNO,         RNO,         OK],
    "awaiting_user":          [OK,             OK,         OK,  OK,   LRE,   ORE,         OK,          I,           OK],
    "awaiting_user_closed":   [NLR,            OK,         OK,  OK,   OK,    ORE,         NLR,         I,           OK],
    "awaiting_external":      [OK,             OK,         OK,  OK,   LRE,   ORE,         OK,          I,           OK],
    "completed":              [I,              I,          OK,  NOR,  LRE,   I,           RNO,         RNO,         OK],
    "completed_closed":       [I,              I,          OK,  NOR,  OK,    I,           RNO,         RNO,         OK],
    "failed":                 [NOR,            OK,         OK,  NOR,  LRE,   OK,          RNO,         RNO,         OK],
    "stale":                  [I,              OK,         OK,  NOR,  LRE,   I,           RNO,         RNO,         OK],
    "stale_closed":           [I,              OK,         OK,  NOR,  OK,    I,           RNO,         RNO,         OK],
    "terminated":             [I,              I,          OK,  NOR,  OK,    I,           RNO,         RNO,         "session_terminated"],
    "awaiting_user_conflict": ["open_conflict", OK,        OK,  OK,   LRE,   ORE,         OK,          I,           OK],
    "idle_conflict":          [NOR,            OK,         OK,  NOR,  LRE,   "open_conflict", RNO,     RNO,         OK],
    "idle_full":              [NOR,            OK,         OK,  NOR,  LRE,   OK,          RNO,         RNO,         "transcript_full"],
    "resumed":                [I,              RR,         RR,  RR,   LRE,   ORE,         OK,          OK,          RR],
    "resumed_closed":         [RR,             RR,         OK,  NOR,  OK,    RR,          RNO,         RNO,         RR],
}
CASES = [(state, action, row[i]) for state, row in EXPECTED.items() for i, action in enumerate(ACTIONS)]

#: state → (how to reach it from a fresh attached session, as steps)
STEPS = {
    "created": [],
    "created_bare": [],
    "running": ["run"],
    "idle": ["run", "end"],
    "idle_closed": ["run", "close"],
    "awaiting_user": ["run", "to:awaiting_user"],
    "awaiting_user_closed": ["run", "to:awaiting_user", "close"],
    "awaiting_external": ["run", "to:awaiting_external"],
    "completed": ["run", "end:completed"],
    "completed_closed": ["run", "end:completed", "close"],
    "failed": ["run", "to:failed"],
    "stale": ["run", "to:stale"],
    "stale_closed": ["run", "to:stale", "close"],
    "terminated": ["run", "to:terminated"],
    "awaiting_user_conflict": ["run", "to:awaiting_user", "conflict"],
    "idle_conflict": ["run", "end", "conflict"],
    "idle_full": ["run", "end", "full"],
    "resumed": ["run", "checkpoint", "close", "resume"],
    "resumed_closed": ["run", "checkpoint", "close", "resume", "end:named", "close:named"],
}


def build(owner, new_session, state: str) -> dict:
    s = new_session(attach=state != "created_bare")
    sid, run_id, runtime_id = s["id"], None, s.get("runtime_id")

    def ok(resp):
        assert resp.status_code in (200, 201), resp.content
        return resp.json()

    for step in STEPS[state]:
        verb, _, arg = step.partition(":")
        if verb == "run":
            run_id = ok(owner.post(f"/sessions/{sid}/runs", {"cursor": {"step": "one"}}))["id"]
        elif verb == "end":
            body = {"outcome": "completed"}
            if arg == "completed":
                body["session_status"] = "completed"
            if arg == "named":
                body["runtime_id"] = runtime_id
            ok(owner.post(f"/runs/{run_id}/end", body))
        elif verb == "to":
            ok(owner.post(f"/sessions/{sid}/transition", {"to": arg}))
        elif verb == "close":
            ok(owner.post(f"/sessions/{sid}/close", {"runtime_id": runtime_id} if arg == "named" else {}))
        elif verb == "checkpoint":
            ok(owner.post(f"/runs/{run_id}/checkpoints", {"boundary": "context_freeze", "cursor": {"step": "one"}}))
        elif verb == "resume":
            report = ok(owner.post(f"/sessions/{sid}/resume", {"runtime": RUNTIME}))
            run_id, runtime_id = report["run_id"], report["runtime_id"]
        elif verb == "conflict":
            Session.objects.filter(id=sid).update(open_conflict="conflicting result for job-1")
        elif verb == "full":
            Session.objects.filter(id=sid).update(transcript_length=settings.TRANSCRIPT_MAX_ENTRIES)
    return {"id": sid, "run": run_id}


def perform(owner, session: dict, action: str):
    sid, run = session["id"], session["run"] or 10**9  # a session that never ran: its "run" is not found
    return {
        "to_running": lambda: owner.post(f"/sessions/{sid}/transition", {"to": "running"}),
        "to_terminated": lambda: owner.post(f"/sessions/{sid}/transition", {"to": "terminated"}),
        "close": lambda: owner.post(f"/sessions/{sid}/close", {}),
        "abort": lambda: owner.post(f"/sessions/{sid}/abort", {}),
        "forget": lambda: owner.delete(f"/sessions/{sid}"),
        "start_run": lambda: owner.post(f"/sessions/{sid}/runs", {}),
        "cursor": lambda: owner.post(f"/runs/{run}/cursor", {"cursor": {"step": "two"}}),
        "end_run": lambda: owner.post(f"/runs/{run}/end", {"outcome": "completed"}),
        "transcript": lambda: owner.post(f"/sessions/{sid}/transcript", {"role": "user", "content": "note"}),
    }[action]()


@pytest.mark.parametrize(("state", "action", "code"), CASES, ids=[f"{s}-{a}" for s, a, _ in CASES])
def test_the_most_fundamental_refusal_wins(owner, new_session, state, action, code):
    session = build(owner, new_session, state)
    before = snapshot()
    resp = perform(owner, session, action)
    if code is OK:
        assert resp.status_code in (200, 201, 204), resp.content
        return
    assert resp.json()["error"]["code"] == code, resp.content
    assert resp.status_code == (404 if code == "not_found" else 409)
    assert snapshot() == before


@pytest.mark.parametrize("state", ["completed_closed", "stale_closed", "terminated"])
def test_starting_a_run_where_running_cannot_be_entered_names_the_allowed_targets(owner, new_session, state):
    session = build(owner, new_session, state)
    status = Session.objects.get(id=session["id"]).status
    err = owner.post(f"/sessions/{session['id']}/runs", {}).json()["error"]
    assert err["code"] == "illegal_transition"
    allowed = {"completed": ["stale"], "stale": ["terminated"], "terminated": []}[status]
    assert err["details"] == {"record": "session", "from": status, "to": "running", "allowed": allowed}


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize(("state", "code"), [
    # can never run again: the lifecycle answers first, whatever its runtime (as attach does)
    ("completed", "illegal_transition"), ("stale", "illegal_transition"),
    ("completed_closed", "illegal_transition"), ("stale_closed", "illegal_transition"),
    ("terminated", "illegal_transition"),
    # may run again: closing the live runtime is the repair
    ("running", "live_runtime_exists"), ("idle", "live_runtime_exists"), ("awaiting_user", "live_runtime_exists"),
])
def test_resume_refuses_a_session_that_can_never_run_again_with_illegal_transition_first(
    owner, new_session, state, code, dry_run,
):
    """A completed or stale session whose runtime is still live was answered
    ``live_runtime_exists`` ("close it before resuming"), a repair that could not help."""
    session = build(owner, new_session, state)
    before = snapshot()
    resp = owner.post(f"/sessions/{session['id']}/resume", {"runtime": RUNTIME, "dry_run": dry_run})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == code, resp.content
    if code == "illegal_transition":
        status = Session.objects.get(id=session["id"]).status
        assert resp.json()["error"]["details"]["from"] == status
    assert snapshot() == before
