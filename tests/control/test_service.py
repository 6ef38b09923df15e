"""``control.service``: the control plane's one public interface (docs/model.md#the-control-plane).

Its functions take keyword arguments only and answer with typed results; each lease function
serves one handoff purpose and never touches the other; the review app reaches the control
plane only through it (and ``control.models``; errors are the pure core's ``errors``); the lease statements take
their status values as parameters."""
from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from novelforge_sessions.control import handoffs as handoff_actions
from novelforge_sessions.actions.lifecycle import Outbox, lock_session
from novelforge_sessions.control import service
from novelforge_sessions.control.models import Handoff, HandoffPurpose, HandoffState
from novelforge_sessions.errors import HandoffClosed, HandoffNotClaimable, NotFound, ReviewRouteRequired, StaleLease
from novelforge_sessions.models import Event, Run, Session
from tests.support.factories import caller_for
from tests.control.conftest import make_handoff

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ("create_job", "claim", "renew", "lease_refusal", "stale_lease", "bind", "cancel", "settle")


# ---- the interface's shape (no database) -----------------------------------------------------------
@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_function_takes_keyword_arguments_only(name):
    params = inspect.signature(getattr(service, name)).parameters.values()
    assert params and all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), name


def test_results_are_frozen_dataclasses():
    for cls in (service.Job, service.Claimed, service.Lease, service.Bound, service.Cancelled, service.Settled):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
    assert set(service.__all__) >= set(PUBLIC)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


CONTROL_PLANE = ("novelforge_sessions.control", "novelforge_sessions.control.handoffs",
                 "novelforge_sessions.control.results", "novelforge_sessions.control.intents",
                 "novelforge_sessions.control.bindings", "novelforge_sessions.control.routing")
ALLOWED = ("novelforge_sessions.control.service", "novelforge_sessions.control.models")


def test_reviews_reaches_the_control_plane_only_through_its_service():
    offending = []
    for path in sorted((ROOT / "reviews").rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for name in _imports(path):
            if name == "novelforge_sessions.control":
                continue  # `from novelforge_sessions.control import service` names the module below
            if name.startswith(CONTROL_PLANE) and not name.startswith(ALLOWED) \
                    and name != "novelforge_sessions.control.service":
                offending.append((path.relative_to(ROOT).as_posix(), name))
        text = path.read_text()
        for private in ("CLAIM_SQL", "HEARTBEAT_SQL", "raise_lease_refusal", "consume_locked", "settle_waiting_run",
                        "insert_handoff", "claim_row"):
            if private in text:
                offending.append((path.relative_to(ROOT).as_posix(), private))
    assert offending == []


def test_the_lease_and_slot_statements_take_status_values_as_parameters():
    from reviews import actions as review_actions

    statements = {"claim": handoff_actions._CLAIM_SQL, "heartbeat": handoff_actions._HEARTBEAT_SQL,
                  "eligible": review_actions._SLOT_ELIGIBLE_SQL}  # the slot's move is actions.lifecycle.move_rows
    words = {"pending", "claimed", "bound", "conflicted", "cancelled", "terminated", "stale", "job", "review", "agent",
             "complete", "submitted", "assigned", "open"}
    for name, sql in statements.items():
        quoted = set(re.findall(r"'([a-z_]+)'", sql))
        assert not quoted & words, (name, quoted & words)


# ---- behaviour ------------------------------------------------------------------------------------------
pytestmark_db = pytest.mark.django_db


@pytest.fixture
def jobs(owner, running, project) -> dict:
    """One plain job and one review-purpose handoff (made through the service) on one run."""
    job = make_handoff(owner, running["run"]["id"], "plain-1")
    who = caller_for(project)
    with transaction.atomic():
        session = lock_session(who, running["id"])
        run = Run.objects.select_for_update().get(id=running["run"]["id"])
        outbox = Outbox("test:reviews")
        made = service.create_job(
            session=session, run=run, logical_id="slot-1", inputs=[], params={"packet": 1},
            result_schema={"decision": "string"}, required_capabilities=["review"], timeout_seconds=60,
            purpose=HandoffPurpose.REVIEW, actor="test:reviews", outbox=outbox,
        )
        outbox.flush()
    assert isinstance(made, service.Job) and made.handoff.purpose == HandoffPurpose.REVIEW
    return {"project": project, "session_id": running["id"], "run_id": running["run"]["id"],
            "job": Handoff.objects.get(id=job["id"]), "slot": made.handoff}


def _claim(jobs: dict, purpose: HandoffPurpose, **kw) -> service.Claimed | None:
    with transaction.atomic():
        return service.claim(project_ids=[jobs["project"].id], capabilities=["review"], holder="h", purpose=purpose,
                             actor="test", **kw)


@pytestmark_db
def test_each_purpose_claims_only_its_own_handoffs(jobs):
    review = _claim(jobs, HandoffPurpose.REVIEW)
    assert isinstance(review, service.Claimed) and review.handoff_id == jobs["slot"].id
    assert (review.attempt, review.fencing_token, review.previous_holder, review.reclaimed_after_expiry) == (1, 1, None, False)
    assert _claim(jobs, HandoffPurpose.REVIEW) is None  # its lease is live
    job = _claim(jobs, HandoffPurpose.JOB)
    assert job is not None and job.handoff_id == jobs["job"].id
    assert _claim(jobs, HandoffPurpose.JOB) is None
    assert _claim(jobs, HandoffPurpose.JOB, handoff_id=jobs["slot"].id) is None
    assert Event.objects.filter(type="handoff.claimed").count() == 2
    # an expired review lease is re-claimable by the review route only
    Handoff.objects.filter(id=jobs["slot"].id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert _claim(jobs, HandoffPurpose.JOB) is None
    again = _claim(jobs, HandoffPurpose.REVIEW)
    assert again.previous_holder == "h" and again.reclaimed_after_expiry and again.fencing_token == 2


@pytestmark_db
def test_renew_and_its_refusals(jobs):
    pid = [jobs["project"].id]
    slot = jobs["slot"]
    refusal = service.lease_refusal(handoff_id=slot.id, fencing_token=1, project_ids=pid, purpose=HandoffPurpose.REVIEW)
    assert isinstance(refusal, StaleLease)  # token 1 was never issued
    refusal = service.lease_refusal(handoff_id=slot.id, fencing_token=0, project_ids=pid, purpose=HandoffPurpose.REVIEW)
    assert isinstance(refusal, HandoffNotClaimable)
    _claim(jobs, HandoffPurpose.REVIEW)
    lease = service.renew(handoff_id=slot.id, fencing_token=1, project_ids=pid, purpose=HandoffPurpose.REVIEW)
    assert isinstance(lease, service.Lease) and (lease.handoff_id, lease.attempt, lease.fencing_token) == (slot.id, 1, 1)
    with pytest.raises(ReviewRouteRequired):
        service.renew(handoff_id=slot.id, fencing_token=1, project_ids=pid, purpose=HandoffPurpose.JOB)
    with pytest.raises(NotFound):  # a review route never names a plain job
        service.renew(handoff_id=jobs["job"].id, fencing_token=1, project_ids=pid, purpose=HandoffPurpose.REVIEW)
    with pytest.raises(NotFound):
        service.renew(handoff_id=slot.id, fencing_token=1, project_ids=[jobs["project"].id + 1000],
                      purpose=HandoffPurpose.REVIEW)
    with pytest.raises(StaleLease):
        service.renew(handoff_id=slot.id, fencing_token=2, project_ids=pid, purpose=HandoffPurpose.REVIEW)


@pytestmark_db
def test_bind_then_settle_with_a_reason(jobs, project):
    _claim(jobs, HandoffPurpose.REVIEW)
    who = caller_for(project)
    # the plain job is cancelled first: the run still waits on the slot
    handoff_actions.cancel_handoff(who, jobs["job"].id)
    assert Session.objects.get(id=jobs["session_id"]).status == "awaiting_external"
    with transaction.atomic():
        session = lock_session(who, jobs["session_id"])
        slot = Handoff.objects.select_for_update().get(id=jobs["slot"].id)
        outbox = Outbox("test:reviews")
        bound = service.bind(session=session, handoff=slot, fencing_token=1, result={"decision": "pass"},
                             actor="test:reviews", outbox=outbox)
        settled = service.settle(session=session, run_id=jobs["run_id"], reason="review gate 9 bound", outbox=outbox)
        outbox.flush()
    assert isinstance(bound, service.Bound) and bound.result_hash.startswith("sha256:")
    assert settled == service.Settled(jobs["run_id"], (), "running", True)
    assert Handoff.objects.get(id=slot.id).state == HandoffState.BOUND
    s = Session.objects.get(id=jobs["session_id"])
    assert s.status == "running" and s.status_reason == "review gate 9 bound"


@pytestmark_db
def test_cancel_withdraws_unbound_handoffs_and_settles_with_its_reason(jobs, project):
    who = caller_for(project)
    with transaction.atomic():
        session = lock_session(who, jobs["session_id"])
        rows = list(Handoff.objects.select_for_update().filter(run_id=jobs["run_id"]).order_by("id"))
        outbox = Outbox("test")
        done = service.cancel(session=session, handoffs=rows, reason="gate withdrawn", outbox=outbox,
                              settle_reason="review gate 3 cancelled")
        outbox.flush()
    assert done == service.Cancelled((jobs["job"].id, jobs["slot"].id), (jobs["run_id"],))
    s = Session.objects.get(id=jobs["session_id"])
    assert s.status == "running" and s.status_reason == "review gate 3 cancelled"
    assert Event.objects.filter(type="handoff.cancelled", payload__reason="gate withdrawn").count() == 2
    with pytest.raises(HandoffClosed):
        raise service.lease_refusal(handoff_id=jobs["job"].id, fencing_token=0, project_ids=[project.id],
                                    purpose=HandoffPurpose.JOB)


def test_reviews_restates_no_claimability_and_locks_no_handoff_row():
    """The review app's claim goes through ``service.claim`` with its own ``Eligibility``: what is
    claimable (state, lease expiry) and the row lock (``SKIP LOCKED``) are the control plane's."""
    offending = []
    for path in sorted((ROOT / "reviews").rglob("*.py")):
        if "migrations" in path.parts:
            continue
        text = path.read_text()
        for spelled in ("SKIP LOCKED", "lease_expires_at <=", "claim_from", "order_lock_candidate",
                        "claim_in_oldest_session", "FOR UPDATE OF h"):
            if spelled in text:
                offending.append((path.relative_to(ROOT).as_posix(), spelled))
    assert offending == []
