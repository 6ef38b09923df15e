"""The OpenAPI schema declares the limits the validators enforce, from the
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
    """Each limit below is enforced by the core (tests/control/test_declared_limits.py,
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


def test_byte_bounds_are_declared_from_their_constants_and_in_words(schema):
    """Byte caps the core enforces (``rt.json_size``: UTF-8 bytes of compact JSON;
    a string's own bytes) were declared nowhere. Each is an ``x-max-bytes`` from the validator's
    constant, stated in its description too; every bound the schema declares is listed here, and
    each is enforced as declared (tests/control/test_declared_limits.py, tests/reviews/…)."""
    from django.conf import settings

    from novelforge_sessions.apikit.schemas import bytes_doc
    from novelforge_sessions.control import graphs, results
    from tests.api.declared import byte_bounds

    expected = {
        "SessionIn.provider_metadata": rt.MAX_METADATA_BYTES,
        "RuntimeIn.provider_metadata": rt.MAX_METADATA_BYTES,
        "AttachIn.provider_metadata": rt.MAX_METADATA_BYTES,
        "RunIn.cursor": rt.MAX_CURSOR_BYTES,
        "RunIn.frozen_inputs": rt.MAX_FROZEN_INPUTS_BYTES,
        "CursorIn.cursor": rt.MAX_CURSOR_BYTES,
        "BatchCursorItem.cursor": rt.MAX_CURSOR_BYTES,
        "CheckpointIn": settings.CHECKPOINT_MAX_BYTES,
        "BatchCheckpointIn": settings.CHECKPOINT_MAX_BYTES,
        "TranscriptIn.content": settings.TRANSCRIPT_ENTRY_MAX_BYTES,
        "HandoffIn.params": handoffs.MAX_PARAMS_BYTES,
        "HandoffIn.result_schema": handoffs.MAX_RESULT_SCHEMA_BYTES,
        "ResultIn.result": results.MAX_RESULT_BYTES,
        "WriteIntentIn.params": intents.MAX_PARAMS_BYTES,
        "GraphPutIn.checkpoint": settings.CHECKPOINT_MAX_BYTES,
        "GraphPutIn.metadata": graphs.MAX_METADATA_BYTES,
        "GraphPutIn.values": graphs.MAX_INLINE_VALUES_BYTES,
        **{f"{component}.{field}": graphs.MAX_PATH_LENGTH for component, field in [
            ("GraphPutIn", "thread_id"), ("GraphPutIn", "checkpoint_ns"), ("GraphTaskWritesIn", "task_path"),
            ("GraphWritesIn", "thread_id"), ("GraphWritesIn", "checkpoint_ns"), ("GraphWritesIn", "task_path"),
            ("GraphCopyIn", "source_thread_id"), ("GraphCopyIn", "target_thread_id"),
        ]},
        "EvidenceIn.content": packets.MAX_EVIDENCE_BYTES,
    }
    assert dict(byte_bounds()) == expected
    for where, limit in expected.items():
        name, _, field = where.partition(".")
        node = component(schema, name)
        node = node["properties"][field] if field else node
        words = bytes_doc(limit) if field else f"at most {limit} bytes"
        assert words in node["description"], where


def test_non_blank_text_is_declared_where_the_core_strips_and_refuses_blanks(schema):
    """The core strips these values and refuses what is left empty; ``minLength``
    alone called ``"   "`` valid. Each declares NON_BLANK_TEXT (storable, one non-space character)."""
    from novelforge_sessions.actions import artifacts
    from novelforge_sessions.apikit.schemas import NON_BLANK_TEXT

    props = lambda name: component(schema, name)["properties"]  # noqa: E731
    fields = [props("ArtifactIn")["name"], props("ClaimIn")["worker"], props("ResolveIn")["resolution"],
              props("CriterionIn")["label"], props("CriterionIn")["anchors"]["additionalProperties"],
              props("EvidenceIn")["label"], props("EvidenceIn")["content"]]
    verdict = schema["paths"]["/api/v1/review-packets/{packet_id}/verdicts"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]["findings"]["items"]["properties"]
    fields += [verdict["note"], verdict["location"]]
    for field in fields:
        assert field["pattern"] == NON_BLANK_TEXT, field
    for text, ok in (("x", True), (" x ", True), ("", False), ("   ", False), ("\n\t", False), ("a\x00", False)):
        assert bool(re.search(NON_BLANK_TEXT, text)) is ok, text
    assert props("ArtifactIn")["name"]["maxLength"] == artifacts.MAX_NAME_LENGTH
    assert props("CriterionIn")["anchors"]["propertyNames"]["pattern"] == packets.SCORE_KEY_PATTERN


def test_route_dependent_gate_limits_are_declared(schema):
    """The agent route takes at most MAX_AGENT_VERDICTS verdicts and reviewer
    sessions, and no users; page and relay take users only (if/then/else, as SessionIn does)."""
    from reviews import actions as review_actions

    gate = component(schema, "GateIn")
    assert gate["if"]["properties"]["route"] == {"const": "agent"}
    then = gate["then"]["properties"]
    assert then["required_verdicts"]["maximum"] == review_actions.MAX_AGENT_VERDICTS
    assert then["reviewer_session_ids"]["maxItems"] == review_actions.MAX_AGENT_VERDICTS
    assert then["reviewers"]["maxItems"] == 0
    assert gate["else"]["properties"]["reviewer_session_ids"]["maxItems"] == 0
    ids = gate["properties"]["reviewer_session_ids"]
    assert (ids["maxItems"], ids["uniqueItems"]) == (review_actions.MAX_AGENT_VERDICTS, True)


def test_graph_channel_versions_are_declared_from_the_measure(schema):
    from novelforge_sessions.control import graphs

    version = component(schema, "GraphChannelBlobIn")["properties"]["version"]
    integer, number, text = version["anyOf"]
    for bounded in (integer, number):
        assert (bounded["minimum"], bounded["maximum"]) == (graphs.MIN_VERSION_NUMBER, graphs.MAX_VERSION_NUMBER)
    assert (text["maxLength"], text["pattern"]) == (graphs.MAX_VERSION_LENGTH, graphs.VERSION_TEXT_PATTERN)
    checkpoint = component(schema, "GraphPutIn")["properties"]["checkpoint"]
    assert checkpoint["properties"]["channel_versions"]["additionalProperties"] == version_without_doc(version)


def version_without_doc(version: dict) -> dict:
    return {key: value for key, value in version.items() if key in ("anyOf",)}
