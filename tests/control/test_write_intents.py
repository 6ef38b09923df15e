"""Write intents: before-state CAS, idempotency, approval, post-condition (docs/model.md#write-intents-and-authority)."""
from __future__ import annotations

import pytest

from novelforge_sessions.control import intents as actions
from novelforge_sessions.errors import StalePrecondition
from novelforge_sessions.control.fingerprints import fingerprint
from novelforge_sessions.control.models import Approval, AuthorityChange, WriteIntent
from novelforge_sessions.models import Artifact, Event, Project
from tests.support.factories import caller_for, make_project
from tests.control.conftest import make_artifact, token_api
from tests.support.responses import ok, refused
from tests.support.races import race

pytestmark = pytest.mark.django_db


def before(api, kind: str, artifact_id: int | None = None) -> str:
    params = {"kind": kind} if artifact_id is None else {"kind": kind, "artifact_id": artifact_id}
    return ok(api.get("/write-intents/before-state", **params))["before_fingerprint"]


@pytest.fixture
def draft(owner) -> dict:
    """An artifact with two versions; v1 current."""
    art = make_artifact(owner, "chapter-2", "first draft")
    v2 = ok(owner.post(f"/artifacts/{art['id']}/versions", {"content": "second draft"}), 201)
    return {"artifact": art, "v2": v2}


def propose_current(api, draft: dict, key: str = "make-v2-current", **extra) -> dict:
    art = draft["artifact"]
    return api.post("/write-intents", {
        "kind": "artifact.make_current", "idempotency_key": key, "artifact_id": art["id"],
        "params": {"version_id": draft["v2"]["id"]}, "before_fingerprint": before(api, "artifact.make_current", art["id"]),
        **extra,
    })


def test_before_state_is_the_fingerprint_of_the_current_state(owner, draft):
    art = draft["artifact"]
    got = ok(owner.get("/write-intents/before-state", kind="artifact.make_current", artifact_id=art["id"]))
    state = {"artifact_id": art["id"], "current_version_id": art["current_version_id"], "fingerprint": art["current_fingerprint"]}
    assert got["state"] == state and got["before_fingerprint"] == fingerprint(state)
    auth = ok(owner.get("/write-intents/before-state", kind="authority.settle"))
    assert auth["state"] == {"authority_version": 1, "lock_fingerprint": "sha256:" + "a" * 64}
    refused(owner.get("/write-intents/before-state", kind="artifact.make_current", artifact_id=999), 404, "not_found")
    refused(owner.get("/write-intents/before-state", kind="delete.everything"), 422, "validation_error")


def test_propose_approve_execute_makes_the_version_current(owner, manager, draft):
    intent = ok(propose_current(owner, draft), 201)
    assert intent["state"] == "proposed" and intent["requires_approval"] is True and intent["approval"] is None
    refused(owner.post(f"/write-intents/{intent['id']}/execute"), 409, "approval_required")
    assert Artifact.objects.get().current_version_id == draft["artifact"]["current_version_id"]
    approved = ok(manager.post(f"/write-intents/{intent['id']}/approve", {"note": "reads well"}))
    assert approved["state"] == "approved" and approved["approval"]["approver"].startswith("token:manager")
    assert approved["approval_valid"] is True
    done = ok(owner.post(f"/write-intents/{intent['id']}/execute"))
    assert done["state"] == "executed" and done["replayed"] is False
    artifact = Artifact.objects.select_related("current_version").get()
    assert artifact.current_version_id == draft["v2"]["id"]
    after = {"artifact_id": artifact.id, "current_version_id": draft["v2"]["id"], "fingerprint": draft["v2"]["fingerprint"]}
    assert done["postcondition"] == {"expected": fingerprint(after), "observed": fingerprint(after), "ok": True}
    assert done["after_fingerprint"] == fingerprint(after) and done["outcome"]["after"] == after
    types = list(Event.objects.filter(type__startswith="write_intent.").order_by("id").values_list("type", flat=True))
    assert types == ["write_intent.created", "write_intent.approved", "write_intent.executed"]
    assert Event.objects.filter(type="artifact.current_changed").count() == 1


def test_replaying_execute_returns_the_first_outcome_and_writes_nothing(owner, manager, draft):
    intent = ok(propose_current(owner, draft), 201)
    ok(manager.post(f"/write-intents/{intent['id']}/approve"))
    first = ok(owner.post(f"/write-intents/{intent['id']}/execute"))
    events = Event.objects.count()
    again = ok(owner.post(f"/write-intents/{intent['id']}/execute"))
    assert again["replayed"] is True
    assert {k: again[k] for k in ("outcome", "postcondition", "executed_at")} == {
        k: first[k] for k in ("outcome", "postcondition", "executed_at")}
    assert Event.objects.count() == events


def test_replaying_the_idempotency_key_returns_the_same_intent(owner, draft):
    first = ok(propose_current(owner, draft), 201)
    again = ok(propose_current(owner, draft), 200)
    assert again["id"] == first["id"] and again["replayed"] is True
    assert WriteIntent.objects.count() == 1
    # the same key for a different request is refused
    art = draft["artifact"]
    err = refused(owner.post("/write-intents", {
        "kind": "artifact.make_current", "idempotency_key": "make-v2-current", "artifact_id": art["id"],
        "params": {"version_id": art["current_version_id"]},
        "before_fingerprint": before(owner, "artifact.make_current", art["id"])}), 409, "idempotency_key_reused")
    assert err["details"]["intent_id"] == first["id"]


def test_a_stale_before_state_is_refused_at_creation(owner, draft):
    art = draft["artifact"]
    stale = fingerprint({"artifact_id": art["id"], "current_version_id": draft["v2"]["id"], "fingerprint": draft["v2"]["fingerprint"]})
    err = refused(owner.post("/write-intents", {
        "kind": "artifact.make_current", "idempotency_key": "k", "artifact_id": art["id"],
        "params": {"version_id": draft["v2"]["id"]}, "before_fingerprint": stale}), 409, "stale_precondition")
    assert err["details"]["current"] == before(owner, "artifact.make_current", art["id"])
    assert WriteIntent.objects.count() == 0


def test_execution_is_a_compare_and_swap_on_the_before_state(owner, manager, draft, project):
    Project.objects.filter(id=project.id).update(requires_write_approval=False)
    first = ok(propose_current(owner, draft, key="a"), 201)
    # a competing intent made against the same before-state executes first
    art = draft["artifact"]
    v3 = ok(owner.post(f"/artifacts/{art['id']}/versions", {"content": "third"}), 201)
    rival = ok(owner.post("/write-intents", {
        "kind": "artifact.make_current", "idempotency_key": "b", "artifact_id": art["id"], "params": {"version_id": v3["id"]},
        "before_fingerprint": first["before_fingerprint"]}), 201)
    ok(owner.post(f"/write-intents/{rival['id']}/execute"))
    err = refused(owner.post(f"/write-intents/{first['id']}/execute"), 409, "stale_precondition")
    assert err["details"]["stated"] == first["before_fingerprint"]
    assert Artifact.objects.get().current_version_id == v3["id"]  # the stale write did not happen
    refusal = WriteIntent.objects.get(id=first["id"])
    assert refusal.state == "refused" and refusal.refusal_code == "stale_precondition"
    assert Event.objects.filter(type="write_intent.refused").count() == 1
    # replaying the refused intent returns its first outcome: the same refusal, nothing new
    events = Event.objects.count()
    err2 = refused(owner.post(f"/write-intents/{first['id']}/execute"), 409, "stale_precondition")
    assert err2["details"]["replayed"] is True and err2["details"]["current"] == err["details"]["current"]
    assert Event.objects.count() == events


def test_approving_needs_the_approve_permission(owner, writer, worker, draft):
    intent = ok(propose_current(writer, draft), 201)
    refused(writer.post(f"/write-intents/{intent['id']}/approve"), 403, "forbidden")
    refused(worker.post(f"/write-intents/{intent['id']}/approve"), 403, "forbidden")
    assert Approval.objects.count() == 0
    refused(writer.post(f"/write-intents/{intent['id']}/execute"), 409, "approval_required")


def test_session_state_role_and_metadata_grant_no_write_authority(owner, manager, project, draft, new_session):
    """A manager-role session, completed, whose provider metadata claims admin rights and an
    approval, with a token bound to it that holds every permission but `approve`: still no write."""
    s = new_session(role="manager", provider_metadata={"role": "admin", "approved": True, "can_write_canon": True})
    art = draft["artifact"]  # given to the session by its run's frozen inputs (a bound token reaches only those)
    frozen = [{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}]
    ok(owner.post(f"/sessions/{s['id']}/runs", {"frozen_inputs": frozen}), 201)
    run = ok(owner.get(f"/sessions/{s['id']}/runs"))["items"][0]
    ok(owner.post(f"/runs/{run['id']}/end", {"outcome": "completed", "session_status": "completed"}))
    bound = token_api(project, "manager-session", ["read", "write", "work", "review"], session_id=s["id"])
    intent = ok(propose_current(bound, draft, session_id=s["id"], run_id=run["id"]), 201)
    assert intent["session_id"] == s["id"]
    err = refused(bound.post(f"/write-intents/{intent['id']}/execute"), 409, "approval_required")
    assert err["details"]["reason"] == "missing"
    refused(bound.post(f"/write-intents/{intent['id']}/approve"), 403, "forbidden")
    assert Artifact.objects.get().current_version_id == draft["artifact"]["current_version_id"]
    # only an approval changes the answer
    ok(manager.post(f"/write-intents/{intent['id']}/approve"))
    assert ok(bound.post(f"/write-intents/{intent['id']}/execute"))["state"] == "executed"


def test_a_revoked_or_outdated_approval_no_longer_authorises(owner, manager, draft):
    intent = ok(propose_current(owner, draft), 201)
    ok(manager.post(f"/write-intents/{intent['id']}/approve"))
    revoked = ok(manager.post(f"/write-intents/{intent['id']}/revoke-approval", {"note": "wait"}))
    assert revoked["state"] == "proposed" and revoked["approval"] is None
    refused(owner.post(f"/write-intents/{intent['id']}/execute"), 409, "approval_required")
    ok(manager.post(f"/write-intents/{intent['id']}/approve"))
    # the authority moves on after the approval: the approval is outdated
    settle = settle_intent(owner, draft, key="settle")
    ok(manager.post(f"/write-intents/{settle['id']}/approve"))
    ok(owner.post(f"/write-intents/{settle['id']}/execute"))
    err = refused(owner.post(f"/write-intents/{intent['id']}/execute"), 409, "approval_required")
    assert err["details"]["reason"] == "authority_changed"
    assert ok(owner.get(f"/write-intents/{intent['id']}"))["approval_valid"] is False
    reapproved = ok(manager.post(f"/write-intents/{intent['id']}/approve"))  # re-approve
    assert reapproved["approval"]["authority_version"] == 2 and reapproved["approval_valid"] is True
    assert Approval.objects.filter(intent_id=intent["id"]).count() == 3
    assert ok(owner.post(f"/write-intents/{intent['id']}/execute"))["state"] == "executed"


def test_a_rejected_intent_is_final(owner, manager, draft):
    intent = ok(propose_current(owner, draft), 201)
    assert ok(manager.post(f"/write-intents/{intent['id']}/reject", {"note": "no"}))["state"] == "rejected"
    refused(owner.post(f"/write-intents/{intent['id']}/execute"), 409, "intent_closed")
    refused(manager.post(f"/write-intents/{intent['id']}/approve"), 409, "intent_closed")


def settle_intent(api, draft: dict, key: str = "settle-1") -> dict:
    art = draft["artifact"]
    current = ok(api.get(f"/artifacts/{art['id']}"))
    return ok(api.post("/write-intents", {
        "kind": "authority.settle", "idempotency_key": key, "before_fingerprint": before(api, "authority.settle"),
        "params": {"artifacts": [{"artifact_id": art["id"], "fingerprint": current["current_fingerprint"]}], "note": "canon"},
    }), 201)


def test_a_canon_settlement_bumps_authority_and_lock(owner, manager, draft, project):
    intent = settle_intent(owner, draft)
    ok(manager.post(f"/write-intents/{intent['id']}/approve"))
    done = ok(owner.post(f"/write-intents/{intent['id']}/execute"))
    project.refresh_from_db()
    assert project.authority_version == 2
    expected_lock = fingerprint({"previous_lock": "sha256:" + "a" * 64, "authority_version": 2,
                                 "artifacts": intent["params"]["artifacts"]})
    assert project.lock_fingerprint == expected_lock
    assert done["outcome"]["after"] == {"authority_version": 2, "lock_fingerprint": expected_lock}
    change = AuthorityChange.objects.get()
    assert change.before == {"authority_version": 1, "lock_fingerprint": "sha256:" + "a" * 64}
    assert ok(owner.get("/authority/changes"))["items"][0]["intent_id"] == intent["id"]
    assert ok(owner.get("/project"))["authority_version"] == 2
    assert Event.objects.filter(type="authority.settled").count() == 1


def test_a_settlement_of_artifacts_that_moved_is_stale(owner, manager, draft, project):
    Project.objects.filter(id=project.id).update(requires_write_approval=False)
    intent = settle_intent(owner, draft)
    ok(propose_current(owner, draft, key="move"), 201)
    ok(owner.post(f"/write-intents/{WriteIntent.objects.get(idempotency_key='move').id}/execute"))
    err = refused(owner.post(f"/write-intents/{intent['id']}/execute"), 409, "stale_precondition")
    assert err["details"]["settled_artifacts_not_current"][0]["artifact_id"] == draft["artifact"]["id"]
    project.refresh_from_db()
    assert project.authority_version == 1


def test_a_framework_change(owner, manager, project):
    intent = ok(owner.post("/write-intents", {
        "kind": "framework.change", "idempotency_key": "fw-2", "before_fingerprint": before(owner, "framework.change"),
        "params": {"framework_version": "2"}}), 201)
    ok(manager.post(f"/write-intents/{intent['id']}/approve"))
    ok(owner.post(f"/write-intents/{intent['id']}/execute"))
    project.refresh_from_db()
    assert project.framework_version == "2" and project.authority_version == 1
    assert AuthorityChange.objects.get().after == {"framework_version": "2"}
    refused(owner.post("/write-intents", {
        "kind": "framework.change", "idempotency_key": "fw-2b", "before_fingerprint": before(owner, "framework.change"),
        "params": {"framework_version": "2"}}), 422, "validation_error")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "artifact.make_current", "params": {"version_id": "1"}}, "params.version_id"),
        ({"kind": "authority.settle", "params": {"artifacts": []}}, "params.artifacts"),
        ({"kind": "framework.change", "params": {"framework_version": "two words"}}, "params.framework_version"),
        ({"kind": "framework.change", "artifact_id": 1, "params": {"framework_version": "3"}}, "artifact_id"),
    ],
)
def test_bad_intents_are_typed_and_write_nothing(owner, draft, body, field):
    if body["kind"] == "artifact.make_current":
        body = {**body, "artifact_id": draft["artifact"]["id"]}
    err = refused(owner.post("/write-intents", {"idempotency_key": "k", "before_fingerprint": "sha256:" + "0" * 64, **body}),
                  422, "validation_error")
    assert err["details"]["field"] == field
    assert WriteIntent.objects.count() == 0


def test_intents_of_other_projects_are_not_found(outsider, owner, draft):
    intent = ok(propose_current(owner, draft), 201)
    refused(outsider.get(f"/write-intents/{intent['id']}"), 404, "not_found")
    refused(outsider.post(f"/write-intents/{intent['id']}/execute"), 404, "not_found")
    refused(outsider.post(f"/write-intents/{intent['id']}/approve"), 404, "not_found")


@pytest.mark.django_db(transaction=True)
def test_racing_intents_on_one_before_state_only_one_writes():
    from novelforge_sessions.actions.artifacts import add_artifact_version, create_artifact

    project = make_project("cas-race", requires_write_approval=False)
    who = caller_for(project)
    art = create_artifact(who, name="a", kind="document", content="v1")
    versions = [add_artifact_version(who, art.id, content=f"v{n}") for n in range(2, 10)]
    state = actions.read_before_state(who, kind="artifact.make_current", artifact_id=art.id)
    intents = [
        actions.create_intent(who, kind="artifact.make_current", idempotency_key=f"k{v.id}", artifact_id=art.id,
                              params={"version_id": v.id}, before_fingerprint=state.fingerprint).intent
        for v in versions
    ]
    results = race([lambda intent_id=i.id: actions.execute_intent(who, intent_id) for i in intents])
    outcomes = {i.id: "executed" if kind == "ok" else "stale" if value == StalePrecondition.code else repr(value)
                for i, (kind, value) in zip(intents, results)}
    assert sorted(outcomes.values()) == ["executed"] + ["stale"] * (len(intents) - 1)
    winner = next(i for i, o in outcomes.items() if o == "executed")
    art.refresh_from_db()
    assert art.current_version_id == WriteIntent.objects.get(id=winner).params["version_id"]
    assert WriteIntent.objects.filter(state="refused").count() == len(intents) - 1
