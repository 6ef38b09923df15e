"""POST /runs/{id}/batch: several durable steps in one transaction, all or nothing."""
from __future__ import annotations

import pytest

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.models import Checkpoint, Event, Run

CP = {"boundary": "context_freeze", "cursor": {"step": 1}}


def _counts(run_id: int) -> tuple:
    run = Run.objects.get(id=run_id)
    return (Checkpoint.objects.count(), Event.objects.count(), run.checkpoint_count, run.cursor)


def test_a_batch_writes_every_item_in_order_with_its_own_result(owner, new_session):
    s = new_session(run=True)
    run_id = s["run"]["id"]
    assert owner.post(f"/runs/{run_id}/checkpoints", CP).status_code == 201  # seq 1 before the batch
    items = [
        {"kind": "checkpoint", "checkpoint": {"boundary": "context_freeze", "cursor": {"step": 2}}},
        {"kind": "checkpoint", "checkpoint": {"boundary": "before_long_handoff", "cursor": {"step": 3}}},
        {"kind": "cursor", "cursor": {"step": 4}},
        {"kind": "checkpoint", "checkpoint": {"boundary": "context_freeze", "cursor": {"step": 5}}},
    ]
    resp = owner.post(f"/runs/{run_id}/batch", {"items": items})
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["run_id"] == run_id and body["checkpoint_count"] == 4
    assert [i["kind"] for i in body["items"]] == ["checkpoint", "checkpoint", "cursor", "checkpoint"]
    assert [i["checkpoint"]["seq"] for i in body["items"] if i["checkpoint"]] == [2, 3, 4]
    assert body["items"][2] == {"kind": "cursor", "checkpoint": None, "cursor": {"step": 4}}
    stored = list(Checkpoint.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "boundary", "cursor"))
    assert stored == [(1, "context_freeze", {"step": 1}), (2, "context_freeze", {"step": 2}),
                      (3, "before_long_handoff", {"step": 3}), (4, "context_freeze", {"step": 5})]
    first = body["items"][0]["checkpoint"]
    assert owner.get(f"/checkpoints/{first['id']}").json() == first  # the result is what was stored
    run = Run.objects.get(id=run_id)
    assert (run.checkpoint_count, run.cursor) == (4, {"step": 5})
    evs = list(Event.objects.filter(run_id=run_id).order_by("id").values_list("type", "payload"))[-4:]
    assert [t for t, _ in evs] == ["checkpoint.recorded", "checkpoint.recorded", "run.cursor_advanced",
                                   "checkpoint.recorded"]
    assert [p.get("seq") for t, p in evs if t == "checkpoint.recorded"] == [2, 3, 4]
    assert evs[2][1] == {"seq": s["run"]["seq"], "cursor": {"step": 4}}
    ids = list(Event.objects.filter(run_id=run_id).order_by("id").values_list("id", flat=True))[-4:]
    assert ids == list(range(ids[0], ids[0] + 4))  # one transaction: consecutive ids


def test_a_batch_checkpoint_carries_the_projects_current_authority_as_a_single_one_does(owner, new_session):
    """Both paths read the authority from the run lock's columns: a batch item stating the
    current refs is accepted, and what is stored is the project's, field for field."""
    s = new_session(run=True)
    run_id = s["run"]["id"]
    single = owner.post(f"/runs/{run_id}/checkpoints", CP).json()
    current = single["authority"]
    assert current["lock_fingerprint"].startswith("sha256:") and current["authority_version"] == 1
    resp = owner.post(f"/runs/{run_id}/batch", {"items": [
        {"kind": "checkpoint", "checkpoint": {**CP, "authority": current}},
        {"kind": "checkpoint", "checkpoint": CP},
    ]})
    assert resp.status_code == 201, resp.content
    assert [i["checkpoint"]["authority"] for i in resp.json()["items"]] == [current, current]
    assert list(Checkpoint.objects.filter(run_id=run_id).order_by("seq").values_list("authority", flat=True)) == [
        current, current, current]


@pytest.mark.parametrize("bad, code, field", [
    ({"kind": "checkpoint", "checkpoint": {"boundary": "context_freeze", "cursor": {"step": 9, "messages": []}}},
     "checkpoint_not_bounded", None),
    ({"kind": "cursor", "cursor": {}}, "validation_error", "items[1].cursor"),
    ({"kind": "checkpoint", "checkpoint": {**CP, "authority": {"lock_fingerprint": "sha256:" + "b" * 64}}},
     "stale_authority", None),
    ({"kind": "checkpoint", "checkpoint": {**CP, "artifacts": [{"artifact_id": 999999, "fingerprint": "sha256:x"}]}},
     "validation_error", None),
])
def test_one_bad_item_refuses_the_whole_batch_and_writes_nothing(owner, new_session, bad, code, field):
    s = new_session(run=True)
    run_id = s["run"]["id"]
    before = _counts(run_id)
    resp = owner.post(f"/runs/{run_id}/batch", {"items": [{"kind": "checkpoint", "checkpoint": CP}, bad,
                                                          {"kind": "cursor", "cursor": {"step": 2}}]})
    assert resp.status_code in (409, 422), resp.content
    error = resp.json()["error"]
    assert error["code"] == code
    assert error["details"]["item"] == 1
    if field:
        assert error["details"]["field"] == field
    assert _counts(run_id) == before


def test_schema_refusals_write_nothing(owner, new_session):
    s = new_session(run=True)
    run_id = s["run"]["id"]
    before = _counts(run_id)
    too_many = {"items": [{"kind": "cursor", "cursor": {"i": i}} for i in range(rt.MAX_BATCH_ITEMS + 1)]}
    for body in (too_many, {"items": []}, {"items": [{"kind": "heartbeat"}]}, {"items": [{"kind": "cursor"}]}):
        resp = owner.post(f"/runs/{run_id}/batch", body)
        assert resp.status_code == 422, resp.content
        assert resp.json()["error"]["code"] == "validation_error"
    assert _counts(run_id) == before


def test_closed_foreign_and_unreadable_runs(owner, outsider, reader, new_session):
    s = new_session(run=True)
    run_id = s["run"]["id"]
    ok = {"items": [{"kind": "checkpoint", "checkpoint": CP}]}
    assert outsider.post(f"/runs/{run_id}/batch", ok).status_code == 404
    assert reader.post(f"/runs/{run_id}/batch", ok).status_code == 403
    assert owner.post(f"/runs/{run_id}/end", {"outcome": "completed"}).status_code == 200
    before = _counts(run_id)
    resp = owner.post(f"/runs/{run_id}/batch", ok)
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "run_not_open"
    assert owner.post("/runs/999999999/batch", ok).status_code == 404
    assert _counts(run_id) == before


def test_openapi_declares_the_bound(owner):
    spec = owner.client.get("/api/openapi.json").json()
    items = spec["components"]["schemas"]["BatchIn"]["properties"]["items"]
    assert (items["minItems"], items["maxItems"]) == (1, rt.MAX_BATCH_ITEMS)
    assert "201" in spec["paths"]["/api/v1/runs/{run_id}/batch"]["post"]["responses"]


def test_a_batch_checkpoint_declares_no_idempotency_key_and_one_is_refused(owner, new_session):
    """Batch items reused CheckpointIn, which declares `idempotency_key`, and the
    server refuses every batch item carrying one. A batch item has its own schema without it (no
    other field either), the typed client's model likewise, and what the schema now calls invalid
    is still refused, writing nothing."""
    from pydantic import ValidationError

    from novelforge_client import models
    from tests.api.declared import declared_valid, served

    components = served()["components"]["schemas"]
    assert components["BatchCheckpointItem"]["properties"]["checkpoint"] == {
        "$ref": "#/components/schemas/BatchCheckpointIn"}
    batch_item, single = components["BatchCheckpointIn"], components["CheckpointIn"]
    assert batch_item["additionalProperties"] is False
    assert set(batch_item["properties"]) == set(single["properties"]) - {"idempotency_key"}

    s = new_session(run=True)
    run_id = s["run"]["id"]
    keyed = {"items": [{"kind": "checkpoint", "checkpoint": {**CP, "idempotency_key": "k-1"}}]}
    assert declared_valid("BatchIn", {"items": [{"kind": "checkpoint", "checkpoint": CP}]})
    assert not declared_valid("BatchIn", keyed)
    before = _counts(run_id)
    resp = owner.post(f"/runs/{run_id}/batch", keyed)
    assert resp.status_code == 422, resp.content
    error = resp.json()["error"]
    assert (error["code"], error["details"]["field"]) == ("validation_error", "items[0].checkpoint.idempotency_key")
    assert _counts(run_id) == before

    assert models.BatchCheckpointItem.model_fields["checkpoint"].annotation is models.BatchCheckpointIn
    assert "idempotency_key" not in models.BatchCheckpointIn.model_fields
    with pytest.raises(ValidationError):
        models.BatchCheckpointIn(**CP, idempotency_key="k-1")


def test_a_refs_refusal_in_a_batch_loses_to_the_runs_and_nothing_is_written(owner, new_session):
    s = new_session(run=True)
    run_id = s["run"]["id"]
    assert owner.post(f"/runs/{run_id}/end", {"outcome": "completed"}).status_code == 200
    bad_ref = {**CP, "artifacts": [{"artifact_id": 2**40, "fingerprint": "sha256:" + "a" * 64}]}
    before = _counts(run_id)
    resp = owner.post(f"/runs/{run_id}/batch", {"items": [{"kind": "checkpoint", "checkpoint": bad_ref}]})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "run_not_open", resp.content
    assert _counts(run_id) == before


def test_a_stale_authority_names_its_item_and_nothing_is_written(owner, new_session, project):
    s = new_session(run=True)
    run_id = s["run"]["id"]
    stale = {**CP, "authority": {"authority_version": project.authority_version + 1}}
    items = [{"kind": "cursor", "cursor": {"step": 0}}, {"kind": "checkpoint", "checkpoint": CP},
             {"kind": "checkpoint", "checkpoint": stale}]
    before = _counts(run_id)
    resp = owner.post(f"/runs/{run_id}/batch", {"items": items})
    error = resp.json()["error"]
    assert resp.status_code == 409 and error["code"] == "stale_authority", resp.content
    assert error["details"]["item"] == 2 and "authority_version" in error["details"]["differences"]
    assert _counts(run_id) == before


@pytest.mark.django_db(transaction=True)
def test_a_batch_is_one_statement_with_one_event_per_item_in_item_order(owner, new_session):
    from django.db import connection

    s = new_session(run=True)
    run_id = s["run"]["id"]
    items = [{"kind": "checkpoint", "checkpoint": {**CP, "cursor": {"step": n}}} for n in range(3)]
    items.insert(1, {"kind": "cursor", "cursor": {"step": "c"}})
    assert owner.post(f"/runs/{run_id}/batch", {"items": items[:1]}).status_code == 201  # the token, recalled
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        resp = owner.post(f"/runs/{run_id}/batch", {"items": items})
    assert resp.status_code == 201, resp.content
    assert len(sent) == 1 and "FOR UPDATE" in sent[0] and "INSERT" in sent[0], sent
    assert not any("BEGIN" in q or "COMMIT" in q for q in sent)
    stored = list(Event.objects.filter(run_id=run_id).order_by("id").values_list("type", "payload"))[-4:]
    assert [t for t, _ in stored] == ["checkpoint.recorded", "run.cursor_advanced", "checkpoint.recorded",
                                      "checkpoint.recorded"]
    seqs = [p.get("seq") for _, p in stored]
    assert seqs[0] == 2 and seqs[2:] == [3, 4]  # the cursor event carries the run's seq
    ids = [i["checkpoint"]["id"] for i in resp.json()["items"] if i["checkpoint"]]
    assert [p["checkpoint_id"] for t, p in stored if t == "checkpoint.recorded"] == ids


def test_the_answer_is_what_was_stored_field_for_field_with_refs_and_when_replayed(owner, new_session):
    """Every checkpoint in the batch's answer equals what GET answers for the row it stored
    (refs resolved, authority, resume policy, text with quotes, backslashes and non-ASCII,
    numbers as written), and a keyed replay answers the same body. The items travel to the
    statement as one JSON document; each checkpoint stores its own values."""
    from novelforge_sessions.api.schemas import BatchOut

    s = new_session(run=True)
    run_id = s["run"]["id"]
    art = owner.post("/artifacts", {"name": "ch", "content": "text"}).json()
    ref = {"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}
    cursor = {"step": 2, "text": "quote \" backslash \\ tab \t unicode \u00e9 \U0001f600", "n": [1.5, -0, 10**18]}
    items = [
        {"kind": "checkpoint", "checkpoint": {**CP, "artifacts": [ref], "resume_policy": "pinned"}},
        {"kind": "cursor", "cursor": {"step": "between"}},
        {"kind": "checkpoint", "checkpoint": {"boundary": "before_long_handoff", "cursor": cursor}},
    ]
    resp = owner.post(f"/runs/{run_id}/batch", {"items": items, "idempotency_key": "answer-1"})
    assert resp.status_code == 201, resp.content
    body = resp.json()
    BatchOut.model_validate(body)  # the declared shape
    written = [i["checkpoint"] for i in body["items"] if i["checkpoint"]]
    assert [owner.get(f"/checkpoints/{c['id']}").json() for c in written] == written
    assert written[0]["artifacts"] == [{**ref, "head_version_id": art["current_version_id"]}]
    assert written[0]["resume_policy"] == "pinned" and written[1]["cursor"] == cursor
    assert written[0]["created_at"] <= written[1]["created_at"]
    assert body["items"][1] == {"kind": "cursor", "checkpoint": None, "cursor": {"step": "between"}}
    replay = owner.post(f"/runs/{run_id}/batch", {"items": items, "idempotency_key": "answer-1"})
    assert replay.status_code == 201 and replay.json() == body


def test_the_statement_fits_psycopgs_parse_cache():
    """Sent compacted, the batch's statement is parsed by psycopg once, not on every batch."""
    from novelforge_sessions import commit
    from novelforge_sessions.control import batch

    assert len(batch._WRITE_SQL.encode()) <= commit.PARSE_CACHED_BYTES
    assert commit.compact("SELECT  'a  b',\n  'it''s   x'  FROM\tt") == "SELECT 'a  b', 'it''s   x' FROM t"
    for unsafe in ("SELECT 1 -- why\n, 2", "SELECT /* a */ 1", "SELECT $$a  b$$"):
        with pytest.raises(ValueError):
            commit.compact(unsafe)
