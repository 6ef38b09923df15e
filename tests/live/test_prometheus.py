"""A real Prometheus scrapes ``/metrics`` of two production server processes.

Two ``python -m novelforge_sessions.serve`` processes (as ``make serve-cluster`` runs them), each
its own scrape target; Prometheus (the Debian package's binary) is started with a temporary
``prometheus.yml`` (1 s scrape interval, the bearer token, ``deploy/prometheus-alerts.yml`` as its
rules) and its own storage directory, on a free port. Its query API must then answer the
handoffs-waiting gauge from both targets and the request histogram of a route the test called,
under its route template. Every wait polls against a deadline.

Also here: the multi-process mode (``PROMETHEUS_MULTIPROC_DIR`` shared by two processes: each
answers the requests of both) and ``LOG_FORMAT=json`` in a real server's log.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from tests.support.factories import make_project
from tests.live import ROOT, DaphneServer, free_port
from tests.live.conftest import Socket

TOKEN = "prometheus-live-token-0123456789"
DEADLINE = 90.0
PROMETHEUS = shutil.which("prometheus")


def _call(url: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        **({"Content-Type": "application/json"} if data is not None else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=15) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _api(server: DaphneServer, raw: str, method: str, path: str, body: Any = None) -> dict:
    status, content = _call(f"{server.url}/api/v1{path}", method, body, {"Authorization": f"Bearer {raw}"})
    assert status in (200, 201), (status, content)
    return json.loads(content)


def _waiting_handoff(server: DaphneServer, slug: str) -> tuple[str, dict]:
    """A project with one handoff waiting, made through ``server``'s API: (token, handoff)."""
    project = make_project(slug)
    _, raw = create_token(project, name="agent", permissions=ALL_PERMISSIONS)
    session = _api(server, raw, "POST", "/sessions", {
        "role": "writer", "memory_policy": "bounded", "task_mode": "drafting", "runtime_family": "claude-code",
        "runtime": {"runtime_family": "claude-code", "capabilities": ["draft"], "lease_seconds": 600},
    })
    run = _api(server, raw, "POST", f"/sessions/{session['id']}/runs", {"cursor": {"step": "start"}})
    art = _api(server, raw, "POST", "/artifacts", {"name": "chapter-1", "content": "It was a dark night."})
    handoff = _api(server, raw, "POST", f"/runs/{run['id']}/handoffs", {
        "logical_id": "job-1", "inputs": [{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}],
        "timeout_seconds": 60,
    })
    return raw, handoff


def _scrape(server: DaphneServer) -> dict[str, list]:
    status, content = _call(f"{server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, content
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


class Prometheus:
    """The Debian package's ``prometheus`` on a free loopback port, scraping ``targets``."""

    def __init__(self, tmp: Path, targets: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ROOT / "deploy" / "prometheus-alerts.yml")],
            "scrape_configs": [{
                "job_name": "novelforge",
                "authorization": {"type": "Bearer", "credentials": TOKEN},
                "static_configs": [{"targets": targets}],
            }],
        }))
        self.log_path = ROOT / "tests" / "artifacts" / f"prometheus-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            cwd=tmp, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def query(self, expr: str) -> list[dict]:
        """The instant query's result vector ([] while Prometheus is not up yet)."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited; see {self.log_path}")
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            status, content = _call(url)
        except OSError:
            return []
        if status != 200:
            return []
        body = json.loads(content)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def until(self, expr: str, accept, what: str) -> list[dict]:
        deadline = time.monotonic() + DEADLINE
        result: list[dict] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if accept(result):
                return result
            time.sleep(0.2)  # polling Prometheus' API against the deadline
        raise AssertionError(f"{what}: {expr} answered {result} (see {self.log_path})")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
        self._log.close()


@pytest.fixture
def two_servers():
    servers: list[DaphneServer] = []
    try:
        for _ in range(2):
            servers.append(DaphneServer(server="uvicorn", extra_env={"METRICS_TOKEN": TOKEN, "LIVE_SWEEP_SECONDS": "3600"}))
        yield servers
    finally:
        for srv in servers:
            srv.stop()


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus (Debian package prometheus) is not installed")
@pytest.mark.django_db(transaction=True)
def test_prometheus_scrapes_two_processes(two_servers, tmp_path):
    first, second = two_servers
    raw, handoff = _waiting_handoff(first, "scraped")
    assert handoff["state"] == "pending"
    instances = {f"127.0.0.1:{srv.port}" for srv in two_servers}
    prom = Prometheus(tmp_path, sorted(instances))
    try:
        up = prom.until("up", lambda r: {s["metric"]["instance"] for s in r if s["value"][1] == "1"} == instances,
                        "both targets scraped")
        assert {s["metric"]["job"] for s in up} == {"novelforge"}
        # The gauge is read from the database by each process: both targets answer 1.
        waiting = prom.until("novelforge_handoffs_waiting",
                             lambda r: {s["metric"]["instance"] for s in r if s["value"][1] == "1"} == instances,
                             "handoffs waiting from both targets")
        assert len(waiting) == 2
        # The request histogram: the handoff was created through the first process's lean API path.
        route = "/api/v1/runs/<run_id>/handoffs"
        expr = f'novelforge_http_request_duration_seconds_count{{route="{route}",method="POST",status="201"}}'
        series = prom.until(expr, lambda r: len(r) == 1 and float(r[0]["value"][1]) == 1, "the handoff POST's series")
        assert series[0]["metric"]["instance"] == f"127.0.0.1:{first.port}"
        buckets = prom.query(expr.replace("_count{", '_bucket{le="+Inf",'))
        assert [b["value"][1] for b in buckets] == ["1"]
        # The alert rules loaded, and read what the targets expose (nothing firing: a fresh handoff).
        status, content = _call(f"{prom.url}/api/v1/rules")
        rules = [r for g in json.loads(content)["data"]["groups"] for r in g["rules"]]
        assert {r["name"] for r in rules} == {"NovelForgeHandoffWaiting", "NovelForgeReviewGateWaiting"}
        assert all(r["health"] in ("ok", "unknown") and r["state"] == "inactive" for r in rules), rules
    finally:
        prom.stop()
    assert prom.proc.returncode is not None


@pytest.mark.django_db(transaction=True)
def test_a_shared_multiprocess_directory_answers_every_processs_requests(tmp_path):
    shared = tmp_path / "prometheus-multiproc"
    shared.mkdir()
    env = {"METRICS_TOKEN": TOKEN, "PROMETHEUS_MULTIPROC_DIR": str(shared), "LIVE_SWEEP_SECONDS": "3600"}
    servers = [DaphneServer(server="uvicorn", extra_env=env)]
    try:
        servers.append(DaphneServer(server="uvicorn", extra_env=env))
        first, second = servers
        key = {"method": "GET", "route": "/healthz", "status": "200"}

        def healthz(samples: dict[str, list]) -> float:
            return sum(v for labels, v in samples["novelforge_http_request_duration_seconds_count"] if labels == key)

        before = healthz(_scrape(second))
        assert before >= 2  # each process's readiness probe at start-up
        for _ in range(3):
            assert _call(f"{first.url}/healthz")[0] == 200
        # The second process answers the first one's requests, and both answer the same.
        assert healthz(_scrape(second)) == before + 3
        assert healthz(_scrape(first)) == before + 3
        assert len(list(shared.glob("histogram_*.db"))) == 2  # one file per process

        # What a process holds is its own: a socket following a project on the first process.
        project = make_project("followed")
        _, raw = create_token(project, name="watcher", permissions=["read"])
        sock = Socket(first, token=raw, batch=True)
        try:
            sock.subscribe(project_id=project.id)
            here, there = _scrape(first), _scrape(second)
            assert here["novelforge_websocket_subscribers"] == [({}, 1.0)]
            assert here["novelforge_live_feeds"] == [({}, 1.0)]
            assert here["novelforge_live_feed_lag_events"] == [({}, 0.0)]
            assert there["novelforge_websocket_subscribers"] == [({}, 0.0)]
            assert there["novelforge_live_feeds"] == [({}, 0.0)]
        finally:
            sock.close()
        # psycopg's pool (the launcher serves with DB_POOL_MAX_SIZE=8, as make run does).
        assert here["novelforge_db_pool_max_connections"] == [({}, 8.0)]
        assert 1 <= here["novelforge_db_pool_connections"][0][1] <= 8
        assert here["novelforge_db_pool_requests_waiting"] == [({}, 0.0)]
    finally:
        for srv in servers:
            srv.stop()
