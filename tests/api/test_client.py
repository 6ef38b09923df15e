"""The Python client against a real daphne server (end to end over HTTP)."""
from __future__ import annotations

import pytest

from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.client import ApiError, Client

from tests.conftest import make_project
from tests.live import DaphneServer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    srv = DaphneServer()
    yield srv
    srv.stop()


def test_client_drives_a_session_through_its_life(server):
    project = make_project("client-e2e")
    _, raw = create_token(project, name="client", permissions=["read", "write"])
    nf = Client(server.url, raw)
    s = nf.create_session(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli",
                          runtime={"runtime_family": "cli"})
    run = nf.start_run(s["id"], cursor={"step": "outline"})
    cp = nf.checkpoint(run["id"], boundary="context_freeze", cursor={"step": "outline"})
    assert cp["seq"] == 1
    with pytest.raises(ApiError) as info:
        nf.transition(s["id"], "created")
    assert (info.value.status, info.value.code) == (409, "illegal_transition")
    nf.close(s["id"])
    report = nf.resume(s["id"], {"runtime_family": "cli"})
    assert report["ok"] and report["generation"] == 2
    assert [x["id"] for x in nf.sessions()] == [s["id"]]
    types = [e["type"] for e in nf.iter_events(session_id=s["id"])]
    assert types[0] == "session.created" and "session.resumed" in types
    with pytest.raises(ApiError) as info:
        Client(server.url, "nfs_wrong").project()
    assert info.value.code == "unauthorized"


def test_client_hands_off_and_delivers_at_least_once(server):
    project = make_project("client-control")
    _, owner_raw = create_token(project, name="agent", permissions=["read", "write"])
    _, worker_raw = create_token(project, name="worker", permissions=["read", "work"])
    agent, worker = Client(server.url, owner_raw), Client(server.url, worker_raw)
    s = agent.create_session(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli",
                             runtime={"runtime_family": "cli"})
    run = agent.start_run(s["id"], cursor={"step": "check"})
    job = agent.hand_off(run["id"], "continuity-1", required_capabilities=["continuity"], timeout_seconds=60)
    assert agent.session(s["id"])["status"] == "awaiting_external"
    assert worker.claim("w1", ["draft"]) is None, "capabilities must match"
    lease = worker.claim("w1", ["continuity"])
    assert lease["id"] == job["id"] and lease["attempt"] == 1
    worker.renew_lease(lease["id"], lease["fencing_token"])
    first = worker.deliver(lease["id"], fencing_token=lease["fencing_token"], job_fingerprint=job["job_fingerprint"],
                           result={"ok": True})
    again = worker.deliver(lease["id"], fencing_token=lease["fencing_token"], job_fingerprint=job["job_fingerprint"],
                           result={"ok": True})
    assert (first["outcome"], again["outcome"]) == ("consumed", "already_consumed")
    assert first["receipt"] == again["receipt"]
    with pytest.raises(ApiError) as info:
        worker.deliver(lease["id"], fencing_token=lease["fencing_token"], job_fingerprint=job["job_fingerprint"],
                       result={"ok": False})
    assert (info.value.status, info.value.code) == (409, "conflicting_result")
    assert agent.session(s["id"])["status"] == "failed"


def test_the_client_names_its_runtime_so_a_superseded_generation_is_fenced(server):
    """Generation fencing end to end: the client remembers the runtime it attached (create,
    attach, resume) and names it in that session's writes."""
    project = make_project("client-fencing")
    _, raw = create_token(project, name="agent", permissions=["read", "write"])
    gen1 = Client(server.url, raw)
    s = gen1.create_session(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli",
                            runtime={"runtime_family": "cli"})
    assert gen1.runtime_for(s["id"]) == s["runtime_id"] is not None
    run = gen1.start_run(s["id"], cursor={"step": "outline"})
    gen1.checkpoint(run["id"], boundary="context_freeze", cursor={"step": "outline"})
    first_runtime = gen1.runtime_for(s["id"])

    gen2 = Client(server.url, raw)  # the next generation: same token, another process
    gen2.close(s["id"])
    report = gen2.resume(s["id"], {"runtime_family": "cli"})
    assert gen2.runtime_for(s["id"]) == report["runtime_id"] != first_runtime

    with pytest.raises(ApiError) as info:
        gen1.transition(s["id"], "completed")  # gen1 still names the runtime it attached
    assert (info.value.status, info.value.code) == (409, "stale_runtime")
    assert info.value.details == {"runtime_id": first_runtime, "live_runtime_id": report["runtime_id"],
                                  "live_generation": 2}
    with pytest.raises(ApiError) as info:
        gen1.append_transcript(s["id"], "assistant", "late")
    assert info.value.code == "stale_runtime"
    with pytest.raises(ApiError) as info:
        Client(server.url, raw).transition(s["id"], "completed")  # knows no runtime: unnamed
    assert info.value.code == "runtime_required"

    assert gen2.append_transcript(s["id"], "assistant", "on time")["seq"] == 1
    gen2.advance(report["run_id"], {"step": "draft"})
    assert gen2.end_run(report["run_id"], "completed")["state"] == "completed"
    assert gen2.session(s["id"])["status"] == "idle"
    assert gen2.start_run(s["id"], cursor={"step": "again"})["seq"] == 3
    assert gen2.close(s["id"])["already_closed"] is False and gen2.runtime_for(s["id"]) is None
