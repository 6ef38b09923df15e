"""The Session Runtime as MCP tools (official ``mcp`` SDK; ``pip install 'novelforge-session-runtime[mcp]'``).

An agent host (Claude Code, Codex, any MCP client) gets a durable execution identity with no
code: open or attach to a session, start a run, checkpoint, hand off and claim work, deliver
results, open a review gate and wait for its verdict, resume with the report. Every tool acts
with the scope of one API token (``NOVELFORGE_TOKEN``, against ``NOVELFORGE_URL``): the server
authorizes each call, so a read-only token's writes are refused, a session-bound token reaches
only its session. A refusal is a tool error (``isError``) whose structured content is the
service's error, ``{"error": {"code", "status", "message", "details"}}``.

    novelforge-mcp                                   # stdio (what hosts launch)
    novelforge-mcp --transport streamable-http --port 8765   # http://127.0.0.1:8765/mcp
"""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

try:
    from mcp.server.mcpserver import MCPServer
    from mcp.types import CallToolResult, TextContent, ToolAnnotations
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("novelforge-mcp needs the MCP SDK: pip install 'novelforge-session-runtime[mcp]'") from exc

from novelforge_client.client import AsyncClient
from novelforge_client.errors import NovelForgeError

INSTRUCTIONS = """\
NovelForge Session Runtime: a durable, resumable execution identity for this agent.
A session is the durable container (role, memory policy); a runtime is this process (keep its
lease alive with `heartbeat`); a run is one episode; a checkpoint is a bounded cursor plus
fingerprints (never a transcript). Typical flow: open_session → start_run → checkpoint at
boundaries → hand_off/claim_work/deliver_result or open_review_gate + wait_for_verdict →
end_run. After a crash or restart: resume_session (a revalidation report; refused with the
failed steps if a binding changed). Errors come back as tool errors carrying the service's code.
"""

server = MCPServer(name="novelforge-sessions", instructions=INSTRUCTIONS)
_clients: dict[str, AsyncClient] = {}

Role = Literal["manager", "writer", "specialist", "semantic_reviewer", "human_reviewer", "other"]
Memory = Literal["none", "bounded", "session", "external", "checkpoint_only"]
Boundary = Literal["context_freeze", "candidate_frozen", "user_wait", "external_wait", "before_consequential_write",
                   "after_external_result", "before_canon_settlement", "before_long_handoff"]
Json = dict[str, Any]


def client() -> AsyncClient:
    """One client per server process: it remembers the runtime ids it attached, for fencing."""
    if "default" not in _clients:
        token = os.environ.get("NOVELFORGE_TOKEN")
        if not token:
            raise NovelForgeError("NOVELFORGE_TOKEN is not set: the MCP server acts with one API token's scope",
                                  code="unauthorized", status=401)
        _clients["default"] = AsyncClient(os.environ.get("NOVELFORGE_URL", "http://127.0.0.1:8000"), token)
    return _clients["default"]


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _result(data: Any) -> CallToolResult:
    structured = _plain(data)
    if not isinstance(structured, dict):
        structured = {"result": structured}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(structured, default=str))],
                          structured_content=structured)


def _error(exc: NovelForgeError) -> CallToolResult:
    body = {"error": {"code": exc.code, "status": exc.status, "message": exc.message, "details": exc.details}}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(body, default=str))],
                          structured_content=body, is_error=True)


async def _run(call: Callable[[AsyncClient], Awaitable[Any]]) -> CallToolResult:
    try:
        return _result(await call(client()))
    except NovelForgeError as exc:
        return _error(exc)
    except TimeoutError as exc:
        return _error(NovelForgeError(str(exc), code="timeout", status=0))


_WRITE = ToolAnnotations(readOnlyHint=False, destructiveHint=False)
_READ = ToolAnnotations(readOnlyHint=True)


# ---- sessions and runtimes --------------------------------------------------------------------------
@server.tool(annotations=_WRITE)
async def open_session(
    role: Annotated[Role, Field(description="execution responsibility (not authority)")],
    memory_policy: Annotated[Memory, Field(description="what this runtime may retain")],
    task_mode: Annotated[str, Field(description="the task mode, e.g. drafting", max_length=64)],
    runtime_family: Annotated[str, Field(description="this host, e.g. claude-code or codex", max_length=64)],
    capabilities: Annotated[list[str], Field(description="what this runtime can do (routing)")] = [],  # noqa: B006
    lease_seconds: Annotated[int | None, Field(ge=1, le=3600, description="runtime lease; heartbeat well within")] = None,
) -> CallToolResult:
    """Open a new session with this host as runtime generation 1. Returns the session and `runtime_id`."""
    return await _run(lambda c: c.create_session(
        role=role, memory_policy=memory_policy, task_mode=task_mode, runtime_family=runtime_family,
        runtime={"runtime_family": runtime_family, "capabilities": capabilities, "lease_seconds": lease_seconds},
    ))


@server.tool(annotations=_WRITE)
async def attach_session(
    session_id: Annotated[int, Field(ge=1)],
    runtime_family: Annotated[str, Field(max_length=64)],
    capabilities: list[str] = [],  # noqa: B006
    lease_seconds: Annotated[int | None, Field(ge=1, le=3600)] = None,
) -> CallToolResult:
    """Attach this host to an existing session as its next runtime generation (no live runtime may hold it)."""
    return await _run(lambda c: c.attach(session_id, runtime_family, capabilities=capabilities,
                                         lease_seconds=lease_seconds))


@server.tool(annotations=_READ)
async def get_session(session_id: Annotated[int, Field(ge=1)]) -> CallToolResult:
    """A session: status, reason, generation, allowed transitions."""
    return await _run(lambda c: c.session(session_id))


@server.tool(annotations=_WRITE)
async def heartbeat(runtime_id: Annotated[int, Field(ge=1)],
                    lease_seconds: Annotated[int | None, Field(ge=1, le=3600)] = None) -> CallToolResult:
    """Renew this runtime's lease. `abort_requested` true: end the open run with outcome `aborted`."""
    return await _run(lambda c: c.heartbeat(runtime_id, lease_seconds))


@server.tool(annotations=_WRITE)
async def close_session(session_id: Annotated[int, Field(ge=1)], reason: str = "") -> CallToolResult:
    """End this host's runtime generation; the session record stays (resume it later)."""
    return await _run(lambda c: c.close(session_id, reason=reason or None))


@server.tool(annotations=_WRITE)
async def resume_session(
    session_id: Annotated[int, Field(ge=1)],
    runtime_family: Annotated[str, Field(max_length=64)],
    capabilities: list[str] = [],  # noqa: B006
    checkpoint_id: Annotated[int | None, Field(ge=1, description="default: the latest checkpoint")] = None,
    dry_run: Annotated[bool, Field(description="only report; change nothing")] = False,
) -> CallToolResult:
    """Resume after an interruption: revalidate every binding (framework, authority, artifact fingerprints,
    approvals, capabilities, results, gates), then runtime generation N+1 and a new run. Returns the step
    report; a refused resume is a `resume_refused` error whose details carry the report and repairs."""
    return await _run(lambda c: c.resume(session_id, {"runtime_family": runtime_family, "capabilities": capabilities},
                                         checkpoint_id=checkpoint_id, dry_run=dry_run))


# ---- runs and checkpoints ----------------------------------------------------------------------------
@server.tool(annotations=_WRITE)
async def start_run(
    session_id: Annotated[int, Field(ge=1)],
    cursor: Annotated[Json | None, Field(description="the workflow step to start at")] = None,
    task_mode: Annotated[str | None, Field(max_length=64)] = None,
) -> CallToolResult:
    """Start the session's next run (needs a live runtime; at most one open run)."""
    return await _run(lambda c: c.start_run(session_id, cursor=cursor, task_mode=task_mode))


@server.tool(annotations=_WRITE)
async def checkpoint(
    run_id: Annotated[int, Field(ge=1)],
    boundary: Annotated[Boundary, Field(description="where repeating or forgetting work would be dangerous")],
    cursor: Annotated[Json, Field(description="the workflow cursor: a small JSON object, never a transcript")],
    artifacts: Annotated[list[Json], Field(description='[{"artifact_id", "fingerprint"}] the cursor relies on')] = [],  # noqa: B006
    pending: Annotated[Json, Field(description='what the run waits on: {"handoffs": [...], "gates": [{"gate_id"}]}')] = {},  # noqa: B006
) -> CallToolResult:
    """Record a bounded checkpoint of an open run (refused `checkpoint_not_bounded` for transcript-like bodies)."""
    return await _run(lambda c: c.checkpoint(run_id, boundary=boundary, cursor=cursor, artifacts=artifacts or None,
                                             pending=pending or None))


@server.tool(annotations=_WRITE)
async def end_run(
    run_id: Annotated[int, Field(ge=1)],
    outcome: Literal["completed", "failed", "aborted"],
    session_status: Annotated[str | None, Field(description="where the session goes (default by outcome)")] = None,
    reason: str = "",
) -> CallToolResult:
    """End the open run; the session goes idle, completed or failed."""
    return await _run(lambda c: c.end_run(run_id, outcome, session_status=session_status, reason=reason or None))


@server.tool(annotations=_WRITE)
async def create_artifact(name: Annotated[str, Field(min_length=1, max_length=200)], content: str,
                          kind: Annotated[str, Field(max_length=64)] = "document") -> CallToolResult:
    """Create an artifact with its first (current) version; the server computes its sha256 fingerprint."""
    return await _run(lambda c: c.create_artifact(name, content, kind=kind))


# ---- handoffs and results ----------------------------------------------------------------------------
@server.tool(annotations=_WRITE)
async def hand_off(
    run_id: Annotated[int, Field(ge=1)],
    logical_id: Annotated[str, Field(min_length=1, max_length=200, description="names the logical result")],
    params: Annotated[Json, Field(description="the job's instructions (bounded)")] = {},  # noqa: B006
    inputs: Annotated[list[Json], Field(description='[{"artifact_id", "fingerprint"}] frozen inputs')] = [],  # noqa: B006
    result_schema: Annotated[Json, Field(description="the result's shape (short form or JSON Schema)")] = {},  # noqa: B006
    required_capabilities: list[str] = [],  # noqa: B006
    timeout_seconds: Annotated[int | None, Field(ge=1, le=86400)] = None,
) -> CallToolResult:
    """Freeze a job for another worker; the session waits in `awaiting_external` until its result binds."""
    return await _run(lambda c: c.hand_off(run_id, logical_id, inputs=inputs or None, params=params or None,
                                           result_schema=result_schema or None,
                                           required_capabilities=required_capabilities or None,
                                           timeout_seconds=timeout_seconds))


@server.tool(annotations=_WRITE)
async def claim_work(
    worker: Annotated[str, Field(min_length=1, max_length=200, description="this worker's name (lease holder)")],
    capabilities: list[str] = [],  # noqa: B006
    handoff_id: Annotated[int | None, Field(ge=1)] = None,
) -> CallToolResult:
    """Claim an eligible handoff under a lease (`handoff` null: nothing to do). Cite its `fencing_token`
    and `job_fingerprint` when delivering."""
    return await _run(lambda c: _claimed(c, worker, capabilities, handoff_id))


async def _claimed(c: AsyncClient, worker: str, capabilities: list[str], handoff_id: int | None) -> Json:
    return {"handoff": _plain(await c.claim(worker, capabilities, handoff_id=handoff_id))}


@server.tool(annotations=_WRITE)
async def deliver_result(
    handoff_id: Annotated[int, Field(ge=1)],
    fencing_token: Annotated[int, Field(ge=1)],
    job_fingerprint: Annotated[str, Field(max_length=80)],
    result: Json,
) -> CallToolResult:
    """Deliver a claimed job's result (validated against the frozen job; consumed once; a conflicting
    second result is a hard stop)."""
    return await _run(lambda c: c.deliver(handoff_id, fencing_token=fencing_token, job_fingerprint=job_fingerprint,
                                          result=result))


# ---- review gates --------------------------------------------------------------------------------------
@server.tool(annotations=_WRITE)
async def open_review_gate(
    session_id: Annotated[int, Field(ge=1)],
    candidate_version_id: Annotated[int, Field(ge=1, description="the artifact version to review (frozen)")],
    rubric: Annotated[Json, Field(description='{"criteria": [{"key","label","scale":{"min","max"}}], "evidence": [...]}')],
    route: Literal["page", "relay", "agent"],
    reviewers: Annotated[list[str], Field(description="page/relay: usernames with the reviewer role")] = [],  # noqa: B006
    reviewer_session_ids: Annotated[list[int], Field(description="agent: semantic_reviewer sessions")] = [],  # noqa: B006
    required_verdicts: Annotated[int | None, Field(ge=1, le=20)] = None,
) -> CallToolResult:
    """Open a blind review gate on a candidate; the session waits (`awaiting_user` for people,
    `awaiting_external` for agent reviewers) until the verdicts bind."""
    return await _run(lambda c: c.open_review_gate(
        session_id, candidate_version_id=candidate_version_id, rubric=rubric, route=route,
        reviewers=reviewers or None, reviewer_session_ids=reviewer_session_ids or None,
        required_verdicts=required_verdicts))


@server.tool(annotations=_READ)
async def wait_for_verdict(
    gate_id: Annotated[int, Field(ge=1)],
    timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 60,
) -> CallToolResult:
    """Wait until the gate is no longer pending; returns it with its bound verdicts (error `timeout` if not)."""
    return await _run(lambda c: c.wait_for_verdict(gate_id, timeout=timeout_seconds, poll=0.25))


@server.tool(annotations=_READ)
async def whoami() -> CallToolResult:
    """The token's project (current authority, framework): what this server's tools act on."""
    return await _run(lambda c: c.project())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="novelforge-mcp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=args.host, port=args.port)


if __name__ == "__main__":  # pragma: no cover
    main()
