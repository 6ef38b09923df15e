"""Typed verdicts: validation against the packet's rubric (pure; no Django, no I/O).

One validator for every channel — the reviewer page's form, the peer-chat relay's pasted JSON
and the agent API — so "validated exactly like any verdict" is true by construction. Every
error names the offending field (``decision``, ``scores.clarity``, ``findings[2].severity``,
``confidence``...); all errors found are listed in ``details.errors``, the first one is
``details.field``.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from novelforge_sessions.session_runtime import (
    UNSTORABLE_TEXT, InvalidPayload, is_fingerprint, printable_path, unstorable_text_at,
)
from reviews.packets import (
    DECISIONS,
    MAX_FINDINGS,
    MAX_LOCATION,
    MAX_NOTE,
    SEVERITIES,
    Rubric,
    canonical_json,
    sha256_fingerprint,
)

VERDICT_FIELDS = ("packet_fingerprint", "artifact_fingerprint", "decision", "scores", "findings", "confidence")


@dataclass(frozen=True)
class Finding:
    location: str
    severity: str
    note: str

    def as_dict(self) -> dict[str, str]:
        return {"location": self.location, "severity": self.severity, "note": self.note}


@dataclass(frozen=True)
class VerdictData:
    packet_fingerprint: str
    artifact_fingerprint: str
    decision: str
    scores: dict[str, int]
    findings: tuple[Finding, ...]
    confidence: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "packet_fingerprint": self.packet_fingerprint,
            "artifact_fingerprint": self.artifact_fingerprint,
            "decision": self.decision,
            "scores": dict(self.scores),
            "findings": [f.as_dict() for f in self.findings],
            "confidence": self.confidence,
        }

    def fingerprint(self) -> str:
        """Identity of the verdict's content: an identical resubmission has the same one."""
        return sha256_fingerprint(canonical_json(self.as_dict()))


class _Errors:
    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def add(self, field: str, message: str) -> None:
        self.items.append({"field": field, "message": message})

    def raise_if_any(self) -> None:
        if self.items:
            first = self.items[0]
            raise InvalidPayload(f"{first['field']}: {first['message']}", field=first["field"], errors=self.items)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


#: One line or a range: ``L3``, ``3``, ``line 3``, ``lines 3-5``, ``L3–L5`` (hyphen, en or em dash, "to").
_LINE_PART = re.compile(
    r"^(?:l|line|lines)?\s*\.?\s*(\d{1,7})\s*(?:(?:-|–|—|to)\s*(?:l|line)?\s*\.?\s*(\d{1,7}))?$", re.IGNORECASE
)
LOCATION_HINT = "a line or range of the candidate, e.g. L3, L3-5 or L3, L7"


def parse_location(text: str) -> list[tuple[int, int]] | None:
    """The line ranges a finding's location names (``L3, L7-9`` → [(3, 3), (7, 9)]), or None
    when it names no lines. Ranges are not checked against a candidate here."""
    parts = [p.strip() for p in re.split(r"[,;]", text)]
    if not parts or any(not p for p in parts):
        return None
    ranges = []
    for part in parts:
        m = _LINE_PART.match(part)
        if not m:
            return None
        start = int(m.group(1))
        end = int(m.group(2)) if m.group(2) else start
        ranges.append((start, end))
    return ranges


def location_error(text: str, candidate_lines: int) -> str | None:
    """Why a location does not point into a candidate of ``candidate_lines`` lines (None: it does)."""
    ranges = parse_location(text)
    if ranges is None:
        return f"must name {LOCATION_HINT}"
    for start, end in ranges:
        if start > end:
            return f"the range {start}-{end} runs backwards"
        for n in (start, end):
            if not 1 <= n <= candidate_lines:
                return f"line {n} is not in the candidate (it has {candidate_lines} line{'s' if candidate_lines != 1 else ''})"
    return None


def validate_verdict(payload: Any, rubric: Rubric, *, candidate_lines: int | None = None) -> VerdictData:
    """Check a verdict body against the rubric and return its normalised form.

    ``candidate_lines``: the packet's candidate has this many lines, and every finding's
    location must name lines among them (``findings[i].location`` otherwise). ``None`` skips
    that check (no candidate at hand)."""
    errors = _Errors()
    if not isinstance(payload, Mapping):
        errors.add("body", "a verdict is a JSON object")
        errors.raise_if_any()
    # Text PostgreSQL cannot store (U+0000, an unpaired surrogate from a pasted ``\ud800``) is
    # refused first, by its path, whichever channel sent it: nothing below may echo or store it.
    unstorable = unstorable_text_at(payload)
    if unstorable is not None:
        errors.add(printable_path(unstorable), UNSTORABLE_TEXT)
        errors.raise_if_any()
    for name in sorted(set(payload) - set(VERDICT_FIELDS)):
        errors.add(str(name), "unknown field")
    for name in VERDICT_FIELDS:
        if name not in payload:
            errors.add(name, "is required")

    for name in ("packet_fingerprint", "artifact_fingerprint"):
        if name in payload and not is_fingerprint(payload[name]):
            errors.add(name, "must look like sha256:<64 lowercase hex digits>")

    decision = payload.get("decision")
    if "decision" in payload and decision not in DECISIONS:
        errors.add("decision", f"must be one of {', '.join(DECISIONS)}")

    scores_in = payload.get("scores")
    scores: dict[str, int] = {}
    if "scores" in payload:
        if not isinstance(scores_in, Mapping):
            errors.add("scores", "must be an object with one integer per rubric criterion")
        else:
            for key in sorted(set(scores_in) - {c.key for c in rubric.criteria}):
                errors.add(f"scores.{key}", "is not a criterion of this rubric")
            for c in rubric.criteria:
                field = f"scores.{c.key}"
                if c.key not in scores_in:
                    errors.add(field, f"is required (an integer from {c.min} to {c.max})")
                    continue
                value = scores_in[c.key]
                if not _is_int(value):
                    errors.add(field, f"must be an integer from {c.min} to {c.max}")
                elif not c.min <= value <= c.max:
                    errors.add(field, f"{value} is outside the scale {c.min}..{c.max}")
                else:
                    scores[c.key] = value

    findings: list[Finding] = []
    findings_in = payload.get("findings")
    if "findings" in payload:
        if not isinstance(findings_in, list):
            errors.add("findings", "must be a list (it may be empty)")
        elif len(findings_in) > MAX_FINDINGS:
            errors.add("findings", f"at most {MAX_FINDINGS} findings")
        else:
            for i, item in enumerate(findings_in):
                where = f"findings[{i}]"
                if not isinstance(item, Mapping):
                    errors.add(where, "must be an object {location, severity, note}")
                    continue
                for name in sorted(set(item) - {"location", "severity", "note"}):
                    errors.add(f"{where}.{name}", "unknown field")
                location, severity, note = item.get("location"), item.get("severity"), item.get("note")
                ok = True
                if not isinstance(location, str) or not location.strip() or len(location) > MAX_LOCATION:
                    errors.add(f"{where}.location", f"must be a non-empty string of at most {MAX_LOCATION} characters")
                    ok = False
                elif candidate_lines is not None and (why := location_error(location.strip(), candidate_lines)):
                    errors.add(f"{where}.location", why)
                    ok = False
                if severity not in SEVERITIES:
                    errors.add(f"{where}.severity", f"must be one of {', '.join(SEVERITIES)}")
                    ok = False
                if not isinstance(note, str) or not note.strip() or len(note) > MAX_NOTE:
                    errors.add(f"{where}.note", f"must be a non-empty string of at most {MAX_NOTE} characters")
                    ok = False
                if ok:
                    findings.append(Finding(location.strip(), severity, note.strip()))

    confidence = payload.get("confidence")
    if "confidence" in payload and (not _is_number(confidence) or not 0 <= confidence <= 1):
        errors.add("confidence", "must be a number from 0 to 1")

    errors.raise_if_any()
    return VerdictData(
        packet_fingerprint=payload["packet_fingerprint"],
        artifact_fingerprint=payload["artifact_fingerprint"],
        decision=decision,
        scores={c.key: scores[c.key] for c in rubric.criteria},
        findings=tuple(findings),
        confidence=float(confidence),
    )


def aggregate_outcome(decisions: Iterable[str]) -> str:
    """A gate's outcome from its bound verdicts: any reject rejects, any revise revises."""
    decided = set(decisions)
    for outcome in ("reject", "revise", "pass"):
        if outcome in decided:
            return outcome
    raise ValueError("no decisions to aggregate")
