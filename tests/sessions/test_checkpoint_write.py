"""Every single checkpoint is ONE statement run as its own transaction (``control/checkpoints._WRITE_SQL``):
the run lock, the decision (``_REFUSAL_CASE``), the replay of its idempotency key and its writes.

The three shapes agents send — plain, with an idempotency key (the typed client's default), with
refs — go through that one statement, so every outcome is run on all three here: the same answer,
the same rows written, and nothing written on a refusal. Under real concurrency the statement
numbers checkpoints 1..n, and concurrent retries of one key leave exactly one row.
"""
from __future__ import annotations

import itertools
import re
from typing import Any

import pytest

from novelforge_sessions.actions.artifacts import create_artifact
from novelforge_sessions.control import checkpoints
from novelforge_sessions.errors import CATALOG, ServiceError
from novelforge_sessions.models import Checkpoint, Event, Project, Run
from tests.support.factories import caller_for, make_project
from tests.support.factories import running_session
from tests.support.races import race
from tests.support.snapshots import snapshot
from tests.sessions.test_liveness import expire

CP = {"boundary": "context_freeze", "cursor": {"step": 2, "note": "ü \" \\ ok"}}
_keys = itertools.count()


PATHS = ("plain", "keyed", "refs")


def _post(owner, run_id: int, body: dict[str, Any], path: str, project: Project | None = None):
    """One checkpoint POST: plain, with an idempotency key, or citing an artifact version."""
    if path == "keyed":
        body = {**body, "idempotency_key": f"k-{next(_keys)}"}
    elif path == "refs":
        assert project is not None
        art = create_artifact(caller_for(project), name=f"cited-{next(_keys)}", kind="document", content="cited")
        body = {**body, "artifacts": [{"artifact_id": art.id, "fingerprint": art.current_version.fingerprint}]}
    return owner.post(f"/runs/{run_id}/checkpoints", body)


def _answer(resp) -> tuple[int, Any]:
    body = resp.json()
    return resp.status_code, body["error"] if resp.status_code >= 400 else None


def _stored(checkpoint_id: int) -> tuple:
    """A written checkpoint, its event and its run, as stored (ids and clocks left out)."""
    c = Checkpoint.objects.get(id=checkpoint_id)
    event = Event.objects.get(type="checkpoint.recorded", payload__checkpoint_id=checkpoint_id)
    run = Run.objects.get(id=c.run_id)
    return (
        (c.session_id, c.run_id, c.seq, c.boundary, c.cursor, c.artifacts, c.authority, c.pending, c.approvals,
         c.resume_policy, c.schema_version, c.size_bytes),
        (event.project_id, event.session_id, event.run_id, event.actor,
         {k: v for k, v in event.payload.items() if k != "checkpoint_id"}),
        (run.checkpoint_count, run.cursor),
    )


# --------------------------------------------------------------- every outcome on every path
#: case -> (the answer's code, how to get there: a run id to use, end the run, expire the lease, refs to state)
REFUSALS = {
    "no such run": ("not_found", lambda project: {"run": 2**62}),
    "the run ended": ("run_not_open", lambda project: {"end": True}),
    "the runtime's lease ran out": ("no_live_runtime", lambda project: {"expire": True}),
    "a stale authority version": ("stale_authority", lambda project: {
        "authority": {"authority_version": project.authority_version + 1}}),
    "a stale lock fingerprint": ("stale_authority", lambda project: {
        "authority": {"lock_fingerprint": "sha256:" + "b" * 64}}),
    "a stale framework version beside a current version": ("stale_authority", lambda project: {
        "authority": {"framework_version": "2", "authority_version": project.authority_version}}),
    "the ended run before the stale authority": ("run_not_open", lambda project: {
        "end": True, "authority": {"authority_version": project.authority_version + 1}}),
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", list(REFUSALS))
def test_each_refusal_answers_the_same_on_every_path_and_writes_nothing(owner, new_session, project, case):
    code, setup = REFUSALS[case]
    answers = []
    for path in PATHS:
        s = new_session(run=True)
        how = setup(Project.objects.get(id=project.id))
        if how.get("end"):
            assert owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed"}).status_code == 200
        if how.get("expire"):
            expire(s["id"])
        body = {**CP, **({"authority": how["authority"]} if "authority" in how else {})}
        if path == "refs":  # the cited artifact is made first: it is not what the refusal must leave alone
            art = create_artifact(caller_for(project), name=f"cited-{next(_keys)}", kind="document", content="c")
            body["artifacts"] = [{"artifact_id": art.id, "fingerprint": art.current_version.fingerprint}]
        before = snapshot()
        resp = _post(owner, how.get("run", s["run"]["id"]), body, "plain" if path == "refs" else path)
        assert resp.status_code in (404, 409) and resp.json()["error"]["code"] == code, resp.content
        assert snapshot() == before, "a refusal writes nothing"
        status, error = _answer(resp)
        details = dict(error.get("details") or {})
        details.pop("session_id", None)  # each path has a session of its own
        answers.append((status, error["code"], details))
    assert answers[0] == answers[1] == answers[2], answers


AUTHORITY_ACCEPTED = {
    "no authority stated": lambda project: None,
    "an empty authority": lambda project: {},
    "the current version": lambda project: {"authority_version": project.authority_version},
    "all current refs": lambda project: project.authority_ref(),
    "the current version, as 1.0-style float": lambda project: {"authority_version": float(project.authority_version)},
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", list(AUTHORITY_ACCEPTED))
def test_each_accepted_checkpoint_is_stored_the_same_on_every_path(owner, new_session, project, case):
    stored = []
    for path in ("plain", "keyed"):
        s = new_session(run=True)
        authority = AUTHORITY_ACCEPTED[case](Project.objects.get(id=project.id))
        body = {**CP, **({} if authority is None else {"authority": authority})}
        resp = _post(owner, s["run"]["id"], body, path)
        assert resp.status_code == 201, resp.content
        answer = resp.json()
        (row, event, run) = _stored(answer["id"])
        assert answer["seq"] == row[2] == 1 and run == (1, CP["cursor"])
        assert event[4] == {"seq": 1, "boundary": CP["boundary"], "cursor": CP["cursor"]}
        assert answer["authority"] == row[6] == Project.objects.get(id=project.id).authority_ref()
        # the session and run differ per path, and the keyed body is larger by its key; the rest
        # is compared whole
        stored.append((row[2:-2], event[3:], run, {k: v for k, v in answer.items()
                                                    if k not in {"id", "session_id", "run_id", "created_at", "size_bytes"}}))
    assert stored[0] == stored[1]


@pytest.mark.django_db
def test_another_projects_run_is_not_found_on_the_one_statement_path_and_nothing_is_written(owner, outsider, new_session):
    s = new_session(run=True)
    before = snapshot()
    resp = outsider.post(f"/runs/{s['run']['id']}/checkpoints", CP)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    assert snapshot() == before


@pytest.mark.django_db
def test_a_refs_refusal_loses_to_a_more_fundamental_one_and_nothing_is_written(owner, new_session):
    s = new_session(run=True)
    assert owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed"}).status_code == 200
    before = snapshot()
    resp = owner.post(f"/runs/{s['run']['id']}/checkpoints",
                      {**CP, "artifacts": [{"artifact_id": 2**40, "fingerprint": "sha256:" + "a" * 64}]})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "run_not_open", resp.content
    assert snapshot() == before
    # on an open run the same ref is the answer, and still nothing is written
    s2 = new_session(run=True)
    before = snapshot()
    resp = owner.post(f"/runs/{s2['run']['id']}/checkpoints",
                      {**CP, "artifacts": [{"artifact_id": 2**40, "fingerprint": "sha256:" + "a" * 64}]})
    assert resp.status_code == 422, resp.content
    assert snapshot() == before


@pytest.mark.django_db
def test_a_refs_checkpoint_stores_its_refs_and_its_replay_answers_them(owner, new_session, project):
    s = new_session(run=True)
    art = create_artifact(caller_for(project), name="cited-once", kind="document", content="text")
    body = {**CP, "idempotency_key": "with-refs",
            "artifacts": [{"artifact_id": art.id, "fingerprint": art.current_version.fingerprint}]}
    first = owner.post(f"/runs/{s['run']['id']}/checkpoints", body)
    assert first.status_code == 201, first.content
    again = owner.post(f"/runs/{s['run']['id']}/checkpoints", body)
    assert again.status_code in (200, 201) and again.json()["id"] == first.json()["id"]
    stored = Checkpoint.objects.get(id=first.json()["id"])
    assert stored.artifacts == [{"artifact_id": art.id, "fingerprint": art.current_version.fingerprint,
                                 "head_version_id": art.current_version.id}]
    assert Checkpoint.objects.filter(run_id=s["run"]["id"]).count() == 1


def test_every_refusal_the_statement_decides_has_one_catalogued_error():
    in_sql = re.findall(r"THEN '([a-z_]+)'", checkpoints._REFUSAL_CASE)
    assert tuple(in_sql) == checkpoints.REFUSAL_CODES
    catalogued = set(CATALOG)
    for code in in_sql:
        locked = checkpoints.Locked("ended", 0, 1, 1, "running", False, False, 7, {"authority_version": 2}, 0, code)
        error = checkpoints.refusal(locked, [{"authority_version": 1}])
        assert isinstance(error, ServiceError) and error.code in catalogued and 400 <= error.http_status < 500


# --------------------------------------------------------------- real concurrency
WRITERS, EACH = 6, 8


@pytest.mark.django_db(transaction=True)
def test_concurrent_checkpoints_on_one_run_number_1_to_n_with_one_event_each():
    caller = caller_for(make_project("one-statement-race"))
    run = Run.objects.get(session=running_session(caller))

    def writer(i: int) -> list[tuple[int, int, dict]]:
        written = []
        for j in range(EACH):
            cursor = {"writer": i, "n": j}
            c = checkpoints.record_checkpoint(caller, run.id, {"boundary": "context_freeze", "cursor": cursor})
            written.append((c.id, c.seq, cursor))
        return written

    results = race(writer, WRITERS)
    assert [kind for kind, _ in results] == ["ok"] * WRITERS, results
    written = [w for _, each in results for w in each]
    n = WRITERS * EACH
    assert sorted(seq for _, seq, _ in written) == list(range(1, n + 1))
    stored = dict(Checkpoint.objects.filter(run_id=run.id).values_list("seq", "cursor"))
    assert stored == {seq: cursor for _, seq, cursor in written}
    events = list(Event.objects.filter(run_id=run.id, type="checkpoint.recorded").order_by("id")
                  .values_list("payload", flat=True))
    assert sorted(e["seq"] for e in events) == list(range(1, n + 1))
    assert {e["checkpoint_id"]: e["seq"] for e in events} == {cid: seq for cid, seq, _ in written}
    run.refresh_from_db()
    assert run.checkpoint_count == n and run.cursor == stored[n]  # the last numbered one's cursor
    # every answer is a committed checkpoint's, and no id answered twice
    assert len({cid for cid, _, _ in written}) == n


RETRIES = 16


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_of_one_keyed_checkpoint_leave_one_row_and_answer_it_to_all():
    caller = caller_for(make_project("keyed-retries"))
    run = Run.objects.get(session=running_session(caller))
    body = {"boundary": "context_freeze", "cursor": {"step": 9}, "idempotency_key": "retried-step-9"}

    def retry(_: int) -> tuple[int, int, bool]:
        c = checkpoints.record_checkpoint(caller, run.id, dict(body))
        return c.id, c.seq, c.replayed

    results = race(retry, RETRIES)
    assert [kind for kind, _ in results] == ["ok"] * RETRIES, results
    answers = [answer for _, answer in results]
    assert len({(cid, seq) for cid, seq, _ in answers}) == 1, answers
    assert sorted(replayed for _, _, replayed in answers) == [False] + [True] * (RETRIES - 1)
    assert Checkpoint.objects.filter(run_id=run.id).count() == 1
    assert Event.objects.filter(run_id=run.id, type="checkpoint.recorded").count() == 1
    run.refresh_from_db()
    assert run.checkpoint_count == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_keyed_retries_of_many_steps_number_each_step_once():
    caller = caller_for(make_project("keyed-steps"))
    run = Run.objects.get(session=running_session(caller))
    steps = 5

    def writer(i: int) -> list[int]:  # every writer retries every step: 8 copies of each key
        return [checkpoints.record_checkpoint(caller, run.id, {"boundary": "context_freeze", "cursor": {"step": n},
                                                                "idempotency_key": f"step-{n}"}).id
                for n in range(steps)]

    results = race(writer, 8)
    assert [kind for kind, _ in results] == ["ok"] * 8, results
    per_step = list(zip(*[ids for _, ids in results]))
    assert all(len(set(ids)) == 1 for ids in per_step), per_step
    stored = list(Checkpoint.objects.filter(run_id=run.id).order_by("seq").values_list("seq", "idempotency_key"))
    assert [seq for seq, _ in stored] == list(range(1, steps + 1))
    assert sorted(key for _, key in stored) == sorted(f"step-{n}" for n in range(steps))


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_of_one_keyed_checkpoint_with_refs_leave_one_row():
    caller = caller_for(make_project("keyed-refs-retries"))
    run = Run.objects.get(session=running_session(caller))
    art = create_artifact(caller, name="cited-by-retries", kind="document", content="cited")
    body = {"boundary": "context_freeze", "cursor": {"step": 3}, "idempotency_key": "retried-with-refs",
            "artifacts": [{"artifact_id": art.id, "fingerprint": art.current_version.fingerprint}]}

    def retry(_: int) -> tuple[int, bool]:
        c = checkpoints.record_checkpoint(caller, run.id, dict(body))
        return c.id, c.replayed

    results = race(retry, RETRIES)
    assert [kind for kind, _ in results] == ["ok"] * RETRIES, results
    assert len({cid for _, (cid, _) in results}) == 1
    assert sorted(replayed for _, (_, replayed) in results) == [False] + [True] * (RETRIES - 1)
    stored = Checkpoint.objects.get(run_id=run.id)
    assert stored.artifacts[0]["artifact_id"] == art.id
    assert Event.objects.filter(run_id=run.id, type="checkpoint.recorded").count() == 1
