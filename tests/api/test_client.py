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
