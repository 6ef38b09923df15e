"""A Host outside ALLOWED_HOSTS is refused on every path, in one log line, before anything runs;
the probes answer whatever the Host (``novelforge_sessions/server/hosts.py``, ``health.py``).

The lean /api/v1/ path is driven through the served ASGI application (``asgi.application``) and
through daphne; pages and the API through Django's handler with the test client."""
from __future__ import annotations

import json
import logging

import httpx
import pytest
from django.test import Client

from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.models import Session

from tests.api.test_body_limit import Client as AsgiClient
from tests.api.test_body_limit import run
from tests.support.factories import SESSION
from tests.support.servers import DaphneServer

SECURITY_LOGGER = "django.security.DisallowedHost"


def api_scope(host: bytes, token: str) -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/api/v1/sessions", "raw_path": b"/api/v1/sessions", "root_path": "", "query_string": b"",
        "headers": [(b"host", host), (b"content-type", b"application/json"),
                    (b"authorization", f"Bearer {token}".encode())],
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80),
    }


def refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == SECURITY_LOGGER]


def assert_typed_refusal(status: int, body: bytes) -> None:
    assert status == 400
    error = json.loads(body)["error"]
    assert error["code"] == "disallowed_host" and set(error) == {"code", "message", "details"}


@pytest.mark.django_db(transaction=True)
def test_the_lean_path_refuses_a_foreign_host_before_anything_runs(project, caplog):
    from novelforge_sessions.asgi import application
    from django.conf import settings

    assert settings.API_LEAN
    _, token = create_token(project, name="hosts", permissions=ALL_PERMISSIONS)
    body = json.dumps(SESSION).encode()
    refused = AsgiClient([body])
    with caplog.at_level(logging.INFO):
        run(application, api_scope(b"evil.example", token), refused)
    assert_typed_refusal(refused.status, refused.body)
    assert Session.objects.count() == 0  # nothing ran: no session written
    [record] = refusals(caplog)
    assert record.levelno == logging.ERROR and record.exc_info is None and "\n" not in record.getMessage()
    assert "'evil.example'" in record.getMessage()
    # The same request with an allowed Host is served (the refusal is the Host's, nothing else).
    served = AsgiClient([body])
    run(application, api_scope(b"testserver", token), served)
    assert served.status == 201, served.body
    assert Session.objects.count() == 1


@pytest.mark.django_db
def test_a_page_refuses_a_foreign_host_in_one_line(caplog):
    with caplog.at_level(logging.INFO):
        response = Client(HTTP_HOST="evil.example").get("/login/")
    assert response.status_code == 400
    [record] = refusals(caplog)
    assert record.exc_info is None and record.exc_text is None  # OneLine dropped Django's traceback
    assert "evil.example" in record.getMessage() and "\n" not in record.getMessage()


@pytest.mark.django_db
def test_the_api_through_djangos_handler_answers_the_typed_refusal(caplog, owner):
    # The test client goes through Django's handler with the full MIDDLEWARE (as API_LEAN=false).
    with caplog.at_level(logging.INFO):
        response = Client(HTTP_HOST="evil.example").post("/api/v1/sessions", data=SESSION,
                                                         content_type="application/json")
    assert_typed_refusal(response.status_code, response.content)
    assert Session.objects.count() == 0
    assert [r.exc_info for r in refusals(caplog)] == [None]


@pytest.mark.django_db
def test_probes_answer_whatever_the_host_and_pages_still_refuse_it():
    by_ip = Client(HTTP_HOST="10.0.3.7:8000")
    assert by_ip.get("/healthz").json() == {"status": "ok"}
    ready = by_ip.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ok", "database": "ok"}
    assert ready["X-Content-Type-Options"] == "nosniff"  # SecurityMiddleware, above the probes, still ran
    assert by_ip.get("/login/").status_code == 400
    assert by_ip.get("/healthz/extra").status_code == 400  # only the exact probe paths


@pytest.mark.django_db(transaction=True)
def test_through_daphne_a_foreign_host_is_refused_and_a_probe_by_ip_answered(project):
    _, token = create_token(project, name="daphne-hosts", permissions=ALL_PERMISSIONS)
    server = DaphneServer()  # ALLOWED_HOSTS=127.0.0.1,localhost
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            refused = client.post("/api/v1/sessions", json=SESSION,
                                  headers={"Host": "evil.example", "Authorization": f"Bearer {token}"})
            probe = client.get("/readyz", headers={"Host": "10.0.3.7"})
            page = client.get("/login/", headers={"Host": "10.0.3.7"})
    finally:
        server.stop()
    assert_typed_refusal(refused.status_code, refused.content)
    assert probe.status_code == 200 and page.status_code == 400
    assert Session.objects.count() == 0
    log = server.log_path.read_text()
    assert log.count("Invalid HTTP_HOST header") == 2 and "Traceback" not in log
