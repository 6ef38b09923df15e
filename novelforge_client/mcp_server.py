"""The Session Runtime as MCP tools (official ``mcp`` SDK; ``pip install 'novelforge-session-runtime[mcp]'``).

An agent host (Claude Code, Codex, any MCP client) gets a durable execution identity with no
code: open or attach to a session, start a run, checkpoint, hand off and claim work, deliver
results, open a review gate and wait for its verdict, resume with the report. Every tool acts
with the scope of one API token, against ``NOVELFORGE_URL``: the service authorizes each call,
so a read-only token's writes are refused, a session-bound token reaches only its session. A
refusal is a tool error (``isError``) whose structured content is the service's error,
``{"error": {"code", "status", "message", "details"}}``.

Whose token: over stdio, ``NOVELFORGE_TOKEN`` (the host that launches the process owns it and is
its only client). Over streamable HTTP, the caller's: every HTTP request carries
``Authorization: Bearer nfs_…``, verified against the service (the SDK's bearer middleware with
:class:`NovelForgeTokenVerifier`), and each tool call acts with that request's token, so two
clients of one server each get exactly their own scope and a request without a valid token is
401 before anything runs. ``NOVELFORGE_TOKEN`` is never used over HTTP (no ambient authority).

    novelforge-mcp                                   # stdio (what hosts launch)
    novelforge-mcp --transport streamable-http --port 8765   # http://127.0.0.1:8765/mcp, bearer tokens
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AnyHttpUrl, BaseModel, Field

try:
    from mcp.server.auth.middleware.auth_context import get_access_token
    from mcp.server.auth.provider import AccessToken
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.mcpserver import MCPServer
    from mcp.server.transport_security import TransportSecuritySettings
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

DEFAULT_URL = "http://127.0.0.1:8000"
#: How long a verified bearer token is taken as valid without asking the service again. Only the
#: MCP layer relies on it (listing tools, opening a session): every tool call is authorized by the
#: service itself, so a revoked token's calls are refused at once whatever this says.
VERIFIED_FOR_SECONDS = 15.0
#: The service refuses longer tokens unread; so does the verifier, without a request.
MAX_TOKEN_LENGTH = 200
LOOPBACK = ("127.0.0.1", "localhost", "::1")

log = logging.getLogger("novelforge_client.mcp_server")

Role = Literal["manager", "writer", "specialist", "semantic_reviewer", "human_reviewer", "other"]
Memory = Literal["none", "bounded", "session", "external", "checkpoint_only"]
Boundary = Literal["context_freeze", "candidate_frozen", "user_wait", "external_wait", "before_consequential_write",
                   "after_external_result", "before_canon_settlement", "before_long_handoff"]
Json = dict[str, Any]


def token_key(token: str) -> str:
    """What the server keys a token by (its caches, the SDK's session owner): its sha256, never the token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class NovelForgeTokenVerifier:
    """The SDK's ``TokenVerifier`` for NovelForge API tokens, and the per-token clients tools act with.

    A token is valid when the service authenticates it: one ``GET /project`` (200, or 403 for a
    token without `read`: authenticated, only not allowed to read the project). A positive answer
    is remembered for :data:`VERIFIED_FOR_SECONDS` by the token's hash; a refusal or an unreachable
    service is not remembered and the request is 401 (fail closed; the reason is logged, the token
    never is). Each valid token has its own :class:`AsyncClient`, which remembers the runtimes that
    token attached (generation fencing), so clients with different tokens share nothing.
    """

    def __init__(self, base_url: str, *, verified_for: float = VERIFIED_FOR_SECONDS) -> None:
        self.base_url = base_url
        self.verified_for = verified_for
        self._clients: dict[str, AsyncClient] = {}  # token hash → the client acting with that token
        self._verified_until: dict[str, float] = {}  # token hash → monotonic deadline of the last verification

    async def verify_token(self, token: str) -> AccessToken | None:
        if not token or len(token) > MAX_TOKEN_LENGTH or not token.isprintable():
            return None
        key = token_key(token)
        if self._verified_until.get(key, 0.0) > time.monotonic() and key in self._clients:
            return self._access(token, key)
        known = key in self._clients
        # No await between the lookup and the insert: concurrent first requests share one client.
        c = self._clients.get(key) or self._clients.setdefault(key, AsyncClient(self.base_url, token))
        try:
            await c.project()
        except NovelForgeError as exc:
            if exc.status != 403:  # 403: authenticated, without `read`; anything else is not a verified token
                await self._refused(key, c, forget=exc.status == 401 or not known,
                                    why=None if exc.status == 401 else exc.code)
                return None
        except Exception as exc:  # not the service's answer (a wrong NOVELFORGE_URL): refused, never a 500
            await self._refused(key, c, forget=not known, why=type(exc).__name__)
            return None
        self._verified_until[key] = time.monotonic() + self.verified_for
        return self._access(token, key)

    def client_for(self, token: str) -> AsyncClient | None:
        """The client of a token this verifier accepted (None for any other)."""
        return self._clients.get(token_key(token))

    @staticmethod
    def _access(token: str, key: str) -> AccessToken:
        # client_id is the token's identity for the SDK: a streamable HTTP session is bound to the
        # token that opened it (another token's requests for it are 404). No scopes: the service
        # authorizes every call with the token's own permissions.
        return AccessToken(token=token, client_id=f"nfs-token-sha256:{key}", scopes=[])

    async def _refused(self, key: str, c: AsyncClient, *, forget: bool, why: str | None) -> None:
        """Not verified: the request is 401. The token's client goes with a refused token (and with one
        never verified); a token verified before keeps it (its runtimes) through an outage."""
        self._verified_until.pop(key, None)
        if why is not None:
            log.warning("a bearer token could not be verified against %s: %s (refused with 401)", self.base_url, why)
        if forget and self._clients.get(key) is c:
            del self._clients[key]
            await c.aclose()
        return None

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        self._verified_until.clear()
        for c in clients:
            await c.aclose()


# Whose token a tool call acts with: set by the transport (stdio: the one ambient client; HTTP: the
# verifier, and then nothing else).
_ambient: dict[str, AsyncClient] = {}
_verifier: NovelForgeTokenVerifier | None = None


def client() -> AsyncClient:
    """The client this tool call acts with: the HTTP request's verified bearer token, or over stdio the
    host's ``NOVELFORGE_TOKEN`` (one client per process: it remembers the runtime ids it attached)."""
    if _verifier is not None:  # streamable HTTP: the caller's own token, never an ambient one
        access = get_access_token()
        acting = _verifier.client_for(access.token) if access is not None else None
        if acting is None:
            raise NovelForgeError("this request carries no verified bearer token", code="unauthorized", status=401)
        return acting
    if "default" not in _ambient:
        token = os.environ.get("NOVELFORGE_TOKEN")
        if not token:
            raise NovelForgeError("NOVELFORGE_TOKEN is not set: the MCP server acts with one API token's scope",
                                  code="unauthorized", status=401)
        _ambient["default"] = AsyncClient(os.environ.get("NOVELFORGE_URL", DEFAULT_URL), token)
    return _ambient["default"]


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


_WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False)  # readOnlyHint, destructiveHint on the wire
_READ = ToolAnnotations(read_only_hint=True)
_TOOLS: list[tuple[Callable[..., Awaitable[CallToolResult]], ToolAnnotations]] = []
_F = TypeVar("_F", bound=Callable[..., Awaitable[CallToolResult]])


def _tool(annotations: ToolAnnotations) -> Callable[[_F], _F]:
    """Declare a tool; :func:`build_server` registers them all on the server it builds."""
    def register(fn: _F) -> _F:
        _TOOLS.append((fn, annotations))
        return fn
    return register


#: The key of a write that creates something: repeat the tool call with the same key (and arguments) and it
#: answers what the first call wrote instead of writing again (another body with the same key is
#: `idempotency_key_reused`); without it, one fresh key per call (the client's own retries reuse it).
IdempotencyKey = Annotated[str | None, Field(
    min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$",
    description="repeat this call with the same key (and arguments) and it answers what the first call wrote "
                "instead of writing again; without it, one fresh key per call")]


# ---- sessions and runtimes --------------------------------------------------------------------------
@_tool(_WRITE)
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


@_tool(_WRITE)
async def attach_session(
    session_id: Annotated[int, Field(ge=1)],
    runtime_family: Annotated[str, Field(max_length=64)],
    capabilities: list[str] = [],  # noqa: B006
    lease_seconds: Annotated[int | None, Field(ge=1, le=3600)] = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    """Attach this host to an existing session as its next runtime generation (no live runtime may hold it).
    Give an `idempotency_key` when this call may be repeated."""
    return await _run(lambda c: c.attach(session_id, runtime_family, capabilities=capabilities,
                                         lease_seconds=lease_seconds, idempotency_key=idempotency_key))


@_tool(_READ)
async def get_session(session_id: Annotated[int, Field(ge=1)]) -> CallToolResult:
    """A session: status, reason, generation, allowed transitions."""
    return await _run(lambda c: c.session(session_id))


@_tool(_WRITE)
async def heartbeat(runtime_id: Annotated[int, Field(ge=1)],
                    lease_seconds: Annotated[int | None, Field(ge=1, le=3600)] = None) -> CallToolResult:
    """Renew this runtime's lease. `abort_requested` true: end the open run with outcome `aborted`."""
    return await _run(lambda c: c.heartbeat(runtime_id, lease_seconds))


@_tool(_WRITE)
async def close_session(session_id: Annotated[int, Field(ge=1)], reason: str = "") -> CallToolResult:
    """End this host's runtime generation; the session record stays (resume it later)."""
    return await _run(lambda c: c.close(session_id, reason=reason or None))


@_tool(_WRITE)
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
@_tool(_WRITE)
async def start_run(
    session_id: Annotated[int, Field(ge=1)],
    cursor: Annotated[Json | None, Field(description="the workflow step to start at")] = None,
    task_mode: Annotated[str | None, Field(max_length=64)] = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    """Start the session's next run (needs a live runtime; at most one open run). Give an
    `idempotency_key` when this call may be repeated."""
    return await _run(lambda c: c.start_run(session_id, cursor=cursor, task_mode=task_mode,
                                            idempotency_key=idempotency_key))


@_tool(_WRITE)
async def checkpoint(
    run_id: Annotated[int, Field(ge=1)],
    boundary: Annotated[Boundary, Field(description="where repeating or forgetting work would be dangerous")],
    cursor: Annotated[Json, Field(description="the workflow cursor: a small JSON object, never a transcript")],
    artifacts: Annotated[list[Json], Field(description='[{"artifact_id", "fingerprint"}] the cursor relies on')] = [],  # noqa: B006
    pending: Annotated[Json, Field(description='what the run waits on: {"handoffs": [...], "gates": [{"gate_id"}]}')] = {},  # noqa: B006
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    """Record a bounded checkpoint of an open run (refused `checkpoint_not_bounded` for transcript-like bodies).
    Give an `idempotency_key` when this call may be repeated (a host retrying after a timeout)."""
    # The client resends the same key on its own retries within this call; a key given here also
    # covers the host repeating the whole tool call.
    return await _run(lambda c: c.checkpoint(run_id, boundary=boundary, cursor=cursor,
                                             artifacts=list(artifacts) or None, pending=pending or None,
                                             idempotency_key=idempotency_key))


@_tool(_WRITE)
async def end_run(
    run_id: Annotated[int, Field(ge=1)],
    outcome: Literal["completed", "failed", "aborted"],
    session_status: Annotated[str | None, Field(description="where the session goes (default by outcome)")] = None,
    reason: str = "",
) -> CallToolResult:
    """End the open run; the session goes idle, completed or failed."""
    return await _run(lambda c: c.end_run(run_id, outcome, session_status=session_status, reason=reason or None))


@_tool(_WRITE)
async def create_artifact(name: Annotated[str, Field(min_length=1, max_length=200)], content: str,
                          kind: Annotated[str, Field(max_length=64)] = "document") -> CallToolResult:
    """Create an artifact with its first (current) version; the server computes its sha256 fingerprint."""
    return await _run(lambda c: c.create_artifact(name, content, kind=kind))


# ---- handoffs and results ----------------------------------------------------------------------------
@_tool(_WRITE)
async def hand_off(
    run_id: Annotated[int, Field(ge=1)],
    logical_id: Annotated[str, Field(min_length=1, max_length=200, description="names the logical result")],
    params: Annotated[Json, Field(description="the job's instructions (bounded)")] = {},  # noqa: B006
    inputs: Annotated[list[Json], Field(description='[{"artifact_id", "fingerprint"}] frozen inputs')] = [],  # noqa: B006
    result_schema: Annotated[Json, Field(description="the result's shape (short form or JSON Schema)")] = {},  # noqa: B006
    required_capabilities: list[str] = [],  # noqa: B006
    timeout_seconds: Annotated[int | None, Field(ge=1, le=86400)] = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    """Freeze a job for another worker; the session waits in `awaiting_external` until its result binds.
    Give an `idempotency_key` when this call may be repeated."""
    return await _run(lambda c: c.hand_off(run_id, logical_id, inputs=list(inputs) or None, params=params or None,
                                           result_schema=result_schema or None,
                                           required_capabilities=required_capabilities or None,
                                           timeout_seconds=timeout_seconds, idempotency_key=idempotency_key))


@_tool(_WRITE)
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


@_tool(_WRITE)
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
@_tool(_WRITE)
async def open_review_gate(
    session_id: Annotated[int, Field(ge=1)],
    candidate_version_id: Annotated[int, Field(ge=1, description="the artifact version to review (frozen)")],
    rubric: Annotated[Json, Field(description='{"criteria": [{"key","label","scale":{"min","max"}}], "evidence": [...]}')],
    route: Literal["page", "relay", "agent"],
    reviewers: Annotated[list[str], Field(description="page/relay: usernames with the reviewer role")] = [],  # noqa: B006
    reviewer_session_ids: Annotated[list[int], Field(description="agent: semantic_reviewer sessions")] = [],  # noqa: B006
    required_verdicts: Annotated[int | None, Field(ge=1, le=20)] = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    """Open a blind review gate on a candidate; the session waits (`awaiting_user` for people,
    `awaiting_external` for agent reviewers) until the verdicts bind. Give an `idempotency_key` when
    this call may be repeated."""
    return await _run(lambda c: c.open_review_gate(
        session_id, candidate_version_id=candidate_version_id, rubric=rubric, route=route,
        reviewers=reviewers or None, reviewer_session_ids=reviewer_session_ids or None,
        required_verdicts=required_verdicts, idempotency_key=idempotency_key))


@_tool(_READ)
async def wait_for_verdict(
    gate_id: Annotated[int, Field(ge=1)],
    timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 60,
) -> CallToolResult:
    """Wait until the gate is no longer pending; returns it with its bound verdicts (error `timeout` if not)."""
    return await _run(lambda c: c.wait_for_verdict(gate_id, timeout=timeout_seconds, poll=0.25))


@_tool(_READ)
async def whoami() -> CallToolResult:
    """The token's project (current authority, framework): what this server's tools act on."""
    return await _run(lambda c: c.project())


def build_server(verifier: NovelForgeTokenVerifier | None = None) -> MCPServer:
    """The MCP server with every tool. With a ``verifier`` (streamable HTTP) the SDK's bearer middleware
    guards the endpoint: a request without a token the service accepts is 401 and reaches no tool."""
    auth = None
    if verifier is not None:
        # A resource server only: no OAuth routes, no protected-resource metadata (NovelForge issues
        # its tokens itself: `manage.py create_api_token` or the admin).
        auth = AuthSettings(issuer_url=AnyHttpUrl(verifier.base_url), resource_server_url=None)
    mcp = MCPServer(name="novelforge-sessions", instructions=INSTRUCTIONS, token_verifier=verifier, auth=auth)
    for fn, hints in _TOOLS:
        mcp.add_tool(fn, annotations=hints)
    return mcp


def transport_security(host: str, allowed_hosts: list[str]) -> TransportSecuritySettings:
    """The SDK's DNS-rebinding protection (Host and Origin checked), on whatever the bound address:
    the loopback names, the address bound if it is a name or an address (not a wildcard), and the
    names given with ``--allowed-host``."""
    names = list(LOOPBACK)
    if host not in ("", "0.0.0.0", "::", *LOOPBACK):
        names.append(host)
    names += [name for name in allowed_hosts if name not in names]
    bare = [f"[{n}]" if ":" in n else n for n in names]  # an IPv6 address is bracketed in Host and Origin
    hosts = [form for b in bare for form in (b, f"{b}:*")]  # without a port (a proxy on 80/443) or with any
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=[f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")])


def main(argv: list[str] | None = None) -> None:
    global _verifier
    parser = argparse.ArgumentParser(prog="novelforge-mcp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio",
                        help="stdio acts with NOVELFORGE_TOKEN; streamable-http with each request's bearer token")
    parser.add_argument("--host", default="127.0.0.1", help="the address to bind (streamable-http)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                        help="a further Host name clients use (streamable-http; DNS-rebinding protection stays on)")
    args = parser.parse_args(argv)
    if args.transport == "stdio":
        build_server().run("stdio")
        return
    if os.environ.get("NOVELFORGE_TOKEN"):
        print("novelforge-mcp: NOVELFORGE_TOKEN is ignored over streamable HTTP: every request acts with the "
              "token of its own `Authorization: Bearer` header", file=sys.stderr)
    _verifier = NovelForgeTokenVerifier(os.environ.get("NOVELFORGE_URL", DEFAULT_URL))
    build_server(_verifier).run("streamable-http", host=args.host, port=args.port,
                                transport_security=transport_security(args.host, args.allowed_host))


if __name__ == "__main__":  # pragma: no cover
    main()
