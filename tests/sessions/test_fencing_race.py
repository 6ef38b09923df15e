"""Generation fencing under concurrency: the fence is decided under the session row lock.

Generation 1's agent keeps appending to the transcript (half naming its runtime, half not)
while generation 1 is closed and resume attaches generation 2. Every append that was stored
committed before the write that made it stale (a named one before the close, an unnamed one
before generation 2 existed); every other one was refused with its typed code and stored
nothing.
"""
from __future__ import annotations

import pytest

from novelforge_sessions.access import Caller
from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.control import checkpoints
from novelforge_sessions.control.resume import resume_session
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS
from novelforge_sessions.actions.transcript import append_transcript
from novelforge_sessions.errors import ServiceError
from novelforge_sessions.models import Event, RuntimeAttachment, TranscriptEntry
from tests.support.factories import caller_for, make_project
from tests.support.races import oks, race

pytestmark = pytest.mark.django_db(transaction=True)

WRITERS, APPENDS = 8, 6


def test_late_appends_from_a_superseded_generation_lose_the_race_cleanly():
    project = make_project("fence-race")
    system = caller_for(project)
    agent = Caller(label="token:agent#1", project_ids=frozenset({project.id}), permissions=frozenset(ALL_PERMISSIONS),
                   token_id=1, project=project)
    spec = RuntimeSpec(runtime_family="cli", lease_seconds=600)
    s = sessions.create_session(agent, sessions.NewSession(role="writer", memory_policy="bounded", task_mode="drafting",
                                                           runtime_family="cli"), runtime=spec)
    gen1 = s.created_runtime_id
    run = runs.start_run(agent, s.id, cursor={"step": 1}, runtime_id=gen1)
    checkpoints.record_checkpoint(agent, run.id, {"boundary": "context_freeze", "cursor": {"step": 1}})

    def writer(i: int) -> list[tuple[str, object, bool]]:
        named = i % 2 == 0
        out: list[tuple[str, object, bool]] = []
        for _ in range(APPENDS):
            try:
                entry = append_transcript(agent, s.id, role="assistant", content=f"w{i}",
                                          runtime_id=gen1 if named else None)
                out.append(("ok", entry.seq, named))
            except ServiceError as exc:
                out.append(("error", exc.code, named))
        return out

    def supersede() -> None:
        sessions.close_session(system, s.id, reason="closed under load")
        resume_session(system, s.id, runtime=spec)

    # every thread must finish without a crash (a refused append is recorded, not raised)
    results = oks(race([lambda i=i: writer(i) for i in range(WRITERS)] + [supersede]))[:WRITERS]

    closed_at = Event.objects.get(session_id=s.id, type="runtime.closed", payload__runtime_id=gen1).id
    gen2 = RuntimeAttachment.objects.get(session_id=s.id, generation=2)
    attached_2 = Event.objects.get(session_id=s.id, type="runtime.attached", payload__generation=2).id
    appended = {e.payload["seq"]: e.id for e in Event.objects.filter(session_id=s.id, type="transcript.appended")}
    flat = [r for rs in results for r in rs]
    stored = [(seq, named) for kind, seq, named in flat if kind == "ok"]
    assert len(flat) == WRITERS * APPENDS
    assert TranscriptEntry.objects.filter(session_id=s.id).count() == len(stored) == len(appended)
    for seq, named in stored:
        assert appended[seq] < (closed_at if named else attached_2), (seq, named)
    assert {code for kind, code, named in flat if kind == "error" and named} <= {"stale_runtime"}
    assert {code for kind, code, named in flat if kind == "error" and not named} <= {"runtime_required"}
    assert gen2.state == "live"
    # Once generation 2 exists, generation 1 writes nothing, named or not.
    for runtime_id, code in ((gen1, "stale_runtime"), (None, "runtime_required")):
        with pytest.raises(ServiceError) as info:
            append_transcript(agent, s.id, role="assistant", content="late", runtime_id=runtime_id)
        assert info.value.code == code
