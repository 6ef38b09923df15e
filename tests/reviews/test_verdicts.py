"""Verdict validation is pure and names the offending field."""
from __future__ import annotations

from typing import Any

import pytest

from novelforge_sessions.session_runtime import InvalidPayload
from reviews.packets import validate_rubric
from reviews.verdicts import aggregate_outcome, validate_verdict
from tests.reviews.factories import RUBRIC

RUB = validate_rubric(RUBRIC)
FP = "sha256:" + "1" * 64
AFP = "sha256:" + "2" * 64


def good(**over: Any) -> dict[str, Any]:
    body = {"packet_fingerprint": FP, "artifact_fingerprint": AFP, "decision": "pass",
            "scores": {"clarity": 5, "pacing": 0}, "findings": [], "confidence": 1}
    body.update(over)
    return body


def test_a_good_verdict_is_normalised():
    v = validate_verdict(good(findings=[{"location": " L1 ", "severity": "major", "note": " flat "}]), RUB)
    assert v.decision == "pass" and v.scores == {"clarity": 5, "pacing": 0} and v.confidence == 1.0
    assert v.findings[0].as_dict() == {"location": "L1", "severity": "major", "note": "flat"}
    # Equal content, equal fingerprint (1 == 1.0; key order irrelevant).
    assert v.fingerprint() == validate_verdict(dict(reversed(list(good(confidence=1.0, findings=[
        {"note": "flat", "severity": "major", "location": "L1"}]).items()))), RUB).fingerprint()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (good(scores={"clarity": 9, "pacing": 1}), "scores.clarity"),
        (good(scores={"clarity": 0, "pacing": 1}), "scores.clarity"),
        (good(scores={"clarity": 3, "pacing": 11}), "scores.pacing"),
        (good(scores={"clarity": 3}), "scores.pacing"),
        (good(scores={"clarity": 3, "pacing": 2, "voice": 1}), "scores.voice"),
        (good(scores={"clarity": "3", "pacing": 2}), "scores.clarity"),
        (good(scores={"clarity": 3.5, "pacing": 2}), "scores.clarity"),
        (good(scores={"clarity": True, "pacing": 2}), "scores.clarity"),
        (good(scores=[3, 2]), "scores"),
        (good(decision="maybe"), "decision"),
        (good(confidence=1.2), "confidence"),
        (good(confidence="high"), "confidence"),
        (good(confidence=float("nan")), "confidence"),
        (good(packet_fingerprint="abc"), "packet_fingerprint"),
        (good(artifact_fingerprint="sha256:XYZ"), "artifact_fingerprint"),
        (good(findings=[{"location": "L1", "severity": "fatal", "note": "x"}]), "findings[0].severity"),
        (good(findings=[{"location": "", "severity": "minor", "note": "x"}]), "findings[0].location"),
        (good(findings=[{"location": "L1", "severity": "minor", "note": " "}]), "findings[0].note"),
        (good(findings=[{"location": "L1", "severity": "minor", "note": "x", "by": "me"}]), "findings[0].by"),
        (good(findings="none"), "findings"),
        (good(extra=1), "extra"),
        ({k: v for k, v in good().items() if k != "decision"}, "decision"),
    ],
)
def test_errors_name_the_offending_field(body, field):
    with pytest.raises(InvalidPayload) as exc:
        validate_verdict(body, RUB)
    assert exc.value.details["field"] == field
    assert field in [e["field"] for e in exc.value.details["errors"]]


def test_all_errors_are_listed():
    with pytest.raises(InvalidPayload) as exc:
        validate_verdict(good(decision="x", confidence=3, scores={"clarity": 0, "pacing": 99}), RUB)
    fields = [e["field"] for e in exc.value.details["errors"]]
    assert fields == ["decision", "scores.clarity", "scores.pacing", "confidence"]


def test_not_an_object():
    with pytest.raises(InvalidPayload) as exc:
        validate_verdict([1, 2], RUB)
    assert exc.value.details["field"] == "body"


@pytest.mark.parametrize(("decisions", "outcome"), [(["pass"], "pass"), (["pass", "revise"], "revise"),
                                                     (["revise", "reject", "pass"], "reject")])
def test_outcome_aggregation(decisions, outcome):
    assert aggregate_outcome(decisions) == outcome


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (good(findings=[{"location": "L1", "severity": "minor", "note": "a\x00b"}]), "findings[0].note"),
        (good(findings=[{"location": "L1", "severity": "minor", "note": "half a pair \ud800"}]), "findings[0].note"),
        (good(findings=[{"location": "L1\x00", "severity": "minor", "note": "fine"}]), "findings[0].location"),
        (good(scores={"clarity": 5, "pacing": 0, "x\x00": 1}), "scores.x\\x00"),
        ({**good(), "\udfff": 1}, "\\udfff"),
    ],
)
def test_text_the_database_cannot_store_is_refused_first_by_its_path(body, field):
    """U+0000 and unpaired surrogates (a pasted ``\\u0000`` / ``\\ud800``) are refused by the one
    validator every channel shares, before anything could echo, fingerprint or store them; the
    named path is itself printable (escaped)."""
    with pytest.raises(InvalidPayload) as info:
        validate_verdict(body, RUB)
    assert info.value.details["field"] == field
    assert info.value.details["errors"] == [{"field": field, "message": "text cannot contain NUL (U+0000) or unpaired surrogates"}]
