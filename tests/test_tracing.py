"""OpenTelemetry traces (novelforge_sessions/tracing.py) against real parts.

A real server process (the production server, uvicorn, on the lean API path) with tracing on
exports over OTLP/HTTP to a receiver on loopback (the standard library's HTTP server, decoding
with OpenTelemetry's own protobuf messages). Through the API an agent checkpoints, a worker
claims and delivers, and the session is resumed (once refused, once for real): each action's
span arrives named for what happened, under the request's server span and above the
statements it ran, with its ids and outcome, and no token anywhere in what was exported. Without
any ``OTEL_*`` variable, neither OpenTelemetry's SDK nor an instrumentation is imported and
nothing is wrapped.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from novelforge_client import Client
from novelforge_client import errors as E
from novelforge_client import models as m
from novelforge_sessions import tracing
from novelforge_sessions.actions.tokens import create_token

from tests.support.servers import ROOT, DaphneServer
from tests.support.waits import wait_until

WRITER = dict(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli")


class Receiver:
    """An OTLP/HTTP trace receiver on loopback: every exported span, flattened, and the raw bodies."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver.lock:
                    receiver.bodies.append(body)
                    for resource_spans in request.resource_spans:
                        resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                        for scope_spans in resource_spans.scope_spans:
                            for span in scope_spans.spans:
                                receiver.spans.append({
                                    "name": span.name, "kind": span.kind, "trace": span.trace_id.hex(),
                                    "id": span.span_id.hex(), "parent": span.parent_span_id.hex(),
                                    "scope": scope_spans.scope.name, "service": resource.get("service.name"),
                                    "attributes": {a.key: _value(a.value) for a in span.attributes},
                                })
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def named(self, name: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["name"] == name]

    def by_id(self, span_id: str) -> dict:
        with self.lock:
            return next(s for s in self.spans if s["id"] == span_id)

    def children(self, span: dict) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["parent"] == span["id"] and s["trace"] == span["trace"]]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


SERVER_KIND = 2  # SPAN_KIND_SERVER
CLIENT_KIND = 3  # SPAN_KIND_CLIENT


@pytest.mark.django_db(transaction=True)
def test_the_write_path_spans_arrive_under_their_request_above_their_statements(project, receiver):
    _, agent_raw = create_token(project, name="agent", permissions=["read", "write"])
    _, worker_raw = create_token(project, name="worker", permissions=["read", "work"])
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url,
           "OTEL_SERVICE_NAME": "nf-traced", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    server = DaphneServer(server="uvicorn", extra_env=env)
    try:
        nf, worker = Client(server.url, agent_raw), Client(server.url, worker_raw)
        s = nf.create_session(**WRITER, runtime=m.RuntimeIn(runtime_family="cli", capabilities=["draft"], lease_seconds=300))
        nf.heartbeat(s.runtime_id)
        run = nf.start_run(s.id, cursor={"step": "outline"})
        cp = nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": "draft"})
        job = nf.hand_off(run.id, "continuity-1", required_capabilities=["continuity"], timeout_seconds=60)
        lease = worker.claim("w1", ["continuity"])
        assert lease is not None and lease.id == job.id
        delivered = worker.deliver(lease.id, fencing_token=lease.fencing_token, job_fingerprint=job.job_fingerprint,
                                   result={"ok": True})
        assert delivered.outcome == "consumed"
        with pytest.raises(E.Conflict) as refused:  # the runtime is live: refused, nothing changes
            nf.resume(s.id, {"runtime_family": "cli"})
        assert refused.value.code == "live_runtime_exists"
        nf.abort(s.id, "stop")
        nf.end_run(run.id, "aborted")
        nf.close(s.id)
        report = nf.resume(s.id, {"runtime_family": "cli"}, checkpoint_id=cp.id)
        assert report.ok

        wait_until(lambda: len(receiver.named("resume")) == 2 and receiver.named("heartbeat"),
                   "the resume and heartbeat spans exported", timeout=30)
    finally:
        server.stop()

    def action(name: str, route: str, **expected) -> dict:
        [span] = [s for s in receiver.named(name) if all(s["attributes"].get(f"novelforge.{k}") == v for k, v in expected.items())]
        assert span["service"] == "nf-traced" and span["scope"] == "novelforge_sessions"
        parent = receiver.by_id(span["parent"])  # the request's server span, in the same trace
        assert (parent["name"], parent["kind"], parent["trace"]) == (route, SERVER_KIND, span["trace"])
        statements = [c for c in receiver.children(span) if c["attributes"].get("db.system") == "postgresql"]
        assert statements and all(c["kind"] == CLIENT_KIND for c in statements), receiver.children(span)
        return span

    cp_span = action("checkpoint", "POST /api/v1/runs/{id}/checkpoints", run_id=run.id)
    assert cp_span["attributes"] == {"novelforge.run_id": run.id, "novelforge.session_id": s.id,
                                     "novelforge.checkpoint_id": cp.id, "novelforge.seq": 1, "novelforge.outcome": "created"}
    claim = action("claim", "POST /api/v1/handoffs/claim", outcome="claimed")
    assert claim["attributes"] == {"novelforge.outcome": "claimed", "novelforge.handoff_id": job.id,
                                   "novelforge.session_id": s.id, "novelforge.run_id": run.id, "novelforge.attempt": 1}
    deliver = action("deliver", "POST /api/v1/handoffs/{id}/results", handoff_id=job.id)
    assert deliver["attributes"] == {"novelforge.handoff_id": job.id, "novelforge.outcome": "consumed",
                                     "novelforge.session_id": s.id, "novelforge.run_id": run.id,
                                     "novelforge.delivery_id": delivered.delivery_id}
    refused_span = action("resume", "POST /api/v1/sessions/{id}/resume", outcome="refused")
    assert refused_span["attributes"] == {"novelforge.session_id": s.id, "novelforge.dry_run": False,
                                          "novelforge.outcome": "refused", "novelforge.refusal": "live_runtime_exists"}
    resumed = action("resume", "POST /api/v1/sessions/{id}/resume", outcome="resumed")
    assert resumed["attributes"] == {"novelforge.session_id": s.id, "novelforge.dry_run": False,
                                     "novelforge.outcome": "resumed", "novelforge.checkpoint_id": cp.id,
                                     "novelforge.run_id": report.run_id, "novelforge.runtime_id": report.runtime_id,
                                     "novelforge.failed_steps": 0}
    action("heartbeat", "POST /api/v1/runtimes/{id}/heartbeat", runtime_id=s.runtime_id, outcome="renewed")
    # the server spans carry the HTTP status; no token, nor its hash's input, is exported anywhere
    assert receiver.by_id(cp_span["parent"])["attributes"].get("http.status_code", 201) == 201
    exported = b"".join(receiver.bodies)
    assert agent_raw.encode() not in exported and worker_raw.encode() not in exported and b"nfs_" not in exported


@pytest.mark.django_db(transaction=True)
def test_websockets_have_spans_and_a_token_in_a_query_string_is_redacted(project, receiver):
    import httpx
    from websockets.sync.client import connect

    _, raw = create_token(project, name="agent", permissions=["read"])
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url,
           "OTEL_BSP_SCHEDULE_DELAY": "50"}
    server = DaphneServer(extra_env=env)  # daphne, as make run serves
    try:
        answer = httpx.get(f"{server.url}/api/v1/sessions?token={raw}", timeout=30)
        assert answer.status_code == 401  # a token is never taken from the query string
        with connect(f"{server.ws_url}/ws/events/?token={raw}", origin=server.url, open_timeout=30,
                     additional_headers={"Authorization": f"Bearer {raw}"}) as ws:
            ws.send(json.dumps({"type": "subscribe", "project_id": project.id}))
            assert json.loads(ws.recv(timeout=30))["type"]
        wait_until(lambda: receiver.named("GET /api/v1/sessions") and receiver.named("WS /ws/events/"),
                   "the request's and the socket's spans exported", timeout=30)
    finally:
        server.stop()
    for name in ("GET /api/v1/sessions", "WS /ws/events/"):
        [span] = receiver.named(name)
        assert span["service"] == tracing.DEFAULT_SERVICE_NAME and span["kind"] == SERVER_KIND
        urls = [v for v in span["attributes"].values() if isinstance(v, str) and "token=" in v]
        assert urls and all("token=[redacted]" in v for v in urls), span["attributes"]
    # one span for the whole socket: none per message ("WS /ws/events/ websocket receive", …)
    assert [s["name"] for s in receiver.spans if s["name"].startswith("WS ")] == ["WS /ws/events/"]
    assert raw.encode() not in b"".join(receiver.bodies)


PROBE = """
import json, sys
import psycopg
import novelforge_sessions.asgi as entry
from novelforge_sessions import commit, tracing
from novelforge_sessions.api.asgi import LeanApiApplication
router = getattr(entry.application, "app", entry.application)  # inside the ASGI instrumentation, when on
lean = router.application_mapping["http"].app.app
print(json.dumps({
    "enabled": tracing.ENABLED,
    # the SDK's tracing, the instrumentations, the exporters (redis-py imports OpenTelemetry's API
    # and the SDK's metrics itself when they are installed, and uses them only when told to)
    "imported": sorted(m for m in sys.modules if m.split(".")[:3] == ["opentelemetry", "sdk", "trace"]
                       or m.split(".")[:2] in (["opentelemetry", "instrumentation"], ["opentelemetry", "exporter"])),
    "wrapped": [name for name, fn in (("psycopg.connect", psycopg.connect), ("Connection.connect", psycopg.Connection.connect))
                if hasattr(fn, "__wrapped__")] + (["commit.CURSOR"] if commit.CURSOR is not psycopg.Cursor else []),
    "application": type(entry.application).__name__,
    "lean_run_is_the_pool's": isinstance(lean, LeanApiApplication) and lean.run == lean.pool.run,
}))
"""


def _probe(**otel: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(DJANGO_SETTINGS_MODULE="novelforge_sessions.settings", **otel)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_without_otel_variables_nothing_is_imported_or_wrapped():
    assert _probe() == {"enabled": False, "imported": [], "wrapped": [], "application": "ProtocolTypeRouter",
                        "lean_run_is_the_pool's": True}
    # OTEL_SDK_DISABLED wins over an exporter; "none" is off
    assert _probe(OTEL_TRACES_EXPORTER="otlp", OTEL_SDK_DISABLED="true")["imported"] == []
    assert _probe(OTEL_TRACES_EXPORTER="none")["imported"] == []


def test_with_otel_variables_the_application_is_wrapped():
    seen = _probe(OTEL_TRACES_EXPORTER="console")
    assert seen["enabled"] is True and seen["application"] == "OpenTelemetryMiddleware"
    assert "opentelemetry.instrumentation.psycopg" in seen["imported"] and "opentelemetry.sdk.trace" in seen["imported"]
    assert seen["wrapped"] == ["psycopg.connect", "Connection.connect", "commit.CURSOR"]
    assert seen["lean_run_is_the_pool's"] is False  # the hop carries the request's context


@pytest.mark.parametrize(("environ", "exporters"), [
    ({}, []),
    ({"OTEL_SERVICE_NAME": "x"}, []),
    ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
    ({"OTEL_TRACES_EXPORTER": "otlp, console"}, ["otlp", "console"]),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, []),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, ["otlp"]),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x/v1/traces"}, ["otlp"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "TRUE"}, []),
])
def test_which_environment_turns_tracing_on(environ, exporters):
    assert tracing.wanted_exporters(environ) == exporters


def test_an_unknown_exporter_refuses_to_start():
    out = subprocess.run(
        [sys.executable, "-c", "import novelforge_sessions.asgi"], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
             "DJANGO_SETTINGS_MODULE": "novelforge_sessions.settings", "OTEL_TRACES_EXPORTER": "zipkin"},
    )
    assert out.returncode != 0 and "unsupported exporter(s) ['zipkin']" in out.stderr


@pytest.mark.django_db(transaction=True)
def test_a_loop_command_traces_each_pass_above_its_statements(receiver):
    from tests.support.servers import database_url

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
           "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "novelforge_sessions.settings",
           "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url,
           "OTEL_SERVICE_NAME": "nf-reconciler"}
    out = subprocess.run([sys.executable, "manage.py", "reconcile_runtimes"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "no expired runtime leases" in out.stdout, out.stderr
    # the spans were flushed before the process exited
    [span] = receiver.named("reconcile")
    assert span["service"] == "nf-reconciler" and span["parent"] == ""
    assert span["attributes"] == {"novelforge.runtimes_lost": 0}
    assert [c for c in receiver.children(span) if c["attributes"].get("db.system") == "postgresql"]


@pytest.mark.django_db(transaction=True)
def test_the_graph_put_and_writes_have_spans_above_their_statements(project, receiver):
    import httpx

    _, raw = create_token(project, name="graph", permissions=["read", "write"])
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url,
           "OTEL_SERVICE_NAME": "nf-graph", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    server = DaphneServer(server="uvicorn", extra_env=env)
    value = {"serde": "json", "data": "MQ=="}
    try:
        with httpx.Client(base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {raw}"}) as http:
            for cp in ("0001", "0002"):
                resp = http.post("/graph-threads/checkpoints", json={
                    "thread_id": "traced", "checkpoint_id": cp, "open": {"task_mode": "drafting"},
                    "checkpoint": {"v": 1, "id": cp, "channel_versions": {"step": 1}},
                    "blobs": [{"channel": "step", "version": 1, "value": value}]})
                assert resp.status_code == 201, resp.text
            resp = http.post("/graph-threads/writes", json={"thread_id": "traced", "checkpoint_id": "0002",
                                                            "task_id": "t", "writes": [{"idx": 0, "channel": "step", "value": value}]})
            assert resp.status_code == 200, resp.text
        wait_until(lambda: len(receiver.named("graph_put")) == 2 and receiver.named("graph_writes"),
                   "the graph spans exported", timeout=30)
    finally:
        server.stop()
    for name, route in (("graph_put", "POST /api/v1/graph-threads/checkpoints"),
                        ("graph_writes", "POST /api/v1/graph-threads/writes")):
        for span in receiver.named(name):
            parent = receiver.by_id(span["parent"])
            assert (parent["name"], parent["kind"]) == (route, SERVER_KIND)
            statements = [c for c in receiver.children(span) if c["attributes"].get("db.system") == "postgresql"]
            assert statements and all(c["kind"] == CLIENT_KIND for c in statements), receiver.children(span)
    assert sorted(s["attributes"]["novelforge.outcome"] for s in receiver.named("graph_put")) == ["created", "created"]
    [writes] = receiver.named("graph_writes")
    assert writes["attributes"] == {"novelforge.writes": 1, "novelforge.stored": 1}
    # the writes are one statement of their own: one statement writing them under the writes' span
    texts = [c["attributes"].get("db.statement", "") for c in receiver.children(writes)]
    assert len([t for t in texts if "INSERT INTO control_graphwrite" in t]) == 1, texts


@pytest.mark.django_db(transaction=True)
def test_each_webhook_attempt_is_a_span_under_the_senders_pass(project, receiver, settings):
    from tests.support.factories import SESSION, Api
    from tests.support.servers import database_url
    from tests.webhooks.conftest import register
    from tests.webhooks.receiver import Receiver as WebhookReceiver

    settings.WEBHOOK_ALLOW_PRIVATE = True  # the loopback receiver (docs/webhooks.md#private-addresses)
    _, raw = create_token(project, name="manager", permissions=["manage", "read", "write"])
    api = Api(raw)
    endpoint = WebhookReceiver().start()
    try:
        registered = register(api, endpoint.url, ["session.created"])
        endpoint.secrets.append(registered["secret"])
        assert api.post("/sessions", SESSION).status_code == 201
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
               "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "novelforge_sessions.settings",
               "WEBHOOK_ALLOW_PRIVATE": "true", "OTEL_TRACES_EXPORTER": "otlp",
               "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "nf-sender"}
        out = subprocess.run([sys.executable, "manage.py", "send_webhooks", "--once"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert len(endpoint.received) == 1 and endpoint.received[0].verified_by
    finally:
        endpoint.stop()
    [passed] = receiver.named("send_webhooks")
    [attempt] = receiver.named("webhook_attempt")
    assert (attempt["parent"], attempt["trace"]) == (passed["id"], passed["trace"])
    attrs = attempt["attributes"]
    assert attrs["novelforge.outcome"] == "delivered" and attrs["novelforge.status"] == 200
    assert attrs["novelforge.attempt"] == 1 and attrs["novelforge.webhook_id"] == endpoint.received[0].webhook_id
    assert registered["secret"].encode() not in b"".join(receiver.bodies)
