"""The blind packet builder and the rubric are pure: deterministic, allowlist-only, fingerprinted."""
from __future__ import annotations

import inspect
import json

import pytest

from novelforge_sessions.session_runtime import InvalidPayload
from reviews import packets
from reviews.packets import EvidenceItem, build_packet, relay_prompt, validate_evidence, validate_rubric
from tests.reviews.factories import CHAPTER, RUBRIC

FP = packets.sha256_fingerprint(CHAPTER.encode())


def test_build_packet_signature_is_the_allowlist():
    params = set(inspect.signature(build_packet).parameters)
    assert params == {"candidate_content", "candidate_fingerprint", "rubric", "evidence"}


def test_packet_is_deterministic_and_fingerprinted_over_canonical_json():
    rubric = validate_rubric(RUBRIC)
    a = build_packet(candidate_content=CHAPTER, candidate_fingerprint=FP, rubric=rubric)
    b = build_packet(candidate_content=CHAPTER, candidate_fingerprint=FP, rubric=validate_rubric(json.loads(json.dumps(RUBRIC))))
    assert a.fingerprint == b.fingerprint == packets.packet_fingerprint(a.content)
    assert a.fingerprint.startswith("sha256:") and len(a.fingerprint) == 71
    assert set(a.content) == {"schema", "instructions", "candidate", "rubric", "evidence", "verdict_schema"}
    assert a.content["candidate"] == {"fingerprint": FP, "content": CHAPTER, "lines": 4}
    # Any change to an input changes the fingerprint.
    other = build_packet(candidate_content=CHAPTER + "!", candidate_fingerprint=packets.sha256_fingerprint((CHAPTER + "!").encode()), rubric=rubric)
    assert other.fingerprint != a.fingerprint


def test_packet_refuses_content_that_does_not_match_its_fingerprint():
    with pytest.raises(InvalidPayload) as exc:
        build_packet(candidate_content=CHAPTER, candidate_fingerprint="sha256:" + "0" * 64, rubric=validate_rubric(RUBRIC))
    assert exc.value.details["field"] == "candidate_fingerprint"


def test_packet_refuses_undeclared_evidence():
    rubric = validate_rubric({**RUBRIC, "evidence": []})
    with pytest.raises(InvalidPayload):
        build_packet(candidate_content=CHAPTER, candidate_fingerprint=FP, rubric=rubric,
                     evidence=[EvidenceItem("style_guide", "Style", "Short sentences.")])


def test_verdict_schema_derives_from_rubric():
    packet = build_packet(candidate_content=CHAPTER, candidate_fingerprint=FP, rubric=validate_rubric(RUBRIC))
    schema = packet.content["verdict_schema"]
    assert schema["properties"]["scores"]["required"] == ["clarity", "pacing"]
    assert schema["properties"]["scores"]["properties"]["clarity"] == {"type": "integer", "minimum": 1, "maximum": 5, "title": "Clarity"}
    assert schema["properties"]["scores"]["properties"]["pacing"]["maximum"] == 10
    assert schema["properties"]["artifact_fingerprint"] == {"const": FP}
    assert schema["properties"]["decision"]["enum"] == ["pass", "revise", "reject"]


@pytest.mark.parametrize(
    ("rubric", "field"),
    [
        ({"criteria": []}, "rubric.criteria"),
        ({"criteria": [{"key": "Bad Key", "label": "x", "scale": {"min": 1, "max": 5}}]}, "rubric.criteria[0].key"),
        ({"criteria": [{"key": "a", "label": "", "scale": {"min": 1, "max": 5}}]}, "rubric.criteria[0].label"),
        ({"criteria": [{"key": "a", "label": "A", "scale": {"min": 5, "max": 5}}]}, "rubric.criteria[0].scale.max"),
        ({"criteria": [{"key": "a", "label": "A", "scale": {"min": 1.5, "max": 5}}]}, "rubric.criteria[0].scale.min"),
        ({"criteria": [{"key": "a", "label": "A", "scale": {"min": 1, "max": 5}},
                       {"key": "a", "label": "B", "scale": {"min": 1, "max": 5}}]}, "rubric.criteria[1].key"),
        ({"criteria": [{"key": "a", "label": "A", "scale": {"min": 1, "max": 5}, "weight": 2}]}, "rubric.criteria[0].weight"),
        ({**RUBRIC, "hidden": 1}, "rubric.hidden"),
    ],
)
def test_rubric_errors_name_the_field(rubric, field):
    with pytest.raises(InvalidPayload) as exc:
        validate_rubric(rubric)
    assert exc.value.details["field"] == field


def test_evidence_must_be_declared_by_the_rubric():
    rubric = validate_rubric(RUBRIC)
    ok = validate_evidence([{"key": "style_guide", "label": "House style", "content": "Short sentences."}], rubric)
    assert ok == (EvidenceItem("style_guide", "House style", "Short sentences."),)
    with pytest.raises(InvalidPayload) as exc:
        validate_evidence([{"key": "writer_notes", "label": "Notes", "content": "my plan"}], rubric)
    assert exc.value.details["field"] == "evidence[0].key"


def test_relay_prompt_is_self_contained():
    packet = build_packet(candidate_content=CHAPTER, candidate_fingerprint=FP, rubric=validate_rubric(RUBRIC),
                          evidence=[EvidenceItem("style_guide", "House style", "Short sentences.")])
    text = relay_prompt(packet.content, packet.fingerprint)
    assert packet.fingerprint in text and FP in text
    assert packets.INSTRUCTIONS in text
    assert "   2 | Tonight it flickered twice" in text  # numbered candidate lines
    assert "- clarity (Clarity): integer from 1 to 5" in text
    assert "Short sentences." in text
    schema_text = text.split("== JSON SCHEMA OF YOUR ANSWER ==\n", 1)[1].split("\n\n== SHAPE", 1)[0]
    assert json.loads(schema_text) == packet.content["verdict_schema"]
