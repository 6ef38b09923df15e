"""The hot path (docs/model.md#one-transaction-per-write): queries per claim, heartbeat and delivery are pinned.

``transaction=True`` so each action's ``atomic()`` is a real transaction, exactly as in
production: no test-wrapper savepoints in the counts, and BEGIN/COMMIT (which psycopg 3 logs)
are counted as the round trips they are.
"""
from __future__ import annotations

import pytest

from novelforge_sessions.control.handoffs import claim_handoff, create_handoff, heartbeat_handoff
from novelforge_sessions.control.results import deliver_result
from novelforge_sessions.actions.runs import start_run
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.sessions import NewSession, create_session
from novelforge_sessions.actions.tokens import create_token
from tests.support.factories import Api, caller_for, make_project

pytestmark = pytest.mark.django_db(transaction=True)


def test_claim_heartbeat_and_delivery_query_counts(django_assert_max_num_queries, django_assert_num_queries):
    project = make_project("hot")
    who = caller_for(project)
    s = create_session(who, NewSession("writer", "bounded", "drafting", "codex"), runtime=RuntimeSpec("codex"))
    run = start_run(who, s.id)
    h = create_handoff(who, run.id, logical_id="hot-1", result_schema={"text": "string"}).handoff

    # BEGIN, the candidate's session + its ordering lock (one statement), UPDATE … RETURNING (the
    # claim), its event, COMMIT
    with django_assert_num_queries(5):
        claimed = claim_handoff(who, worker="w", capabilities=[])
    with django_assert_num_queries(1):  # one conditional UPDATE
        heartbeat_handoff(who, claimed.id, fencing_token=claimed.fencing_token)
    kw = {"fencing_token": claimed.fencing_token, "job_fingerprint": h.job_fingerprint, "result": {"text": "x"}}
    # read handoff+receipt, BEGIN, the session's ordering lock, lock session, fenced UPDATE,
    # delivery, validation, receipt, remaining handoffs, run's pending list, open run, session
    # (→ running), 2 events, COMMIT
    with django_assert_max_num_queries(15):
        assert deliver_result(who, claimed.id, **kw).outcome == "consumed"
    with django_assert_num_queries(2):  # the duplicate: one read, its delivery-log row (autocommit)
        assert deliver_result(who, claimed.id, **kw).outcome == "already_consumed"

    # over HTTP the duplicate adds only the token lookup
    _, raw = create_token(project, name="w", permissions=["work"])
    api = Api(raw)
    body = {"fencing_token": claimed.fencing_token, "job_fingerprint": h.job_fingerprint, "result": {"text": "x"}}
    assert api.post(f"/handoffs/{claimed.id}/results", body).status_code == 200  # warms last_used_at
    with django_assert_num_queries(3):
        resp = api.post(f"/handoffs/{claimed.id}/results", body)
    assert resp.json()["outcome"] == "already_consumed"


def test_checkpoint_refs_cost_one_query_per_kind_of_ref(django_assert_num_queries):
    """Typed refs are resolved at write time: a checkpoint without refs runs none of those
    queries; refs add the run's scope, and approvals and each ``pending`` kind with refs one query each."""
    from novelforge_sessions.actions.artifacts import add_artifact_version, create_artifact
    from novelforge_sessions.control.checkpoints import record_checkpoint
    from novelforge_sessions.control.intents import create_intent, read_before_state

    project = make_project("refs")
    who = caller_for(project)
    s = create_session(who, NewSession("writer", "bounded", "drafting", "codex"), runtime=RuntimeSpec("codex"))
    run = start_run(who, s.id)
    create_handoff(who, run.id, logical_id="refs-1")
    art = create_artifact(who, name="ch", kind="chapter", content="one")
    v2 = add_artifact_version(who, art.id, content="two")
    before = read_before_state(who, kind="artifact.make_current", artifact_id=art.id)
    intent = create_intent(who, kind="artifact.make_current", idempotency_key="k", artifact_id=art.id,
                           before_fingerprint=before.fingerprint, params={"version_id": v2.id}).intent
    body = {"boundary": "context_freeze", "cursor": {"step": 1}}
    with django_assert_num_queries(1):  # the one statement: run lock, decision, insert, run, event
        record_checkpoint(who, run.id, {**body, "approvals": [], "pending": {"handoffs": [], "gates": []}})
    # + the run's scope, + the intents (with their approvals), + the session's named handoffs
    with django_assert_num_queries(4):
        record_checkpoint(who, run.id, {**body, "approvals": [{"write_intent_id": intent.id}],
                                        "pending": {"handoffs": ["refs-1"], "gates": []}})
