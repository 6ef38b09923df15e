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


def test_every_operation_that_reads_a_body_declares_413_and_the_body_limit(schema):
    """The body limit (``bodylimit``: every ``/api/`` body) was declared nowhere and
    21 operations did not declare the 413 they answer. Every operation with a body declares it, in
    one place, and states the limit, from the setting, on the body and in the API's description."""
    from django.conf import settings

    from novelforge_sessions.apikit.schemas import X_MAX_BODY_BYTES

    limit = settings.API_MAX_BODY_BYTES
    body_ops = 0
    for path, item in schema["paths"].items():
        for method, op in item.items():
            declared = "413" in op["responses"]
            assert declared == ("requestBody" in op), (method, path)
            if declared:
                body_ops += 1
                assert op["requestBody"][X_MAX_BODY_BYTES] == limit, (method, path)
                assert op["responses"]["413"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorOut")
                assert str(limit) in op["responses"]["413"]["description"], (method, path)
    assert body_ops >= 30
    assert f"at most {limit} bytes" in schema["info"]["description"]


def test_the_declared_body_limit_follows_the_setting(settings):
    from novelforge_sessions.routers import api
    from novelforge_sessions.apikit.schemas import X_MAX_BODY_BYTES

    settings.API_MAX_BODY_BYTES = 4096
    served = api.get_openapi_schema()
    assert served["paths"]["/api/v1/sessions"]["post"]["requestBody"][X_MAX_BODY_BYTES] == 4096
    assert "at most 4096 bytes" in served["info"]["description"]


def test_every_text_query_parameter_declares_that_it_refuses_nul(schema, owner):
    """U+0000 in any query string is refused (the API's query parser), so every
    text query parameter declares a pattern that says so; a declared-invalid value is refused."""
    import re

    texts = []
    for path, item in schema["paths"].items():
        for method, op in item.items():
            for param in op.get("parameters", []):
                options = param["schema"].get("anyOf", [param["schema"]])
                for option in options:
                    text = option.get("items", option) if option.get("type") == "array" else option
                    if text.get("type") == "string" and "enum" not in text:
                        assert "pattern" in text, (method, path, param["name"])
                        assert not re.search(text["pattern"], "a\x00b"), (method, path, param["name"])
                        texts.append((method, path, param["name"]))
    assert len(texts) >= 10
    for method, path, name in texts:
        if method == "get" and "{" not in path:
            resp = owner.get(path.removeprefix("/api/v1"), **{name: "a\x00b"})
            assert resp.status_code == 422, (path, name, resp.content)
            assert resp.json()["error"]["code"] == "validation_error"


def test_every_list_says_what_its_after_cursor_promises(schema):
    """Lists page on ``id > after``; a row that commits out of id
    order can be skipped by a reader following new rows. Every list's ``after`` says so and points to
    the event log, which is gap-free (and says that); the transcript pages by its gap-free ``seq``."""
    from novelforge_sessions.api.schemas import EVENTS_AFTER_DOC, TRANSCRIPT_AFTER_DOC
    from novelforge_sessions.apikit.schemas import AFTER_DOC

    own = {"/api/v1/events": EVENTS_AFTER_DOC, "/api/v1/sessions/{session_id}/transcript": TRANSCRIPT_AFTER_DOC}
    lists = 0
    for path, item in schema["paths"].items():
        for method, op in item.items():
            for param in op.get("parameters", []):
                if param["name"] == "after" and param["in"] == "query":
                    lists += 1
                    assert param["description"] == own.get(path, AFTER_DOC), path
    assert lists >= 12
    assert "GET /events?after=" in AFTER_DOC and "skipped" in AFTER_DOC
    assert "Gap-free" in EVENTS_AFTER_DOC



def test_no_two_schema_classes_share_a_name():
    """The OpenAPI document names a component by its class name alone: two schema classes of the
    same name in different modules would become one component, and one of the two routes would
    document (and the generated client would parse) the other's body."""
    import ast
    from collections import defaultdict
    from pathlib import Path

    from novelforge_sessions.routers import api

    root = Path(__file__).resolve().parents[2]
    modules = [*root.glob("novelforge_sessions/api/*.py"), *root.glob("novelforge_sessions/apikit/*.py"),
               root / "reviews" / "api.py"]
    where: dict[str, list[str]] = defaultdict(list)
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(str(path.relative_to(root)))
    components = api.get_openapi_schema()["components"]["schemas"]
    assert len(components) > 50
    shared = {name: places for name, places in where.items() if len(places) > 1 and name in components}
    assert not shared, shared
