"""The result pipeline: delivery ≠ validation ≠ consumption (docs/model.md#results-and-idempotent-delivery)."""
from __future__ import annotations

import pytest

from novelforge_sessions.control import results as actions
from novelforge_sessions.control.fingerprints import fingerprint
from novelforge_sessions.control.models import ConsumeReceipt, Handoff, ResultDelivery, ResultValidation
from novelforge_sessions.models import Event, Run, Session
from tests.support.factories import caller_for
from tests.control.conftest import Statements, claim, deliver, make_handoff
from tests.support.responses import ok, refused
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

GOOD = {"verdict": "consistent", "notes": ["ok"]}
OTHER = {"verdict": "inconsistent"}


@pytest.fixture
def claimed(worker, frozen) -> dict:
    return {**frozen, "handoff": claim(worker, ["continuity"])}


def test_a_valid_result_is_consumed_once_and_the_run_continues(worker, claimed):
    h = claimed["handoff"]
    body = ok(deliver(worker, h, GOOD))
    assert body["outcome"] == "consumed" and body["handoff_state"] == "bound"
    assert body["session_status"] == "running"
    receipt = ConsumeReceipt.objects.get()
    assert (receipt.logical_id, receipt.result_hash, receipt.result) == (h["logical_id"], fingerprint(GOOD), GOOD)
    assert receipt.delivery_id == body["delivery_id"] == body["original"]["delivery_id"]
    validation = ResultValidation.objects.get()
    assert validation.valid and validation.cites_job_fingerprint and validation.delivery_id == body["delivery_id"]
    session = Session.objects.get(id=claimed["session"]["id"])
    assert session.status == "running"
    run = Run.objects.get(id=claimed["run"]["id"])
    assert run.state == "open" and run.pending_external == []
    types = list(Event.objects.filter(session_id=session.id).order_by("-id").values_list("type", flat=True)[:2])
    assert types == ["session.transitioned", "handoff.result_consumed"]


def test_the_session_waits_until_every_result_of_the_run_is_bound(owner, worker, claimed):
    second = make_handoff(owner, claimed["run"]["id"], "chapter-1/style")
    ok(deliver(worker, claimed["handoff"], GOOD))
    assert Session.objects.get(id=claimed["session"]["id"]).status == "awaiting_external"
    assert Run.objects.get(id=claimed["run"]["id"]).pending_external == ["chapter-1/style"]
    got = claim(worker, [], handoff_id=second["id"])
    ok(deliver(worker, got, {"x": 1}))
    assert Session.objects.get(id=claimed["session"]["id"]).status == "running"


def test_the_same_result_again_is_already_consumed_and_adds_only_a_log_row(worker, claimed):
    first = ok(deliver(worker, claimed["handoff"], GOOD))
    before, deliveries = snapshot(exclude=["ResultDelivery"]), ResultDelivery.objects.count()
    again = ok(deliver(worker, claimed["handoff"], GOOD))
    assert again["outcome"] == "already_consumed"
    assert again["receipt"] == first["receipt"]  # the original outcome
    assert again["original"] == {"outcome": "consumed", "delivery_id": first["delivery_id"],
                                 "consumed_at": first["receipt"]["consumed_at"]}
    assert again["delivery_id"] != first["delivery_id"]
    before.assert_unchanged("nothing new but the log row")
    assert ResultDelivery.objects.count() == deliveries + 1
    dup = ResultDelivery.objects.get(id=again["delivery_id"])
    assert dup.outcome == "already_consumed" and dup.payload is None and dup.result_hash == fingerprint(GOOD)


def test_key_order_does_not_make_a_different_result(worker, claimed):
    ok(deliver(worker, claimed["handoff"], {"a": 1, "verdict": "x"}))
    assert ok(deliver(worker, claimed["handoff"], {"verdict": "x", "a": 1}))["outcome"] == "already_consumed"


def test_deliver_query_counts(worker, claimed, project):
    who = caller_for(project, ["read", "work"])
    h = claimed["handoff"]
    kw = {"fencing_token": h["fencing_token"], "job_fingerprint": h["job_fingerprint"]}
    with Statements() as first:
        actions.deliver_result(who, h["id"], result=GOOD, **kw)
    # read, the session's ordering lock, lock session, fenced UPDATE, delivery, validation,
    # receipt, pending list, run, session transition, 2 events
    assert len(first) <= 13, first.sql
    with Statements() as dup:
        assert actions.deliver_result(who, h["id"], result=GOOD, **kw).outcome == "already_consumed"
    assert len(dup) == 2, dup.sql  # the handoff+receipt read and the delivery-log row
    assert dup.sql[1].startswith("INSERT INTO \"control_resultdelivery\"")


def test_a_different_result_is_a_hard_stop(worker, claimed):
    first = ok(deliver(worker, claimed["handoff"], GOOD))
    err = refused(deliver(worker, claimed["handoff"], OTHER), 409, "conflicting_result")
    assert err["details"]["consumed_hash"] == fingerprint(GOOD)
    assert err["details"]["delivered_hash"] == fingerprint(OTHER)
    assert err["details"]["session_status"] == "failed"
    session = Session.objects.get(id=claimed["session"]["id"])
    assert session.status == "failed" and session.status_reason == "conflicting_result: chapter-1/continuity"
    assert Run.objects.get(id=claimed["run"]["id"]).state == "failed"
    receipt = ConsumeReceipt.objects.get()  # still one, unchanged
    assert receipt.result == GOOD and receipt.delivery_id == first["delivery_id"]
    assert Handoff.objects.get().state == "conflicted"
    ev = Event.objects.get(type="handoff.result_conflict")
    assert ev.payload["conflicting_hash"] == fingerprint(OTHER) and ev.session_id == session.id
    # the identical result is still answered with the original outcome
    assert ok(deliver(worker, claimed["handoff"], GOOD))["outcome"] == "already_consumed"
    # a second conflicting arrival: refused again, logged, no second conflict event
    refused(deliver(worker, claimed["handoff"], {"verdict": "third"}), 409, "conflicting_result")
    assert Event.objects.filter(type="handoff.result_conflict").count() == 1
    assert list(ResultDelivery.objects.order_by("id").values_list("outcome", flat=True)) == [
        "consumed", "conflicting_result", "already_consumed", "conflicting_result"]


def test_a_conflict_where_the_table_forbids_failed_sets_open_conflict(owner, worker, claimed):
    ok(deliver(worker, claimed["handoff"], GOOD))
    ok(owner.post(f"/runs/{claimed['run']['id']}/end", {"outcome": "completed", "session_status": "completed"}))
    err = refused(deliver(worker, claimed["handoff"], OTHER), 409, "conflicting_result")
    session = Session.objects.get(id=claimed["session"]["id"])
    assert session.status == "completed"  # completed → failed is not in the table
    assert session.open_conflict == "conflicting_result: chapter-1/continuity"
    assert err["details"]["open_conflict"] == session.open_conflict
    assert ok(owner.get(f"/sessions/{session.id}"))["open_conflict"] == session.open_conflict
    assert Event.objects.filter(type="handoff.result_conflict").count() == 1


def test_a_manager_resolves_a_conflict_and_the_consumed_result_stands(owner, worker, manager, claimed):
    ok(deliver(worker, claimed["handoff"], GOOD))
    ok(owner.post(f"/runs/{claimed['run']['id']}/end", {"outcome": "completed"}))  # idle
    refused(deliver(worker, claimed["handoff"], OTHER), 409, "conflicting_result")
    refused(worker.post(f"/handoffs/{claimed['handoff']['id']}/resolve-conflict", {"resolution": "x"}), 403, "forbidden")
    done = ok(manager.post(f"/handoffs/{claimed['handoff']['id']}/resolve-conflict", {"resolution": "kept the first"}))
    assert done["state"] == "bound" and done["receipt"]["result"] == GOOD
    session = Session.objects.get(id=claimed["session"]["id"])
    assert session.open_conflict == "" and session.status == "idle"
    assert ConsumeReceipt.objects.count() == 1
    refused(manager.post(f"/handoffs/{claimed['handoff']['id']}/resolve-conflict", {"resolution": "again"}), 409, "no_open_conflict")


def test_a_superseded_holder_with_another_result_is_a_stale_lease_not_a_conflict(worker, claimed):
    from tests.control.test_handoffs import expire

    expire(claimed["handoff"]["id"])
    second = claim(worker, ["continuity"], worker="w-b")
    ok(deliver(worker, second, GOOD))
    refused(deliver(worker, claimed["handoff"], OTHER, token=1), 409, "stale_lease")
    assert Session.objects.get(id=claimed["session"]["id"]).status == "running"
    assert Handoff.objects.get().state == "bound"
    # its copy of the *same* result is still recognised as a duplicate
    assert ok(deliver(worker, claimed["handoff"], GOOD, token=1))["outcome"] == "already_consumed"


def test_an_invalid_result_is_logged_validated_and_not_consumed(worker, claimed):
    err = refused(deliver(worker, claimed["handoff"], {"verdict": 3}), 422, "invalid_result")
    assert err["details"]["errors"] == [{"path": "result.verdict", "message": "must be of type string"}]
    err = refused(deliver(worker, claimed["handoff"], GOOD, job="sha256:" + "0" * 64), 422, "invalid_result")
    assert err["details"]["errors"][0]["path"] == "job_fingerprint"
    assert ConsumeReceipt.objects.count() == 0
    assert list(ResultValidation.objects.order_by("id").values_list("valid", "cites_job_fingerprint")) == [
        (False, True), (False, False)]
    assert Event.objects.filter(type="handoff.result_invalid").count() == 2
    assert Session.objects.get(id=claimed["session"]["id"]).status == "awaiting_external"
    # a valid result afterwards is consumed normally
    assert ok(deliver(worker, claimed["handoff"], GOOD))["outcome"] == "consumed"


def test_a_result_before_any_claim_is_refused_and_logged(worker, frozen):
    refused(deliver(worker, {**frozen["handoff"], "fencing_token": 0}, GOOD, token=1), 409, "stale_lease")
    h = claim(worker, ["continuity"])
    ok(worker.post(f"/handoffs/{h['id']}/heartbeat", {"fencing_token": 1}))
    assert ResultDelivery.objects.get().outcome == "stale_lease"


def test_a_result_for_a_cancelled_handoff_is_refused(owner, worker, claimed):
    ok(owner.post(f"/handoffs/{claimed['handoff']['id']}/cancel", {}))
    refused(deliver(worker, claimed["handoff"], GOOD), 409, "handoff_closed")
    assert ConsumeReceipt.objects.count() == 0
    assert ResultDelivery.objects.get().outcome == "not_claimable"


def test_a_stated_hash_must_match(worker, claimed):
    h = claimed["handoff"]
    resp = worker.post(f"/handoffs/{h['id']}/results", {"fencing_token": 1, "job_fingerprint": h["job_fingerprint"],
                                                         "result": GOOD, "result_hash": "sha256:" + "1" * 64})
    refused(resp, 422, "result_hash_mismatch")
    resp = worker.post(f"/handoffs/{h['id']}/results", {"fencing_token": 1, "job_fingerprint": h["job_fingerprint"],
                                                         "result": GOOD, "result_hash": fingerprint(GOOD)})
    assert ok(resp)["outcome"] == "consumed"


def test_delivering_needs_work_and_sees_only_its_project(writer, outsider, claimed):
    refused(deliver(writer, claimed["handoff"], GOOD), 403, "forbidden")
    refused(deliver(outsider, claimed["handoff"], GOOD), 404, "not_found")
    assert ResultDelivery.objects.count() == 0


def test_the_delivery_log_and_receipts_are_readable(worker, reader, claimed):
    ok(deliver(worker, claimed["handoff"], GOOD))
    ok(deliver(worker, claimed["handoff"], GOOD))
    log = ok(reader.get(f"/handoffs/{claimed['handoff']['id']}/deliveries"))["items"]
    assert [d["outcome"] for d in log] == ["consumed", "already_consumed"]
    assert log[0]["validation"]["valid"] is True and log[1]["validation"] is None
    receipts = ok(reader.get("/receipts", logical_id="chapter-1/continuity"))["items"]
    assert len(receipts) == 1 and receipts[0]["result"] == GOOD
    got = ok(reader.get(f"/handoffs/{claimed['handoff']['id']}"))
    assert got["state"] == "bound" and got["receipt"]["id"] == receipts[0]["id"]


def test_a_consumed_logical_id_is_never_handed_off_again(owner, worker, claimed, new_session):
    ok(deliver(worker, claimed["handoff"], GOOD))
    ok(owner.post(f"/runs/{claimed['run']['id']}/end", {"outcome": "completed"}))
    ok(owner.post(f"/sessions/{claimed['session']['id']}/close", {}))
    assert owner.delete(f"/sessions/{claimed['session']['id']}").status_code == 204
    receipt = ConsumeReceipt.objects.get()  # outlives the forgotten session
    assert receipt.handoff_id is None and receipt.result == GOOD
    fresh = new_session(run=True)
    refused(owner.post(f"/runs/{fresh['run']['id']}/handoffs", {"logical_id": "chapter-1/continuity"}), 409, "already_consumed")


def test_a_fencing_token_beyond_bigint_is_422_and_logs_nothing(worker, claimed):
    """The token is stored with every delivery (a bigint): refused before anything is written."""
    before = snapshot()
    refused(deliver(worker, claimed["handoff"], GOOD, token=2**63), 422, "validation_error", "fencing_token",
            unchanged=before)
    assert Handoff.objects.get(id=claimed["handoff"]["id"]).state == "claimed"


# ---- result schemas are JSON Schema (jsonschema validates them) ------------------------------------
FULL_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "required": ["verdict", "score"],
    "properties": {"verdict": {"enum": ["pass", "revise"]}, "score": {"type": "integer", "minimum": 1, "maximum": 5},
                   "notes": {"type": "array", "items": {"type": "string"}}},
}


def test_a_full_json_schema_is_enforced_with_every_problem_named(owner, worker, running):
    from novelforge_sessions.control.models import ConsumeReceipt, ResultValidation

    handoff = make_handoff(owner, running["run"]["id"], "schema-job", result_schema=FULL_SCHEMA)
    lease = claim(worker)
    assert lease["id"] == handoff["id"]
    err = refused(deliver(worker, lease, {"verdict": "maybe", "score": 9, "notes": ["ok", 3]}), 422, "invalid_result")
    assert err["details"]["errors"] == [
        {"path": "result.notes[1]", "message": "3 is not of type 'string'"},
        {"path": "result.score", "message": "9 is greater than the maximum of 5"},
        {"path": "result.verdict", "message": "'maybe' is not one of ['pass', 'revise']"},
    ]
    assert not ConsumeReceipt.objects.filter(logical_id="schema-job").exists()
    assert ResultValidation.objects.filter(valid=False).count() == 1
    assert ok(deliver(worker, lease, {"verdict": "pass", "score": 4}))["outcome"] == "consumed"


def test_a_malformed_json_schema_is_refused_at_handoff_time_naming_its_path(owner, running):
    from novelforge_sessions.control.models import Handoff

    bad = {**FULL_SCHEMA, "properties": {"score": {"type": "integer", "minimum": "one"}}}
    err = refused(owner.post(f"/runs/{running['run']['id']}/handoffs", {"logical_id": "bad-schema", "result_schema": bad}),
                  422, "validation_error")
    assert err["details"]["field"] == "result_schema.properties.score.minimum"
    wrong_dialect = {**FULL_SCHEMA, "$schema": "http://json-schema.org/draft-04/schema#"}
    err = refused(owner.post(f"/runs/{running['run']['id']}/handoffs",
                             {"logical_id": "bad-schema", "result_schema": wrong_dialect}), 422, "validation_error")
    assert err["details"]["field"] == "result_schema.$schema"
    assert not Handoff.objects.filter(logical_id="bad-schema").exists()
