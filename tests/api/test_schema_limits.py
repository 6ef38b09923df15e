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


def test_enforced_limits_are_declared_from_their_constants(schema):
    """Audit finding 11: each limit below is enforced by the core (tests/control/test_declared_limits.py,
    tests/reviews/test_declared_limits.py); the schema states it from the same constant."""
    from django.conf import settings

    from novelforge_sessions.actions.lifecycle import BIGINT_MAX
    from novelforge_sessions.control import bindings
    from reviews import actions as review_actions

    props = lambda name: component(schema, name)["properties"]  # noqa: E731
    assert props("MarkStaleIn")["session_ids"]["maxItems"] == bindings.MAX_MARK_STALE
    assert props("HandoffIn")["inputs"]["maxItems"] == handoffs.MAX_INPUTS
    for name, field in (("HandoffIn", "required_capabilities"), ("ClaimIn", "capabilities"), ("RuntimeIn", "capabilities")):
        assert props(name)[field]["maxItems"] == rt.MAX_CAPABILITIES, name
    route = schema["paths"]["/api/v1/routing/runtimes"]["get"]["parameters"][0]["schema"]
    assert route["maxItems"] == rt.MAX_CAPABILITIES
    assert props("TranscriptIn")["content"]["maxLength"] == settings.TRANSCRIPT_ENTRY_MAX_BYTES
    assert props("ArtifactRefIn")["fingerprint"]["pattern"] == rt.FINGERPRINT_PATTERN
    assert props("CheckpointIn")["resume_policy"]["pattern"] == rt.NAME_PATTERN
    assert props("ResultIn")["result_hash"]["pattern"] == rt.FINGERPRINT_PATTERN
    assert props("CriterionIn")["anchors"]["additionalProperties"]["maxLength"] == packets.MAX_ANCHOR
    assert props("CriterionIn")["label"]["maxLength"] == packets.MAX_LABEL
    assert props("GateIn")["reviewers"]["maxItems"] == review_actions.MAX_REVIEWERS
    assert props("GateIn")["evidence"]["maxItems"] == packets.MAX_EVIDENCE_ITEMS
    assert props("CalibrationIn")["answer_key"]["maxLength"] == review_actions.MAX_ANSWER_KEY
    verdict = schema["paths"]["/api/v1/review-packets/{packet_id}/verdicts"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]
    assert verdict["fencing_token"]["maximum"] == BIGINT_MAX
    assert verdict["findings"]["maxItems"] == packets.MAX_FINDINGS
    item = verdict["findings"]["items"]["properties"]
    assert (item["note"]["maxLength"], item["location"]["maxLength"]) == (packets.MAX_NOTE, packets.MAX_LOCATION)
