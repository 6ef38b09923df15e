"""The MCP server, driven by the SDK's own client over stdio and streamable HTTP against a live server.

Tools are listed with input schemas; a whole session is driven through tools (open, run,
checkpoint, hand off, claim, deliver, review gate and its verdict, resume with the report);
refusals come back as tool errors carrying the service's code, with the token's scope. Over
HTTP every request carries its caller's bearer token and acts with it alone: none or a bad one
is 401 (the ambient NOVELFORGE_TOKEN is not used), two tokens on one server keep their scopes.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from django.utils import timezone
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from novelforge_client.mcp_server import NovelForgeTokenVerifier, token_key, transport_security
from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.control.models import ConsumeReceipt
from novelforge_sessions.models import ApiToken, Checkpoint, Run, RuntimeAttachment, Session
from reviews.models import ReviewGate
from tests.client.proxy import DroppingProxy
from tests.support.servers import DaphneServer, free_port
from tests.support.waits import wait_until
from tests.reviews.factories import CHAPTER, RUBRIC, agent_reviewer, agent_verdict

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parent.parent.parent

TOOLS = {
    "open_session", "attach_session", "get_session", "heartbeat", "close_session", "resume_session", "start_run",
    "checkpoint", "end_run", "create_artifact", "hand_off", "claim_work", "deliver_result", "open_review_gate",
    "wait_for_verdict", "whoami",
}


@pytest.fixture(scope="module")
def mcp_backend(django_db_setup, django_db_blocker) -> Iterator[DaphneServer]:
    srv = DaphneServer()
    yield srv
    srv.stop()


def stdio(backend: DaphneServer | DroppingProxy, token: str) -> StdioServerParameters:
    """``novelforge-mcp`` as a host launches it (the module behind the console script)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
           "NOVELFORGE_URL": backend.url, "NOVELFORGE_TOKEN": token}
    return StdioServerParameters(command=sys.executable, args=["-m", "novelforge_client.mcp_server"], env=env, cwd="/")


async def tool_ok(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool call that succeeds: its structured result."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, (tool, result.content)
    return result.structured_content


async def tool_refused(client: Client, tool: str, code: str, **arguments: Any) -> dict[str, Any]:
    """A tool call that fails with the client's typed error (the API's error shape plus its HTTP status)."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, (tool, result.structured_content)
    error = result.structured_content["error"]
    assert set(error) == {"code", "status", "message", "details"} and error["code"] == code, error
    assert code in result.content[0].text  # the text a model reads names the code too
    return error


def test_tools_are_listed_with_input_schemas_and_a_whole_session_runs_through_them(mcp_backend, project):
    _, token = create_token(project, name="mcp-agent", permissions=["read", "write", "work"])
    reviewer_session, reviewer = agent_reviewer(project)

    async def scenario() -> dict[str, Any]:
        async with Client(stdio(mcp_backend, token)) as c:
            listed = {t.name: t for t in (await c.list_tools()).tools}
            assert set(listed) == TOOLS
            for tool in listed.values():
                assert tool.input_schema["type"] == "object" and tool.description, tool.name
            assert listed["checkpoint"].input_schema["required"] == ["run_id", "boundary", "cursor"]
            assert "context_freeze" in listed["checkpoint"].input_schema["properties"]["boundary"]["enum"]

            assert (await tool_ok(c, "whoami"))["slug"] == project.slug
            s = await tool_ok(c, "open_session", role="writer", memory_policy="bounded", task_mode="drafting",
                              runtime_family="claude-code", capabilities=["draft"], lease_seconds=120)
            sid, rid = s["id"], s["runtime_id"]
            run = await tool_ok(c, "start_run", session_id=sid, cursor={"step": "outline"})
            art = await tool_ok(c, "create_artifact", name="chapter-3", content=CHAPTER, kind="chapter")
            cp = await tool_ok(c, "checkpoint", run_id=run["id"], boundary="context_freeze", cursor={"step": "draft"},
                               artifacts=[{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}])
            job = await tool_ok(c, "hand_off", run_id=run["id"], logical_id="chapter-3/continuity",
                                params={"check": "names"}, result_schema={"ok": "boolean"},
                                required_capabilities=["continuity"])
            assert (await tool_ok(c, "get_session", session_id=sid))["status"] == "awaiting_external"
            claimed = (await tool_ok(c, "claim_work", worker="mcp-worker", capabilities=["continuity"]))["handoff"]
            assert claimed["id"] == job["id"]
            delivered = await tool_ok(c, "deliver_result", handoff_id=job["id"], fencing_token=claimed["fencing_token"],
                                      job_fingerprint=job["job_fingerprint"], result={"ok": True})
            assert delivered["outcome"] == "consumed" and delivered["session_status"] == "running"
            assert (await tool_ok(c, "heartbeat", runtime_id=rid))["abort_requested"] is False

            gate = await tool_ok(c, "open_review_gate", session_id=sid, candidate_version_id=art["current_version_id"],
                                 rubric=RUBRIC, route="agent", reviewer_session_ids=[reviewer_session.id])
            await tool_refused(c, "wait_for_verdict", "timeout", gate_id=gate["id"], timeout_seconds=0.3)
            # The reviewer binds its verdict through the API, as its own session.
            g = await asyncio.to_thread(ReviewGate.objects.select_related("packet").get, id=gate["id"])
            lease = (await asyncio.to_thread(reviewer.post, "/review-packets/claim")).json()["lease"]
            bound = await asyncio.to_thread(reviewer.post, f"/review-packets/{g.packet.id}/verdicts",
                                            agent_verdict(g, lease["fencing_token"], decision="pass"))
            assert bound.status_code == 201, bound.content
            verdict = await tool_ok(c, "wait_for_verdict", gate_id=gate["id"])
            assert verdict["state"] == "complete" and verdict["verdicts"][0]["decision"] == "pass"

            wait = await tool_ok(c, "checkpoint", run_id=run["id"], boundary="before_canon_settlement",
                                 cursor={"step": "settle"}, pending={"gates": [{"gate_id": gate["id"]}]})
            # The host restarts: its runtime ends; a new one resumes with the report.
            await tool_ok(c, "close_session", session_id=sid, reason="host restart")
            dry = await tool_ok(c, "resume_session", session_id=sid, runtime_family="claude-code", dry_run=True)
            assert dry["ok"] and dry["dry_run"] and dry["runtime_id"] is None
            report = await tool_ok(c, "resume_session", session_id=sid, runtime_family="claude-code",
                                   capabilities=["draft"])
            assert report["ok"] and report["checkpoint_id"] == wait["id"] and report["generation"] == 2
            assert {st["step"] for st in report["steps"]} >= {"load", "authority", "artifacts", "reviews", "consumed"}
            ended = await tool_ok(c, "end_run", run_id=report["run_id"], outcome="completed",
                                  session_status="completed")
            return {"sid": sid, "cp": cp["id"], "run2": report["run_id"], "ended": ended}

    out = asyncio.run(scenario())
    session = Session.objects.get(id=out["sid"])
    assert session.status == "completed" and session.generation == 2
    assert RuntimeAttachment.objects.filter(session=session).count() == 2
    assert Run.objects.get(id=out["run2"]).state == "completed"
    assert Checkpoint.objects.filter(session=session).count() == 2
    assert ConsumeReceipt.objects.filter(logical_id="chapter-3/continuity").count() == 1
    assert ReviewGate.objects.get(session=session).state == "complete"


def test_refusals_are_tool_errors_with_the_code_and_the_tokens_scope_holds(mcp_backend, project):
    _, writer = create_token(project, name="mcp-writer", permissions=["read", "write"])
    _, reader = create_token(project, name="mcp-reader", permissions=["read"])

    async def scenario() -> None:
        async with Client(stdio(mcp_backend, writer)) as c:
            s = await tool_ok(c, "open_session", role="writer", memory_policy="bounded", task_mode="drafting",
                              runtime_family="codex")
            run = await tool_ok(c, "start_run", session_id=s["id"])
            err = await tool_refused(c, "start_run", "open_run_exists", session_id=s["id"])
            assert err["status"] == 409 and err["details"]["run_id"] == run["id"]
            await tool_refused(c, "checkpoint", "checkpoint_not_bounded", run_id=run["id"], boundary="user_wait",
                               cursor={"messages": [{"role": "user", "content": "hi"}]})
            await tool_refused(c, "get_session", "not_found", session_id=987654321)
            await tool_refused(c, "claim_work", "forbidden", worker="w")  # this token has no `work` permission
            invalid = await c.call_tool("checkpoint", {"run_id": run["id"], "boundary": "whenever", "cursor": {}})
            assert invalid.is_error and "boundary" in invalid.content[0].text  # the input schema refuses it
        async with Client(stdio(mcp_backend, reader)) as c:
            assert (await tool_ok(c, "get_session", session_id=s["id"]))["status"] == "running"
            err = await tool_refused(c, "open_session", "forbidden", role="writer", memory_policy="bounded",
                                     task_mode="drafting", runtime_family="codex")
            assert err["status"] == 403 and err["details"]["permission"] == "write"

    before = Session.objects.count()
    asyncio.run(scenario())
    assert Session.objects.count() == before + 1  # the reader's refused open wrote nothing
    assert Checkpoint.objects.count() == 0


def test_the_checkpoint_tool_acts_through_one_client_and_a_retried_or_repeated_call_writes_once(
        mcp_backend: DaphneServer, project: Any) -> None:
    """Every tool call of a stdio server goes through one client (one keep-alive connection and one
    API socket, a second socket only after the proxy dropped one); a checkpoint whose answer was lost is retried by that client
    with the same idempotency key, and a host repeating a whole call with its `idempotency_key`
    gets the first checkpoint back: one row each."""
    _, token = create_token(project, name="mcp-keyed", permissions=["read", "write"])
    proxy = DroppingProxy(mcp_backend.port)

    async def scenario() -> tuple[int, list[dict[str, Any]]]:
        async with Client(stdio(proxy, token)) as c:
            s = await tool_ok(c, "open_session", role="writer", memory_policy="bounded", task_mode="drafting",
                              runtime_family="claude-code")
            run = await tool_ok(c, "start_run", session_id=s["id"])
            first = await tool_ok(c, "checkpoint", run_id=run["id"], boundary="context_freeze", cursor={"step": 1})
            proxy.drop_responses = 1  # lost after the server committed: the client retries it
            second = await tool_ok(c, "checkpoint", run_id=run["id"], boundary="context_freeze", cursor={"step": 2})
            keyed = await tool_ok(c, "checkpoint", run_id=run["id"], boundary="context_freeze", cursor={"step": 3},
                                  idempotency_key="host-step-3")
            repeated = await tool_ok(c, "checkpoint", run_id=run["id"], boundary="context_freeze", cursor={"step": 3},
                                     idempotency_key="host-step-3")
            await tool_refused(c, "checkpoint", "idempotency_key_reused", run_id=run["id"], boundary="context_freeze",
                               cursor={"step": 4}, idempotency_key="host-step-3")
            return run["id"], [first, second, keyed, repeated]

    try:
        run_id, cps = asyncio.run(scenario())
    finally:
        proxy.close()
    assert proxy.dropped == 1
    assert proxy.forwarded[("POST", f"/api/v1/runs/{run_id}/checkpoints")] == 6  # 1, 2 (sent twice), 3, 3 again, 4
    assert [cp["seq"] for cp in cps] == [1, 2, 3, 3] and cps[3]["id"] == cps[2]["id"]
    assert list(Checkpoint.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "cursor")) == [
        (1, {"step": 1}), (2, {"step": 2}), (3, {"step": 3})]
    # one client for every call: its keep-alive HTTP connection and its API socket (the checkpoints),
    # and a second socket that replaced the one whose answer was dropped
    assert proxy.connections == 3
    assert proxy.forwarded[("GET", "/ws/api/")] == 2


def test_a_host_repeating_a_keyed_start_run_attach_or_hand_off_gets_the_first_answer(
        mcp_backend: DaphneServer, project: Any) -> None:
    """The tools that create something take the host's `idempotency_key`: the same call repeated answers
    what the first wrote (one run, one runtime generation, one handoff); another body with the key is
    `idempotency_key_reused` and writes nothing."""
    from novelforge_sessions.control.models import Handoff

    _, token = create_token(project, name="mcp-keys", permissions=["read", "write"])

    async def scenario() -> dict[str, Any]:
        async with Client(stdio(mcp_backend, token)) as c:
            s = await tool_ok(c, "open_session", role="writer", memory_policy="bounded", task_mode="drafting",
                              runtime_family="claude-code")
            run = await tool_ok(c, "start_run", session_id=s["id"], cursor={"step": 1}, idempotency_key="run-1")
            again = await tool_ok(c, "start_run", session_id=s["id"], cursor={"step": 1}, idempotency_key="run-1")
            await tool_refused(c, "start_run", "idempotency_key_reused", session_id=s["id"], cursor={"step": 2},
                               idempotency_key="run-1")
            job = await tool_ok(c, "hand_off", run_id=run["id"], logical_id="chapter-3", idempotency_key="job-1")
            job_again = await tool_ok(c, "hand_off", run_id=run["id"], logical_id="chapter-3", idempotency_key="job-1")
            await tool_refused(c, "hand_off", "idempotency_key_reused", run_id=run["id"], logical_id="chapter-4",
                               idempotency_key="job-1")
            other = await tool_ok(c, "open_session", role="writer", memory_policy="bounded", task_mode="drafting",
                                  runtime_family="claude-code")
            await tool_ok(c, "close_session", session_id=other["id"])
            att = await tool_ok(c, "attach_session", session_id=other["id"], runtime_family="codex",
                                idempotency_key="att-1")
            att_again = await tool_ok(c, "attach_session", session_id=other["id"], runtime_family="codex",
                                      idempotency_key="att-1")
            return {"session": s["id"], "other": other["id"], "runs": (run["id"], again["id"]),
                    "jobs": (job["id"], job_again["id"]), "runtimes": (att["id"], att_again["id"])}

    out = asyncio.run(scenario())
    assert out["runs"][0] == out["runs"][1] and out["jobs"][0] == out["jobs"][1]
    assert out["runtimes"][0] == out["runtimes"][1]
    assert Run.objects.filter(session_id=out["session"]).count() == 1
    assert Handoff.objects.filter(run_id=out["runs"][0]).count() == 1
    assert list(RuntimeAttachment.objects.filter(session_id=out["other"]).order_by("generation")
                .values_list("generation", "runtime_family")) == [(1, "claude-code"), (2, "codex")]


class HttpServer:
    """``novelforge-mcp --transport streamable-http`` in a subprocess on a free port."""

    def __init__(self, backend: DaphneServer, *, ambient_token: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "NOVELFORGE_URL": backend.url}
        if ambient_token:
            env["NOVELFORGE_TOKEN"] = ambient_token  # what it once acted with for anyone
        self.log_path = ROOT / "tests" / "artifacts" / f"mcp-http-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:  # a file, not a pipe: a full pipe would stall the server
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "novelforge_client.mcp_server", "--transport", "streamable-http", "--port",
                 str(self.port)], cwd="/", env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_until(lambda: socket.create_connection(("127.0.0.1", self.port), timeout=1).close() or True,
                   "the MCP server to listen", timeout=60, ignore=(OSError,),
                   fail=lambda: None if self.proc.poll() is None else self.log()[-2000:])

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> str:
        """Stop it; its log, which never holds a token (every token the tests make starts `nfs_`)."""
        self.proc.terminate()
        self.proc.wait(timeout=10)
        log = self.log()
        assert "nfs_" not in log, "the MCP server logged a token"
        return log

    def post(self, body: dict[str, Any], token: str | None = None, **headers: str) -> httpx.Response:
        """One raw JSON-RPC POST, as any local process could send it."""
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.post(self.url, json=body, timeout=30, headers={
            "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18", **headers})

    @asynccontextmanager
    async def client(self, token: str) -> AsyncIterator[Client]:
        """The SDK's client, configured as a host is: ``Authorization: Bearer <token>`` on every request."""
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                      timeout=httpx2.Timeout(30, read=300)) as http:
            async with Client(streamable_http_client(self.url, http_client=http)) as c:
                yield c


@pytest.fixture(scope="module")
def mcp_http(mcp_backend) -> Iterator[HttpServer]:
    srv = HttpServer(mcp_backend)
    yield srv
    srv.stop()


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}}}
OPEN_SESSION = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "open_session", "arguments": {
    "role": "writer", "memory_policy": "bounded", "task_mode": "drafting", "runtime_family": "intruder"}}}


def refused_401(response: httpx.Response) -> None:
    assert response.status_code == 401, (response.status_code, response.text)
    assert response.headers["www-authenticate"].startswith("Bearer ")
    assert "nfs_" not in response.text


def test_over_http_a_request_without_a_valid_bearer_token_is_401_even_with_an_ambient_token(mcp_backend, project):
    """Any local process reaching the port once acted with NOVELFORGE_TOKEN. Now the server
    ignores it over HTTP: no header, another scheme, an unknown, revoked, oversized or truncated token → 401,
    and nothing is written."""
    _, ambient = create_token(project, name="mcp-ambient", permissions=["read", "write"])
    _, revoked = create_token(project, name="mcp-revoked", permissions=["read", "write"])
    ApiToken.objects.filter(name="mcp-revoked").update(revoked_at=timezone.now())
    srv = HttpServer(mcp_backend, ambient_token=ambient)
    try:
        before = (Session.objects.count(), RuntimeAttachment.objects.count())
        for token in (None, "nfs_not-a-token", revoked, "x" * 300, ambient[:-1]):
            refused_401(srv.post(INITIALIZE, token))
            refused_401(srv.post(OPEN_SESSION, token))
        refused_401(srv.post(OPEN_SESSION, Authorization=f"Basic {ambient}"))  # only a bearer token counts
        # No OAuth metadata to send a host elsewhere: the configured header is the only way in.
        assert httpx.get(f"http://127.0.0.1:{srv.port}/.well-known/oauth-protected-resource").status_code == 404
        # Another MCP client of the same server, with no token of its own, gets nothing either.
        with pytest.raises(ExceptionGroup) as failed:
            asyncio.run(_list_tools_without_a_token(srv.url))
        assert failed.value.subgroup(lambda e: isinstance(e, MCPError)) is not None, failed.value
        assert (Session.objects.count(), RuntimeAttachment.objects.count()) == before
        # The ambient token itself, presented by its holder, works: the header is the only way in.
        initialized = srv.post(INITIALIZE, ambient)
        assert initialized.status_code == 200, initialized.text
    finally:
        log = srv.stop()
    assert "NOVELFORGE_TOKEN is ignored over streamable HTTP" in log


async def _list_tools_without_a_token(url: str) -> None:
    async with Client(url) as c:
        await c.list_tools()


def test_over_http_each_client_acts_with_its_own_token_and_sees_only_its_scope(mcp_http, project, new_session):
    """Two clients of one server, each with a token bound to a different session: each reaches its own
    session only (the other's is `not_found`, as over the API), and every call is the caller's."""
    mine, theirs = new_session(), new_session()
    _, token_a = create_token(project, name="mcp-a", permissions=["read", "write"],
                              session=Session.objects.get(id=mine["id"]))
    _, token_b = create_token(project, name="mcp-b", permissions=["read", "write"],
                              session=Session.objects.get(id=theirs["id"]))

    async def scenario() -> None:
        async with mcp_http.client(token_a) as a, mcp_http.client(token_b) as b:
            assert {t.name for t in (await a.list_tools()).tools} == TOOLS
            assert (await tool_ok(a, "whoami"))["slug"] == project.slug
            assert (await tool_ok(a, "get_session", session_id=mine["id"]))["id"] == mine["id"]
            assert (await tool_ok(b, "get_session", session_id=theirs["id"]))["id"] == theirs["id"]
            await tool_refused(a, "get_session", "not_found", session_id=theirs["id"])
            await tool_refused(b, "get_session", "not_found", session_id=mine["id"])
            await tool_refused(a, "close_session", "not_found", session_id=theirs["id"])
            await tool_refused(b, "close_session", "not_found", session_id=mine["id"])
            # Interleaved on one server process, the scopes stay apart.
            results = await asyncio.gather(*(tool_ok(c, "get_session", session_id=sid)
                                             for c, sid in [(a, mine["id"]), (b, theirs["id"])] * 3))
            assert [r["id"] for r in results] == [mine["id"], theirs["id"]] * 3
            # Each call is the service's to authorize: B's token revoked, B's next call is refused at
            # once (whatever the MCP layer remembers of its verification), A carries on.
            await asyncio.to_thread(ApiToken.objects.filter(name="mcp-b").update, revoked_at=timezone.now())
            await tool_refused(b, "get_session", "unauthorized", session_id=theirs["id"])
            await tool_refused(b, "close_session", "unauthorized", session_id=theirs["id"])
            assert (await tool_ok(a, "get_session", session_id=mine["id"]))["id"] == mine["id"]

    asyncio.run(scenario())
    for sid in (mine["id"], theirs["id"]):  # neither close went through
        assert RuntimeAttachment.objects.filter(session_id=sid, ended_at__isnull=True).count() == 1


def test_over_http_an_mcp_session_belongs_to_the_token_that_opened_it(mcp_http, project):
    """Another token cannot ride an MCP session it did not open (the SDK binds it to the verified token)."""
    _, token_a = create_token(project, name="mcp-owner", permissions=["read", "write"])
    _, token_b = create_token(project, name="mcp-rider", permissions=["read"])
    opened = mcp_http.post(INITIALIZE, token_a)
    assert opened.status_code == 200, opened.text
    sid = opened.headers["mcp-session-id"]
    before = Session.objects.count()
    ridden = mcp_http.post(OPEN_SESSION, token_b, **{"Mcp-Session-Id": sid})
    assert ridden.status_code == 404, ridden.text
    refused_401(mcp_http.post(OPEN_SESSION, None, **{"Mcp-Session-Id": sid}))
    assert Session.objects.count() == before


def test_over_http_a_tool_call_has_the_presented_tokens_permissions(mcp_http, project):
    _, reader = create_token(project, name="mcp-http-reader", permissions=["read"])
    _, writer = create_token(project, name="mcp-http-writer", permissions=["read", "write"])
    before = Session.objects.count()

    async def scenario() -> int:
        async with mcp_http.client(reader) as r, mcp_http.client(writer) as w:
            err = await tool_refused(r, "open_session", "forbidden", role="writer", memory_policy="bounded",
                                     task_mode="drafting", runtime_family="codex")
            assert err["status"] == 403 and err["details"]["permission"] == "write"
            await tool_refused(r, "start_run", "forbidden", session_id=1)
            s = await tool_ok(w, "open_session", role="writer", memory_policy="bounded", task_mode="drafting",
                              runtime_family="codex")
            assert (await tool_ok(r, "get_session", session_id=s["id"]))["status"] == "created"
            await tool_refused(r, "close_session", "forbidden", session_id=s["id"])
            # The writer's runtime is fenced by its own client: the reader never attached it.
            await tool_ok(w, "start_run", session_id=s["id"])
            return s["id"]

    sid = asyncio.run(scenario())
    assert Session.objects.count() == before + 1  # only the writer's open
    assert Session.objects.get(id=sid).status == "running"
    assert RuntimeAttachment.objects.filter(session_id=sid, ended_at__isnull=True).count() == 1


def test_over_http_the_dns_rebinding_protection_stays_on(mcp_http, project):
    _, token = create_token(project, name="mcp-host", permissions=["read"])
    assert mcp_http.post(INITIALIZE, token, Host="attacker.example").status_code == 421
    assert mcp_http.post(INITIALIZE, token, Origin="http://attacker.example").status_code == 403
    assert mcp_http.post(INITIALIZE, token, Origin=f"http://localhost:{mcp_http.port}").status_code == 200


def test_the_token_verifier_remembers_only_a_valid_token_briefly_by_its_hash(mcp_backend, project, caplog):
    """The SDK's TokenVerifier: the service decides (one authenticated GET); a positive answer is kept
    for `verified_for` seconds under the token's sha256, a refusal is not kept, the token is never logged."""
    _, valid = create_token(project, name="mcp-verify", permissions=["read", "write"])
    _, worker = create_token(project, name="mcp-verify-worker", permissions=["work"])  # no `read`
    caplog.set_level(logging.DEBUG)

    async def scenario() -> None:
        brief = NovelForgeTokenVerifier(mcp_backend.url, verified_for=60)
        none = NovelForgeTokenVerifier(mcp_backend.url, verified_for=0)
        down = NovelForgeTokenVerifier(f"http://127.0.0.1:{free_port()}", verified_for=60)
        try:
            access = await brief.verify_token(valid)
            assert access is not None and access.token == valid and valid not in access.client_id
            assert access.client_id.endswith(token_key(valid)) and access.scopes == []
            acting = brief.client_for(valid)
            assert acting is not None and acting.token == valid
            assert (await none.verify_token(worker)) is not None  # authenticated (403 on /project, not 401)
            for bad in ("nfs_not-a-token", "", "x" * 300, valid + "\n"):
                assert await brief.verify_token(bad) is None and brief.client_for(bad) is None

            await asyncio.to_thread(ApiToken.objects.filter(name="mcp-verify").update, revoked_at=timezone.now())
            assert await brief.verify_token(valid) is not None  # remembered, briefly
            assert await none.verify_token(valid) is None and none.client_for(valid) is None  # asked again
            brief._verified_until.clear()  # its moment passes
            assert await brief.verify_token(valid) is None and brief.client_for(valid) is None  # forgotten

            assert await down.verify_token(worker) is None  # an unreachable service: fail closed
            assert down.client_for(worker) is None
        finally:
            for v in (brief, none, down):
                await v.aclose()

    asyncio.run(scenario())
    assert "could not be verified" in caplog.text  # the unreachable service is named in the log...
    assert valid not in caplog.text and worker not in caplog.text  # ...and no token ever is


def test_the_dns_rebinding_protection_covers_any_bound_address():
    """On by default for loopback in the SDK; here also for another address, with the names it is reached by."""
    loopback = transport_security("127.0.0.1", [])
    assert loopback.enable_dns_rebinding_protection and "localhost:*" in loopback.allowed_hosts
    assert "http://127.0.0.1:*" in loopback.allowed_origins and "[::1]:*" in loopback.allowed_hosts
    wildcard = transport_security("0.0.0.0", ["nf.internal"])
    assert wildcard.enable_dns_rebinding_protection
    assert {"nf.internal", "nf.internal:*"} <= set(wildcard.allowed_hosts)
    assert not any(h.startswith("0.0.0.0") for h in wildcard.allowed_hosts)
    assert "https://nf.internal" in wildcard.allowed_origins
    assert "10.0.0.5:*" in transport_security("10.0.0.5", []).allowed_hosts
