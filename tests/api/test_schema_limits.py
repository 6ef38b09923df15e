"""The OpenAPI schema declares the limits the validators enforce (issue 9, finding 9), from the
same constants, so the two cannot drift: clients generated from the schema send what the core
accepts. The fuzz (tests/api/test_fuzz.py) runs every schemathesis check against it."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.control import handoffs, intents
from reviews import packets


@pytest.fixture(scope="module")
def schema() -> dict:
    return Client().get("/api/openapi.json").json()


def component(schema: dict, name: str) -> dict:
    return schema["components"]["schemas"][name]


def test_short_names_carry_the_core_pattern(schema):
    assert component(schema, "SessionIn")["properties"]["task_mode"]["pattern"] == rt._NAME_RE.pattern
    runtime = component(schema, "RuntimeIn")["properties"]
    assert runtime["runtime_family"]["pattern"] == rt._NAME_RE.pattern
    assert runtime["capabilities"]["items"]["pattern"] == rt._NAME_RE.pattern
    route = schema["paths"]["/api/v1/routing/runtimes"]["get"]["parameters"][0]["schema"]
    assert route["items"]["pattern"] == rt._NAME_RE.pattern


def test_keys_ids_and_fingerprints_carry_their_patterns(schema):
    intent = component(schema, "WriteIntentIn")["properties"]
    assert intent["idempotency_key"]["pattern"] == intents.KEY_RE.pattern
    assert intent["before_fingerprint"]["pattern"] == rt.FINGERPRINT_PATTERN
    assert component(schema, "HandoffIn")["properties"]["logical_id"]["pattern"] == handoffs.LOGICAL_ID_RE.pattern
    assert component(schema, "CriterionIn")["properties"]["key"]["pattern"] == packets._KEY_RE.pattern
    assert component(schema, "RubricIn")["properties"]["criteria"]["maxItems"] == packets.MAX_CRITERIA


def test_cross_field_rules_are_declared(schema):
    session = component(schema, "SessionIn")
    assert session["if"]["properties"]["role"] == {"const": rt.SessionRole.OTHER.value}
    assert "role_extension" in session["then"]["required"]
    rules = {r["if"]["properties"]["outcome"]["const"]: set(r["then"]["properties"]["session_status"]["enum"])
             for r in component(schema, "RunEndIn")["allOf"]}
    assert rules == {o.value: {default.value, *(s.value for s in allowed), None}
                     for o, (default, allowed) in lc.RUN_OUTCOMES.items()}
    by_kind = {r["if"]["properties"]["kind"]["const"]: r["then"] for r in component(schema, "WriteIntentIn")["allOf"]}
    assert set(by_kind) == {"artifact.make_current", "authority.settle", "framework.change"}
    assert "artifact_id" in by_kind["artifact.make_current"]["required"]
    framework = by_kind["framework.change"]["properties"]["params"]["properties"]["framework_version"]
    assert framework["pattern"] == intents.FRAMEWORK_RE.pattern


def test_free_json_is_storable_all_the_way_down(schema):
    cursor = component(schema, "CursorIn")["properties"]["cursor"]
    assert cursor["minProperties"] == 1
    assert cursor["additionalProperties"] == {"$ref": "#/components/schemas/StorableJson"}
    storable = component(schema, "StorableJson")
    text = next(o for o in storable["anyOf"] if o.get("type") == "string")
    assert re.fullmatch(text["pattern"], "fine") and not re.fullmatch(text["pattern"], "a\x00b")
    assert component(schema, "ReasonIn")["properties"]["reason"]["pattern"] == text["pattern"]
