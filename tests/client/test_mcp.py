"""The MCP server, driven by the SDK's own client over stdio against a live server.

Tools are listed with input schemas; a whole session is driven through tools (open, run,
checkpoint, hand off, claim, deliver, review gate and its verdict, resume with the report);
refusals come back as tool errors carrying the service's code, with the token's scope.
"""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.control.models import ConsumeReceipt
from novelforge_sessions.models import Checkpoint, Run, RuntimeAttachment, Session
from reviews.models import ReviewGate
from tests.live import DaphneServer, free_port
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


def stdio(backend: DaphneServer, token: str) -> StdioServerParameters:
    """``novelforge-mcp`` as a host launches it (the module behind the console script)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
           "NOVELFORGE_URL": backend.url, "NOVELFORGE_TOKEN": token}
    return StdioServerParameters(command=sys.executable, args=["-m", "novelforge_client.mcp_server"], env=env, cwd="/")


async def ok(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, (tool, result.content)
    return result.structured_content


async def refused(client: Client, tool: str, code: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, (tool, result.structured_content)
    error = result.structured_content["error"]
    assert error["code"] == code, error
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

            assert (await ok(c, "whoami"))["slug"] == project.slug
            s = await ok(c, "open_session", role="writer", memory_policy="bounded", task_mode="drafting",
                         runtime_family="claude-code", capabilities=["draft"], lease_seconds=120)
            sid, rid = s["id"], s["runtime_id"]
            run = await ok(c, "start_run", session_id=sid, cursor={"step": "outline"})
            art = await ok(c, "create_artifact", name="chapter-3", content=CHAPTER, kind="chapter")
            cp = await ok(c, "checkpoint", run_id=run["id"], boundary="context_freeze", cursor={"step": "draft"},
                          artifacts=[{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}])
            job = await ok(c, "hand_off", run_id=run["id"], logical_id="chapter-3/continuity", params={"check": "names"},
                           result_schema={"ok": "boolean"}, required_capabilities=["continuity"])
            assert (await ok(c, "get_session", session_id=sid))["status"] == "awaiting_external"
            claimed = (await ok(c, "claim_work", worker="mcp-worker", capabilities=["continuity"]))["handoff"]
            assert claimed["id"] == job["id"]
            delivered = await ok(c, "deliver_result", handoff_id=job["id"], fencing_token=claimed["fencing_token"],
                                 job_fingerprint=job["job_fingerprint"], result={"ok": True})
            assert delivered["outcome"] == "consumed" and delivered["session_status"] == "running"
            assert (await ok(c, "heartbeat", runtime_id=rid))["abort_requested"] is False

            gate = await ok(c, "open_review_gate", session_id=sid, candidate_version_id=art["current_version_id"],
                            rubric=RUBRIC, route="agent", reviewer_session_ids=[reviewer_session.id])
            await refused(c, "wait_for_verdict", "timeout", gate_id=gate["id"], timeout_seconds=0.3)
            # The reviewer binds its verdict through the API, as its own session.
            g = await asyncio.to_thread(ReviewGate.objects.select_related("packet").get, id=gate["id"])
            lease = (await asyncio.to_thread(reviewer.post, "/review-packets/claim")).json()["lease"]
            bound = await asyncio.to_thread(reviewer.post, f"/review-packets/{g.packet.id}/verdicts",
                                            agent_verdict(g, lease["fencing_token"], decision="pass"))
            assert bound.status_code == 201, bound.content
            verdict = await ok(c, "wait_for_verdict", gate_id=gate["id"])
            assert verdict["state"] == "complete" and verdict["verdicts"][0]["decision"] == "pass"

            wait = await ok(c, "checkpoint", run_id=run["id"], boundary="before_canon_settlement",
                            cursor={"step": "settle"}, pending={"gates": [{"gate_id": gate["id"]}]})
            # The host restarts: its runtime ends; a new one resumes with the report.
            await ok(c, "close_session", session_id=sid, reason="host restart")
            dry = await ok(c, "resume_session", session_id=sid, runtime_family="claude-code", dry_run=True)
            assert dry["ok"] and dry["dry_run"] and dry["runtime_id"] is None
            report = await ok(c, "resume_session", session_id=sid, runtime_family="claude-code", capabilities=["draft"])
            assert report["ok"] and report["checkpoint_id"] == wait["id"] and report["generation"] == 2
            assert {st["step"] for st in report["steps"]} >= {"load", "authority", "artifacts", "reviews", "consumed"}
            ended = await ok(c, "end_run", run_id=report["run_id"], outcome="completed", session_status="completed")
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
            s = await ok(c, "open_session", role="writer", memory_policy="bounded", task_mode="drafting",
                         runtime_family="codex")
            run = await ok(c, "start_run", session_id=s["id"])
            err = await refused(c, "start_run", "open_run_exists", session_id=s["id"])
            assert err["status"] == 409 and err["details"]["run_id"] == run["id"]
            await refused(c, "checkpoint", "checkpoint_not_bounded", run_id=run["id"], boundary="user_wait",
                          cursor={"messages": [{"role": "user", "content": "hi"}]})
            await refused(c, "get_session", "not_found", session_id=987654321)
            await refused(c, "claim_work", "forbidden", worker="w")  # this token has no `work` permission
            invalid = await c.call_tool("checkpoint", {"run_id": run["id"], "boundary": "whenever", "cursor": {}})
            assert invalid.is_error and "boundary" in invalid.content[0].text  # the input schema refuses it
        async with Client(stdio(mcp_backend, reader)) as c:
            assert (await ok(c, "get_session", session_id=s["id"]))["status"] == "running"
            err = await refused(c, "open_session", "forbidden", role="writer", memory_policy="bounded",
                                task_mode="drafting", runtime_family="codex")
            assert err["status"] == 403 and err["details"]["permission"] == "write"

    before = Session.objects.count()
    asyncio.run(scenario())
    assert Session.objects.count() == before + 1  # the reader's refused open wrote nothing
    assert Checkpoint.objects.count() == 0


def test_the_streamable_http_transport_serves_the_same_tools(mcp_backend, project):
    _, token = create_token(project, name="mcp-http", permissions=["read"])
    port = free_port()
    env = {**stdio(mcp_backend, token).env}
    proc = subprocess.Popen([sys.executable, "-m", "novelforge_client.mcp_server", "--transport", "streamable-http",
                             "--port", str(port)], cwd="/", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:  # wait until it accepts connections (or exited)
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the MCP server did not listen"
                time.sleep(0.1)

        async def scenario() -> None:
            async with Client(f"http://127.0.0.1:{port}/mcp") as c:
                assert {t.name for t in (await c.list_tools()).tools} == TOOLS
                assert (await ok(c, "whoami"))["slug"] == project.slug
                await refused(c, "start_run", "forbidden", session_id=1)  # a read-only token

        asyncio.run(scenario())
    finally:
        proc.terminate()
        proc.wait(timeout=10)
