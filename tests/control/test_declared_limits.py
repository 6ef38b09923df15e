"""Body and query limits the server enforces are refused as the schema declares them (audit
finding 11): a typed 422 ``validation_error`` naming the field as the caller sent it, and
nothing written. The declared values themselves: tests/api/test_schema_limits.py."""
from __future__ import annotations

import pytest
from django.conf import settings

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.control import bindings, handoffs
from novelforge_sessions.control.models import Handoff, ResultDelivery
from novelforge_sessions.models import Checkpoint, Event, TranscriptEntry
from tests.control.conftest import claim, make_artifact, ok, refused

pytestmark = pytest.mark.django_db

FP = "sha256:" + "0" * 64


def test_mark_stale_names_at_most_its_limit(owner, new_session):
    s = new_session(attach=False)
    before = Event.objects.count()
    err = refused(owner.post("/bindings/mark-stale", {"session_ids": list(range(1, bindings.MAX_MARK_STALE + 2))}),
                  422, "validation_error")
    assert err["details"]["field"] == "session_ids"
    assert Event.objects.count() == before
    assert owner.get(f"/sessions/{s['id']}").json()["status"] == "created"


@pytest.mark.parametrize(("body", "field"), [
    ({"inputs": [{"artifact_id": 1, "fingerprint": FP}] * (handoffs.MAX_INPUTS + 1)}, "inputs"),
    ({"required_capabilities": [f"c{i}" for i in range(rt.MAX_CAPABILITIES + 1)]}, "required_capabilities"),
    # duplicates count as sent, as the schema's maxItems counts them
    ({"required_capabilities": ["same"] * (rt.MAX_CAPABILITIES + 1)}, "required_capabilities"),
    ({"required_capabilities": ["Bad Cap"]}, "required_capabilities"),
])
def test_handoff_lists_are_bounded_and_named(owner, running, body, field):
    err = refused(owner.post(f"/runs/{running['run']['id']}/handoffs", {"logical_id": "job-1", **body}),
                  422, "validation_error")
    assert err["details"]["field"] == field
    assert not Handoff.objects.exists()
    assert owner.get(f"/sessions/{running['id']}").json()["status"] == "running"


def test_a_handoff_at_the_limits_is_accepted(owner, running):
    art = make_artifact(owner)
    ref = {"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}
    caps = [f"c{i}" for i in range(rt.MAX_CAPABILITIES)]
    made = ok(owner.post(f"/runs/{running['run']['id']}/handoffs",
                         {"logical_id": "job-1", "inputs": [ref] * handoffs.MAX_INPUTS, "required_capabilities": caps}), 201)
    assert made["required_capabilities"] == sorted(caps)


@pytest.mark.parametrize(("params", "field"), [
    ({"capability": "Bad Cap"}, "capability"),
    ({"capability": [f"c{i}" for i in range(rt.MAX_CAPABILITIES + 1)]}, "capability"),
])
def test_routing_refusals_name_the_query_parameter(owner, params, field):
    err = refused(owner.get("/routing/runtimes", **params), 422, "validation_error")
    assert err["details"]["field"] == field


def test_transcript_entry_over_its_bytes_is_refused(owner, new_session):
    s = new_session()
    too_long = "é" * (settings.TRANSCRIPT_ENTRY_MAX_BYTES // 2 + 1)  # under maxLength in characters, over in bytes
    err = refused(owner.post(f"/sessions/{s['id']}/transcript", {"role": "user", "content": too_long}),
                  422, "validation_error")
    assert err["details"]["field"] == "content"
    err = refused(owner.post(f"/sessions/{s['id']}/transcript",
                             {"role": "user", "content": "a" * (settings.TRANSCRIPT_ENTRY_MAX_BYTES + 1)}),
                  422, "validation_error")
    assert err["details"]["field"] == "content"
    assert not TranscriptEntry.objects.exists()


@pytest.mark.parametrize(("body", "field"), [
    ({"artifacts": [{"artifact_id": 1, "fingerprint": "sha256:nothex"}]}, "artifacts[0].fingerprint"),
    ({"resume_policy": ""}, "resume_policy"),
    ({"resume_policy": "Not A Name"}, "resume_policy"),
])
def test_checkpoint_fields_are_refused_as_declared(owner, running, body, field):
    err = refused(owner.post(f"/runs/{running['run']['id']}/checkpoints",
                             {"boundary": "context_freeze", "cursor": {"step": "s"}, **body}), 422, "validation_error")
    assert err["details"]["field"] == field
    assert not Checkpoint.objects.exists()


def test_a_malformed_result_hash_is_a_validation_error_and_logs_nothing(owner, worker, frozen):
    held = claim(worker, ["continuity"])
    for bad in ("nothex", "sha256:" + "G" * 64, FP + "\n"):
        err = refused(worker.post(f"/handoffs/{held['id']}/results", {
            "fencing_token": held["fencing_token"], "job_fingerprint": held["job_fingerprint"],
            "result": {"verdict": "ok"}, "result_hash": bad,
        }), 422, "validation_error")
        assert err["details"]["field"] == "result_hash"
    assert not ResultDelivery.objects.exists()
    assert Handoff.objects.get(id=held["id"]).state == "claimed"
    # A well-formed hash of another result is still the documented mismatch.
    refused(worker.post(f"/handoffs/{held['id']}/results", {
        "fencing_token": held["fencing_token"], "job_fingerprint": held["job_fingerprint"],
        "result": {"verdict": "ok"}, "result_hash": FP,
    }), 422, "result_hash_mismatch")
