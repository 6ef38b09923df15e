"""Every control-plane endpoint is in the OpenAPI schema with the error statuses it can return."""
from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

# (method, path) → error statuses it must declare (401/422 are on every route)
ENDPOINTS = {
    ("post", "/api/v1/runs/{run_id}/handoffs"): {401, 403, 404, 409, 413, 422},
    ("get", "/api/v1/handoffs"): {401, 403, 422},
    ("post", "/api/v1/handoffs/claim"): {401, 403, 404, 409, 422},
    ("get", "/api/v1/handoffs/{handoff_id}"): {401, 403, 404, 422},
    ("post", "/api/v1/handoffs/{handoff_id}/heartbeat"): {401, 403, 404, 409, 422},
    ("post", "/api/v1/handoffs/{handoff_id}/results"): {401, 403, 404, 409, 413, 422},
    ("get", "/api/v1/handoffs/{handoff_id}/deliveries"): {401, 403, 404, 422},
    ("post", "/api/v1/handoffs/{handoff_id}/cancel"): {401, 403, 404, 409, 422},
    ("post", "/api/v1/handoffs/{handoff_id}/resolve-conflict"): {401, 403, 404, 409, 422},
    ("get", "/api/v1/receipts"): {401, 403, 422},
    ("get", "/api/v1/write-intents/before-state"): {401, 403, 404, 422},
    ("post", "/api/v1/write-intents"): {401, 403, 404, 409, 413, 422},
    ("get", "/api/v1/write-intents"): {401, 403, 422},
    ("get", "/api/v1/write-intents/{intent_id}"): {401, 403, 404, 422},
    ("post", "/api/v1/write-intents/{intent_id}/approve"): {401, 403, 404, 409, 422},
    ("post", "/api/v1/write-intents/{intent_id}/reject"): {401, 403, 404, 409, 422},
    ("post", "/api/v1/write-intents/{intent_id}/revoke-approval"): {401, 403, 404, 409, 422},
    ("post", "/api/v1/write-intents/{intent_id}/execute"): {401, 403, 404, 409, 422, 500},
    ("get", "/api/v1/authority/changes"): {401, 403, 422},
    ("get", "/api/v1/bindings/invalidated"): {401, 403, 422},
    ("post", "/api/v1/bindings/mark-stale"): {401, 403, 422},
    ("get", "/api/v1/routing/runtimes"): {401, 403, 422},
    ("post", "/api/v1/sessions/{session_id}/resume"): {401, 403, 404, 409, 422},
}


@pytest.fixture(scope="module")
def schema() -> dict:
    return Client().get("/api/openapi.json").json()


@pytest.mark.parametrize(("method", "path"), sorted(ENDPOINTS))
def test_endpoint_is_documented_with_its_errors(schema, method, path):
    op = schema["paths"][path][method]
    declared = {int(code) for code in op["responses"]}
    errors = ENDPOINTS[(method, path)]
    assert errors <= declared, f"{method} {path} lacks {sorted(errors - declared)}"
    for code in errors:
        ref = op["responses"][str(code)]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/ErrorOut")
    assert op.get("summary"), "every route says what it does"
    assert op.get("security"), "every route needs a bearer token"


def test_no_undocumented_control_routes(schema):
    prefixes = ("/api/v1/handoffs", "/api/v1/write-intents", "/api/v1/bindings", "/api/v1/routing", "/api/v1/receipts",
                "/api/v1/authority")
    found = {(m, p) for p, ops in schema["paths"].items() if p.startswith(prefixes) for m in ops}
    assert found == {k for k in ENDPOINTS if k[1].startswith(prefixes)}
