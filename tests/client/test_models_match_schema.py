"""The client's models cannot drift from the API: they are generated from the served OpenAPI
schema (scripts/gen_client_models.py), the committed file must equal a fresh generation, and
each model's fields and required-ness must equal its schema component's."""
from __future__ import annotations

from typing import Any

import importlib.util
import json
from pathlib import Path

import pytest
from django.test import Client as DjangoClient
from pydantic import BaseModel

from novelforge_client import models

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def served() -> dict:
    response = DjangoClient().get("/api/openapi.json")
    assert response.status_code == 200
    return response.json()


def _generator():
    spec = importlib.util.spec_from_file_location("gen_client_models", ROOT / "scripts" / "gen_client_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_component_is_a_model_with_the_same_fields_and_required_ness(served):
    components = served["components"]["schemas"]
    for name, comp in components.items():
        model = getattr(models, name, None)
        if "properties" not in comp and comp.get("type") != "object":  # a named JSON value (StorableJson)
            assert model is Any, f"{name} names a JSON value: the client takes any JSON there"
            continue
        assert isinstance(model, type) and issubclass(model, BaseModel), f"no client model for {name}"
        fields = {f.alias or attr: f for attr, f in model.model_fields.items()}
        assert set(fields) == set(comp.get("properties", {})), name
        required = {n for n, f in fields.items() if f.is_required()}
        assert required == set(comp.get("required", [])), name


def test_every_operation_body_and_answer_has_its_model(served):
    for path, item in served["paths"].items():
        for method, op in item.items():
            schemas = [r.get("content", {}).get("application/json", {}).get("schema", {})
                       for status, r in op["responses"].items() if str(status).startswith("2")]
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            for schema in [*schemas, body]:
                for ref in json.dumps(schema or {}).split('"$ref": "')[1:]:
                    assert hasattr(models, ref.split('"')[0].rsplit("/", 1)[-1]), (method, path)


def test_the_committed_file_is_a_fresh_generation(served):
    assert _generator().render(served) == (ROOT / "novelforge_client" / "models.py").read_text(), (
        "novelforge_client/models.py is stale: run .venv/bin/python scripts/gen_client_models.py"
    )


def test_a_drift_would_be_caught(served):
    changed = json.loads(json.dumps(served))
    changed["components"]["schemas"]["HeartbeatOut"]["required"].remove("abort_requested")
    assert _generator().render(changed) != (ROOT / "novelforge_client" / "models.py").read_text()
