"""A checkpoint without refs or idempotency key is ONE statement (``control/checkpoints._WRITE_SQL``):
the run lock, the checks that decide whether it may be written, and its three writes.

The statement decides in SQL and the action then runs the refusal order on the locked row, as
the two-statement path (the one a checkpoint with an idempotency key takes) decides in Python.
So every outcome is run on both paths here: the same answer, the same rows written, and nothing
written on a refusal. Under real concurrency the one statement numbers checkpoints as the two
did (the run's row lock, re-read after a wait), and if the statement and the checks ever
disagreed the action says so instead of answering either way.
"""
from __future__ import annotations

import itertools
from typing import Any

import pytest

from novelforge_sessions.control import checkpoints
from novelforge_sessions.errors import RunNotOpen
from novelforge_sessions.models import Checkpoint, Event, Project, Run
from tests.conftest import caller_for, make_project
from tests.sessions.test_concurrency import race, running_session
from tests.sessions.test_expired_lease_writes import snapshot
from tests.sessions.test_liveness import expire

CP = {"boundary": "context_freeze", "cursor": {"step": 2, "note": "ü \" \\ ok"}}
_keys = itertools.count()


def _post(owner, run_id: int, body: dict[str, Any], keyed: bool):
    """One checkpoint POST, on the one-statement path or (``keyed``) the two-statement one."""
    return owner.post(f"/runs/{run_id}/checkpoints", {**body, "idempotency_key": f"k-{next(_keys)}"} if keyed else body)


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
         c.resume_policy, c.schema_version, c.size_bytes, c.idempotency_key is None),
        (event.project_id, event.session_id, event.run_id, event.actor,
         {k: v for k, v in event.payload.items() if k != "checkpoint_id"}),
        (run.checkpoint_count, run.cursor),
    )


# --------------------------------------------------------------- every outcome on both paths
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
def test_each_refusal_answers_the_same_on_both_paths_and_writes_nothing(owner, new_session, project, case):
    code, setup = REFUSALS[case]
    answers = []
    for keyed in (False, True):
        s = new_session(run=True)
        how = setup(Project.objects.get(id=project.id))
        if how.get("end"):
            assert owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed"}).status_code == 200
        if how.get("expire"):
            expire(s["id"])
        before = snapshot()
        body = {**CP, **({"authority": how["authority"]} if "authority" in how else {})}
        resp = _post(owner, how.get("run", s["run"]["id"]), body, keyed)
        assert resp.status_code in (404, 409) and resp.json()["error"]["code"] == code, resp.content
        assert snapshot() == before, "a refusal writes nothing"
        status, error = _answer(resp)
        details = dict(error.get("details") or {})
        details.pop("session_id", None)  # each path has a session of its own
        answers.append((status, error["code"], details))
    assert answers[0] == answers[1], answers


AUTHORITY_ACCEPTED = {
    "no authority stated": lambda project: None,
    "an empty authority": lambda project: {},
    "the current version": lambda project: {"authority_version": project.authority_version},
    "all current refs": lambda project: project.authority_ref(),
    "the current version, as 1.0-style float": lambda project: {"authority_version": float(project.authority_version)},
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", list(AUTHORITY_ACCEPTED))
def test_each_accepted_checkpoint_is_stored_the_same_on_both_paths(owner, new_session, project, case):
    stored = []
    for keyed in (False, True):
        s = new_session(run=True)
        authority = AUTHORITY_ACCEPTED[case](Project.objects.get(id=project.id))
        body = {**CP, **({} if authority is None else {"authority": authority})}
        resp = _post(owner, s["run"]["id"], body, keyed)
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
def test_when_the_statement_and_the_checks_disagree_the_action_fails_instead_of_answering(
    owner, new_session, project, monkeypatch,
):
    s = new_session(run=True)
    caller = caller_for(project)
    # The checks refuse what the statement wrote: neither a 201 nor the refusal is answered.
    monkeypatch.setattr(checkpoints, "_refuse_unwritable", lambda *a, **k: (_ for _ in ()).throw(RunNotOpen("x")))
    with pytest.raises(RuntimeError, match="written by its statement but refused by its checks"):
        checkpoints.record_checkpoint(caller, s["run"]["id"], CP)
    # The checks pass what the statement refused (an ended run): nothing was written, and no 201.
    monkeypatch.setattr(checkpoints, "_refuse_unwritable", lambda *a, **k: None)
    assert owner.post(f"/runs/{s['run']['id']}/end", {"outcome": "completed"}).status_code == 200
    before = snapshot()
    with pytest.raises(RuntimeError, match="passed its checks but its statement wrote nothing"):
        checkpoints.record_checkpoint(caller, s["run"]["id"], CP)
    assert snapshot() == before


# --------------------------------------------------------------- real concurrency
WRITERS, EACH = 6, 8


@pytest.mark.django_db(transaction=True)
def test_concurrent_one_statement_checkpoints_on_one_run_number_1_to_n_with_one_event_each():
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
