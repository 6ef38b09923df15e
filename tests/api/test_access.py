"""Authorization: every read and write is checked against the caller's project and permissions."""
from __future__ import annotations

import pytest

from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.models import ApiToken, RuntimeAttachment, Session

from tests.support.factories import RUNTIME, SESSION, Api

pytestmark = pytest.mark.django_db


def test_no_or_bad_token_is_401(project):
    for api in (Api(None), Api("nfs_not-a-real-token"), Api("x" * 500)):
        resp = api.get("/sessions")
        assert resp.status_code == 401
        assert resp.json()["error"]["code"] == "unauthorized"


def test_revoked_token_is_401(project):
    token, raw = create_token(project, name="old", permissions=["read"])
    ApiToken.objects.filter(id=token.id).update(revoked_at="2026-01-01T00:00:00Z")
    assert Api(raw).get("/sessions").status_code == 401


def test_tokens_are_stored_hashed(project):
    token, raw = create_token(project, name="t", permissions=["read"])
    stored = ApiToken.objects.get(id=token.id)
    assert raw not in (stored.key_hash, stored.key_prefix, stored.name)
    assert stored.key_hash == ApiToken.hash_key(raw) and len(stored.key_hash) == 64


FOREIGN_READS = [
    "/sessions/{s}", "/sessions/{s}/runs", "/sessions/{s}/runtimes", "/sessions/{s}/transcript",
    "/runs/{r}", "/runs/{r}/checkpoints", "/checkpoints/{c}", "/runtimes/{rt}", "/artifacts/{a}",
]
FOREIGN_WRITES = [
    ("/sessions/{s}/transition", {"to": "idle"}), ("/sessions/{s}/close", {}), ("/sessions/{s}/abort", {}),
    ("/sessions/{s}/resume", {"runtime": RUNTIME}), ("/sessions/{s}/runtimes", RUNTIME), ("/sessions/{s}/runs", {}),
    ("/sessions/{s}/transcript", {"role": "user", "content": "hi"}), ("/runs/{r}/cursor", {"cursor": {"a": 1}}),
    ("/runs/{r}/end", {"outcome": "completed"}), ("/runs/{r}/checkpoints", {"boundary": "user_wait", "cursor": {"a": 1}}),
    ("/runtimes/{rt}/heartbeat", {}), ("/runtimes/{rt}/detach", {}), ("/artifacts/{a}/versions", {"content": "x"}),
]


@pytest.fixture
def foreign(owner, new_session):
    """Objects of the owner's project, to be poked at by the outsider."""
    s = new_session(run=True)
    cp = owner.post(f"/runs/{s['run']['id']}/checkpoints", {"boundary": "user_wait", "cursor": {"a": 1}}).json()
    art = owner.post("/artifacts", {"name": "secret-chapter", "content": "secret"}).json()
    rt = RuntimeAttachment.objects.get(session_id=s["id"]).id
    return {"s": s["id"], "r": s["run"]["id"], "c": cp["id"], "rt": rt, "a": art["id"]}


@pytest.mark.parametrize("path", FOREIGN_READS)
def test_foreign_ids_are_404_on_read(outsider, foreign, path):
    resp = outsider.get(path.format(**foreign))
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(("path", "body"), FOREIGN_WRITES)
def test_foreign_ids_are_404_on_write_and_change_nothing(outsider, foreign, path, body):
    before = Session.objects.get(id=foreign["s"])
    resp = outsider.post(path.format(**foreign), body)
    assert resp.status_code == 404, resp.content
    after = Session.objects.get(id=foreign["s"])
    assert (after.status, after.version, after.generation) == (before.status, before.version, before.generation)


def test_foreign_forget_is_404(outsider, foreign):
    assert outsider.delete(f"/sessions/{foreign['s']}").status_code == 404
    assert Session.objects.filter(id=foreign["s"]).exists()


def test_lists_never_show_other_projects(owner, outsider, new_session):
    new_session()
    outsider.post("/sessions", SESSION)
    mine = owner.get("/sessions").json()["items"]
    theirs = outsider.get("/sessions").json()["items"]
    assert len(mine) == 1 and len(theirs) == 1 and mine[0]["id"] != theirs[0]["id"]
    assert {e["project_id"] for e in outsider.get("/events").json()["items"]} == {theirs[0]["project_id"]}


def test_read_only_token_cannot_write(reader, new_session):
    s = new_session(run=True)
    resp = reader.post(f"/sessions/{s['id']}/transition", {"to": "idle"})
    assert resp.status_code == 403 and resp.json()["error"]["details"]["permission"] == "write"
    assert reader.get(f"/sessions/{s['id']}").status_code == 200
    assert Session.objects.get(id=s["id"]).status == "running"


def test_session_bound_token_sees_only_its_session(project, owner, new_session):
    mine, other = new_session(), new_session()
    _, raw = create_token(project, name="bound", permissions=["read", "write"], session=Session.objects.get(id=mine["id"]))
    bound = Api(raw)
    assert [s["id"] for s in bound.get("/sessions").json()["items"]] == [mine["id"]]
    assert bound.get(f"/sessions/{other['id']}").status_code == 404
    assert bound.post(f"/sessions/{other['id']}/close").status_code == 404
    assert {e["session_id"] for e in bound.get("/events").json()["items"]} == {mine["id"]}


def test_token_names_are_bounded_so_every_write_can_record_its_actor(project):
    from novelforge_sessions.errors import ValidationFailed

    with pytest.raises(ValidationFailed) as info:
        create_token(project, name="n" * 101, permissions=["read"])
    assert info.value.details["field"] == "name"
    # A long name that predates the bound (or came through raw SQL) still cannot break writes.
    token, raw = create_token(project, name="ok", permissions=["read", "write"])
    ApiToken.objects.filter(id=token.id).update(name="x" * 200)
    resp = Api(raw).post("/sessions", SESSION)
    assert resp.status_code == 201, resp.content


def test_the_token_carries_its_whole_project(owner, project):
    body = owner.get("/project").json()
    assert body == {
        "id": project.id, "slug": project.slug, "name": project.name,
        "authority_version": project.authority_version, "lock_fingerprint": project.lock_fingerprint,
        "framework_version": project.framework_version, "requires_write_approval": project.requires_write_approval,
    }
