"""A checkpoint's authority refs and its schema version.

``authority`` takes only the project's authority fields, each of its JSON type (strict: ``true``
is not an integer), so only a well-typed ref that differs is ``stale_authority``; before,
``true`` passed as 1, unknown keys were ignored and a wrong type was called stale.
``schema_version`` is the server's: a client stating one is refused as an unknown field (before,
any value was accepted and dropped). Single writes and batches alike; nothing is written.
"""
from __future__ import annotations

import pytest

from novelforge_sessions.routers import api
from tests.support.responses import refused
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db


def test_authority_refs_are_typed_and_only_a_well_typed_difference_is_stale(project, owner, new_session):
    run_id = new_session(run=True)["run"]["id"]
    current = {"authority_version": project.authority_version, "lock_fingerprint": project.lock_fingerprint,
               "framework_version": project.framework_version}
    body = {"boundary": "context_freeze", "cursor": {"step": "s"}}
    before = snapshot()
    for authority, field in (({"authority_version": True}, "authority.authority_version"),
                             ({"authority_version": "1"}, "authority.authority_version"),
                             ({"authority_version": 1.5}, "authority.authority_version"),
                             ({"authority_version": None}, "authority.authority_version"),
                             ({"lock_fingerprint": 5}, "authority.lock_fingerprint"),
                             ({"framework_version": ["1"]}, "authority.framework_version"),
                             ({"bogus": 1}, "authority.bogus"),
                             ({**current, "bogus": 1}, "authority.bogus")):
        refused(owner.post(f"/runs/{run_id}/checkpoints", {**body, "authority": authority}),
                422, "validation_error", field)
        item = {"kind": "checkpoint", "checkpoint": {**body, "authority": authority}}
        refused(owner.post(f"/runs/{run_id}/batch", {"items": [item]}), 422, "validation_error", f"items[0].{field}")
    refused(owner.post(f"/runs/{run_id}/checkpoints", {**body, "authority": [current]}), 422, "validation_error", "authority")
    err = refused(owner.post(f"/runs/{run_id}/checkpoints", {**body, "authority": {"authority_version": 2}}),
                  409, "stale_authority")
    assert err["details"]["differences"] == {"authority_version": {"stated": 2, "current": 1}}
    item = {"kind": "checkpoint", "checkpoint": {**body, "authority": {"framework_version": "2"}}}
    refused(owner.post(f"/runs/{run_id}/batch", {"items": [item]}), 409, "stale_authority")
    assert snapshot() == before
    for authority in (current, {"authority_version": 1.0}, {}):
        resp = owner.post(f"/runs/{run_id}/checkpoints", {**body, "authority": authority})
        assert resp.status_code == 201, resp.content
        assert resp.json()["authority"] == current


def test_schema_version_is_the_servers_and_refused_as_an_unknown_field(owner, new_session):
    run_id = new_session(run=True)["run"]["id"]
    body = {"boundary": "context_freeze", "cursor": {"step": "s"}}
    before = snapshot()
    for value in ("x", 999, 1):
        err = refused(owner.post(f"/runs/{run_id}/checkpoints", {**body, "schema_version": value}),
                      422, "validation_error", "schema_version")
        assert "schema_version" not in err["details"]["allowed"]
        item = {"kind": "checkpoint", "checkpoint": {**body, "schema_version": value}}
        refused(owner.post(f"/runs/{run_id}/batch", {"items": [item]}), 422, "validation_error", "items[0].schema_version")
    assert snapshot() == before
    declared = api.get_openapi_schema()["components"]["schemas"]["CheckpointIn"]["properties"]
    assert "schema_version" not in declared
    resp = owner.post(f"/runs/{run_id}/checkpoints", body)
    assert resp.status_code == 201 and resp.json()["schema_version"] == 1, resp.content
