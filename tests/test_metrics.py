"""``/metrics`` (novelforge_sessions/metrics.py): what it exposes, exactly, and to whom.

The exposition is parsed with prometheus_client's own parser; the database gauges are checked
against rows this test made (exact numbers); the request histogram counts a request under its
route template. Access: a token, an allowed address, or a typed refusal that carries nothing.
Nothing here measures time.
"""
from __future__ import annotations

import hmac
import json
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from novelforge_sessions import lifecycles as lc
from novelforge_sessions import metrics
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.control.models import Handoff, WriteIntent
from novelforge_sessions.models import Event, RuntimeAttachment, Session
from reviews.models import ReviewGate
from tests.control.conftest import claim, make_artifact, make_handoff, ok, token_api
from tests.reviews.factories import make_world

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "metrics-test-token-0123456789"
MIDDLEWARE = "novelforge_sessions.metrics.observe_requests"


@pytest.fixture
def metrics_on(settings):
    """Metrics on, as METRICS_TOKEN=… would turn them on: the token, and the middleware first."""
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW_IPS = []
    settings.METRICS_ENABLED = True
    settings.MIDDLEWARE = [MIDDLEWARE, *settings.MIDDLEWARE]
    return settings


def scrape(client: Client | None = None) -> dict[str, list]:
    """The exposition, parsed: sample name → [(labels, value)]."""
    resp = (client or Client()).get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert resp.status_code == 200, resp.content
    assert resp["Content-Type"].startswith("text/plain; version=")  # the text exposition format
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(resp.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    found = [v for got, v in samples.get(f"novelforge_{name}", []) if all(got.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(f"novelforge_{name}"))
    return found[0]


def requests(samples: dict[str, list], **labels: str) -> float:
    """The request histogram's count for exactly these labels (0: no such series yet)."""
    found = [v for got, v in samples.get("novelforge_http_request_duration_seconds_count", []) if got == labels]
    return found[0] if found else 0


@pytest.mark.django_db
def test_the_gauges_carry_the_databases_numbers(metrics_on, owner, project, new_session):
    # Sessions: two with a run, one attached without one, one without a runtime.
    running = new_session(run=True)
    new_session(run=True)
    new_session(attach=True)
    new_session(attach=False)
    # Handoffs: two waiting (one pending, one claimed), one cancelled (not waiting).
    art = make_artifact(owner)
    inputs = [{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}]
    first = make_handoff(owner, running["run"]["id"], "job-1", inputs=inputs, timeout_seconds=60)
    make_handoff(owner, running["run"]["id"], "job-2", inputs=inputs, timeout_seconds=60)
    third = make_handoff(owner, running["run"]["id"], "job-3", inputs=inputs, timeout_seconds=60)
    ok(owner.post(f"/handoffs/{third['id']}/cancel", {"reason": "not needed"}))
    worker = token_api(project, "worker", ["read", "work"])
    assert claim(worker)["id"] == first["id"]
    Handoff.objects.filter(id=first["id"]).update(created_at=timezone.now() - timedelta(minutes=20))
    # A review gate pending for two hours; the world's writer is one more running session.
    world = make_world(project)
    gate = world.gate()
    ReviewGate.objects.filter(id=gate.id).update(created_at=timezone.now() - timedelta(hours=2))
    # One write intent proposed (awaiting approval).
    ok(owner.post("/write-intents", {
        "kind": "authority.settle", "idempotency_key": "settle-1",
        "params": {"artifacts": [{"artifact_id": art["id"], "fingerprint": art["current_fingerprint"]}], "note": "canon"},
        "before_fingerprint": ok(owner.get("/write-intents/before-state", kind="authority.settle"))["before_fingerprint"],
    }), 201)
    # Runtimes: one lease run out (recorded live, waiting for the reconciler).
    stale = RuntimeAttachment.objects.filter(session_id=running["id"]).get()
    RuntimeAttachment.objects.filter(id=stale.id).update(lease_expires_at=timezone.now() - timedelta(seconds=5))

    samples = scrape()

    by_status = {s.value: Session.objects.filter(status=s.value).count() for s in rt.SessionStatus}
    S = rt.SessionStatus
    # the handoffs hold the first session (awaiting_external), the gate the world's writer (awaiting_user)
    expected = {S.CREATED: 2, S.RUNNING: 1, S.AWAITING_EXTERNAL: 1, S.AWAITING_USER: 1}
    assert by_status == {s.value: expected.get(s, 0) for s in S}
    for status, count in by_status.items():
        assert value(samples, "sessions", status=status) == count
    assert sum(v for _, v in samples["novelforge_sessions"]) == Session.objects.count() == 5
    live = RuntimeAttachment.objects.live().count()
    assert value(samples, "runtimes", lease="expired") == 1
    assert value(samples, "runtimes", lease="live") == live == RuntimeAttachment.objects.filter(
        state=rt.RuntimeState.LIVE.value).count() - 1
    assert value(samples, "handoffs_waiting") == 2
    assert Handoff.objects.filter(state__in=[s.value for s in lc.HANDOFF_WAITING]).count() == 2
    assert 20 * 60 <= value(samples, "handoff_oldest_wait_seconds") < 20 * 60 + 120
    assert value(samples, "review_gates_pending") == 1
    assert 2 * 3600 <= value(samples, "review_gate_oldest_wait_seconds") < 2 * 3600 + 120
    assert value(samples, "write_intents_awaiting_approval") == 1
    assert WriteIntent.objects.get().state == lc.IntentState.PROPOSED.value
    assert value(samples, "event_log_head_id") == Event.objects.order_by("-id").values_list("id", flat=True)[0]
    assert value(samples, "database_up") == 1
    # This process: no socket follows anything; no pool in the test settings.
    assert value(samples, "websocket_subscribers") == 0 and value(samples, "live_feeds") == 0
    assert "novelforge_db_pool_connections" not in samples


@pytest.mark.django_db
def test_nothing_waiting_reads_zero(metrics_on):
    samples = scrape()
    for name in ("handoffs_waiting", "handoff_oldest_wait_seconds", "review_gates_pending",
                 "review_gate_oldest_wait_seconds", "write_intents_awaiting_approval", "event_log_head_id"):
        assert value(samples, name) == 0, name
    assert {labels["status"] for labels, _ in samples["novelforge_sessions"]} == {s.value for s in rt.SessionStatus}


@pytest.mark.django_db
def test_a_request_is_counted_under_its_route_template(metrics_on, owner, new_session):
    session = new_session()
    route = "/api/v1/sessions/<session_id>"  # the URL pattern django-ninja registers for GET /sessions/{session_id}
    key, missing = {"method": "GET", "route": route, "status": "200"}, {"method": "GET", "route": route, "status": "404"}
    before = scrape()
    count_before, missing_before = requests(before, **key), requests(before, **missing)
    assert ok(owner.get(f"/sessions/{session['id']}"))["id"] == session["id"]
    assert owner.get("/sessions/999999999").status_code == 404
    after = scrape()
    assert value(after, "http_request_duration_seconds_count", **key) == count_before + 1
    assert value(after, "http_request_duration_seconds_bucket", le="+Inf", **key) == count_before + 1
    assert requests(after, **missing) == missing_before + 1
    routes = {labels["route"] for labels, _ in after["novelforge_http_request_duration_seconds_count"]}
    # Never a raw path: no label carries an id.
    assert not any(str(session["id"]) in r or "999999999" in r for r in routes), routes
    assert "/metrics" in routes  # the scrape before this one


@pytest.mark.django_db
def test_unrouted_paths_and_odd_methods_keep_the_labels_bounded(metrics_on):
    client = Client()
    for i in range(3):
        assert client.get(f"/no-such-page/{i}/").status_code == 404
    assert client.generic("BREW", "/healthz").status_code == 200
    samples = scrape()
    routes = {labels["route"] for labels, _ in samples["novelforge_http_request_duration_seconds_count"]}
    assert not any("no-such-page" in r for r in routes), routes
    assert value(samples, "http_request_duration_seconds_count", method="GET", route="unmatched", status="404") >= 3
    assert value(samples, "http_request_duration_seconds_count", method="other", route="/healthz", status="200") >= 1


def _refused(resp, status: int, code: str) -> None:
    assert resp.status_code == status, resp.content
    body = json.loads(resp.content)
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code and body["error"]["details"] == {}
    assert b"novelforge_" not in resp.content and b"# TYPE" not in resp.content


@pytest.mark.django_db
def test_only_the_token_opens_the_metrics(metrics_on, monkeypatch):
    client = Client()
    events_before = Event.objects.count()
    resp = client.get("/metrics")
    _refused(resp, 401, "unauthorized")
    assert resp["WWW-Authenticate"] == 'Bearer realm="metrics"'
    _refused(client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong-token-0123456789"), 401, "unauthorized")
    _refused(client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}x"), 401, "unauthorized")
    _refused(client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}"), 401, "unauthorized")
    # The token is compared in constant time.
    compared = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append((a, b)) or real(a, b))
    resp = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert resp.status_code == 200 and b"novelforge_handoffs_waiting" in resp.content
    assert compared == [(TOKEN.encode(), TOKEN.encode())]
    assert Event.objects.count() == events_before  # reading metrics writes nothing


@pytest.mark.django_db
def test_an_allowed_address_needs_no_token_and_others_are_forbidden(settings):
    import ipaddress

    settings.METRICS_TOKEN = ""
    settings.METRICS_ENABLED = True
    settings.METRICS_ALLOW_IPS = [ipaddress.ip_network("10.0.0.0/8")]
    client = Client()  # REMOTE_ADDR 127.0.0.1
    _refused(client.get("/metrics"), 403, "forbidden")
    _refused(client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}"), 403, "forbidden")
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 200
    settings.METRICS_ALLOW_IPS = [ipaddress.ip_network("127.0.0.1/32")]
    resp = client.get("/metrics")
    assert resp.status_code == 200 and b"novelforge_sessions{" in resp.content


@pytest.mark.django_db
def test_off_by_default_metrics_are_not_found_and_nothing_is_observed(settings):
    assert settings.METRICS_ENABLED is False and settings.METRICS_TOKEN == ""  # the suite's environment sets neither
    assert MIDDLEWARE not in settings.MIDDLEWARE and MIDDLEWARE not in settings.API_MIDDLEWARE
    _refused(Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}"), 404, "not_found")


def _settings_error(**env: str) -> str:
    """Start-up with these variables: the ImproperlyConfigured message, or "" when it starts."""
    import os

    proc = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings;"
                               " print(settings.METRICS_ENABLED, settings.MIDDLEWARE[0], settings.API_MIDDLEWARE[0])"],
        cwd=ROOT, env={**os.environ, "DJANGO_SETTINGS_MODULE": "novelforge_sessions.settings", **env},
        capture_output=True, text=True, timeout=60,
    )
    return proc.stdout if proc.returncode == 0 else proc.stderr.strip().splitlines()[-1]


def test_the_settings_are_strict_and_turn_the_observer_on():
    assert _settings_error(METRICS_TOKEN=TOKEN).split() == ["True", MIDDLEWARE, MIDDLEWARE]
    assert _settings_error(METRICS_ALLOW_IPS="10.0.0.0/8, 127.0.0.1").split()[0] == "True"
    assert "METRICS_TOKEN must be at least 16" in _settings_error(METRICS_TOKEN="short")
    assert "METRICS_ALLOW_IPS must list IP addresses" in _settings_error(METRICS_ALLOW_IPS="10.0.0.0/8,nowhere")
    assert "PROMETHEUS_MULTIPROC_DIR must be an existing directory" in _settings_error(
        METRICS_TOKEN=TOKEN, PROMETHEUS_MULTIPROC_DIR="/nonexistent/nf-metrics")
    assert "LOG_FORMAT must be plain or json" in _settings_error(LOG_FORMAT="xml")


def test_every_metric_is_documented():
    """docs/observability.md lists every metric this module exposes."""
    doc = (ROOT / "docs" / "observability.md").read_text()
    source = (ROOT / "novelforge_sessions" / "metrics.py").read_text()
    import re

    names = set(re.findall(r'_gauge\(\s*"(\w+)"', source)) | {"http_request_duration_seconds"}
    names |= {n for _, n, _ in (("", "db_pool_connections", ""), ("", "db_pool_idle_connections", ""),
                                ("", "db_pool_max_connections", ""), ("", "db_pool_requests_waiting", ""))}
    missing = sorted(n for n in names if f"novelforge_{n}" not in doc)
    assert not missing, missing
    assert metrics.PREFIX == "novelforge"


ALERTS = ROOT / "deploy" / "prometheus-alerts.yml"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) is not installed")
def test_promtool_accepts_the_alert_rules():
    proc = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 2 rules found" in proc.stdout, proc.stdout


@pytest.mark.django_db
def test_the_alert_rules_read_metrics_the_service_exposes(metrics_on):
    import re

    import yaml

    rules = [r for group in yaml.safe_load(ALERTS.read_text())["groups"] for r in group["rules"]]
    assert {r["alert"] for r in rules} == {"NovelForgeHandoffWaiting", "NovelForgeReviewGateWaiting"}
    exposed = set(scrape())
    for rule in rules:
        names = set(re.findall(r"novelforge_\w+", rule["expr"]))
        assert names and names <= exposed, (rule["alert"], names - exposed)
    thresholds = {r["alert"]: r["expr"].split(">")[1].strip() for r in rules}
    assert thresholds == {"NovelForgeHandoffWaiting": "15 * 60", "NovelForgeReviewGateWaiting": "60 * 60"}


def test_serve_cluster_clears_only_prometheus_client_files_before_anything_starts():
    """``make serve-cluster`` with PROMETHEUS_MULTIPROC_DIR: the files of an earlier run go (their
    counts would be added to this run's), before any process of this run loads the settings."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in {"MAKELEVEL", "MAKEFLAGS", "MFLAGS"}}
    text = subprocess.run(["make", "--no-print-directory", "-n", "serve-cluster"], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True).stdout
    clear = 'rm -f "$PROMETHEUS_MULTIPROC_DIR"/{counter,gauge,histogram,summary}_*.db'
    assert clear in text and 'mkdir -p "$PROMETHEUS_MULTIPROC_DIR"' in text
    assert text.index(clear) < text.index("migrate --noinput") < text.index("novelforge_sessions.serve")
