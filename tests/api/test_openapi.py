"""The OpenAPI schema tells the truth: every route is documented with its error statuses."""
from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.fixture
def schema():
    resp = Client().get("/api/openapi.json")
    assert resp.status_code == 200
    return resp.json()


def test_docs_page_is_served():
    resp = Client().get("/api/docs")
    assert resp.status_code == 200 and b"openapi.json" in resp.content


def test_every_operation_declares_auth_and_error_statuses(schema):
    ops = [(path, method, op) for path, item in schema["paths"].items() for method, op in item.items()]
    assert len(ops) >= 25
    for path, method, op in ops:
        codes = set(op["responses"])
        assert {"401", "422"} <= codes, (method, path, codes)
        assert any(c.startswith("2") for c in codes), (method, path)
        for code in codes - {"200", "201", "204"}:
            ref = op["responses"][code]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ErrorOut"), (method, path, code)
        if "{" in path:
            assert "404" in codes, (method, path)
        if method in {"post", "delete"}:
            assert "403" in codes, (method, path)
        assert op.get("security"), (method, path)


def test_core_routes_exist(schema):
    paths = schema["paths"]
    for path in ["/api/v1/sessions", "/api/v1/sessions/{session_id}/resume", "/api/v1/runs/{run_id}/checkpoints",
                 "/api/v1/runtimes/{runtime_id}/heartbeat", "/api/v1/events"]:
        assert path in paths, path


def test_every_operation_that_reads_a_body_declares_400(schema):
    """An unparseable body is `400 malformed_body`, so every operation with a body declares 400."""
    for path, item in schema["paths"].items():
        for method, op in item.items():
            declared = "400" in op["responses"]
            assert declared == ("requestBody" in op), (method, path)
            if declared:
                ref = op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorOut"), (method, path)
