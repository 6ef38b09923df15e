"""Typed verdicts: validation against the packet's rubric (pure; no Django, no I/O).

One validator for every channel — the reviewer page's form, the peer-chat relay's pasted JSON
and the agent API — so "validated exactly like any verdict" is true by construction. Every
error names the offending field (``decision``, ``scores.clarity``, ``findings[2].severity``,
``confidence``...); all errors found are listed in ``details.errors``, the first one is
``details.field``. The messages are English phrases (``novelforge_sessions.phrases``): a page in
another language says them in its own.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from novelforge_sessions.phrases import Phrase, gettext_noop
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


#: Messages more than one field uses.
UNKNOWN_FIELD = gettext_noop("unknown field")
REQUIRED = gettext_noop("is required")
ONE_OF = gettext_noop("must be one of %(choices)s")
NON_EMPTY = gettext_noop("must be a non-empty string of at most %(n)s characters")


class _Errors:
    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def add(self, field: str, message: str) -> None:
        self.items.append({"field": field, "message": message})

    def raise_if_any(self) -> None:
        if self.items:
            first = self.items[0]
            raise InvalidPayload(Phrase(FIELD_MESSAGE, field=first["field"], message=first["message"]),
                                 field=first["field"], errors=self.items)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


#: One line or a range: ``L3``, ``3``, ``line 3``, ``lines 3-5``, ``L3–L5`` (hyphen, en or em dash, "to").
_LINE_PART = re.compile(
    r"^(?:l|line|lines)?\s*\.?\s*(\d{1,7})\s*(?:(?:-|–|—|to)\s*(?:l|line)?\s*\.?\s*(\d{1,7}))?$", re.IGNORECASE
)
LOCATION_HINT = gettext_noop("a line or range of the candidate, e.g. L3, L3-5 or L3, L7")
#: A refusal's message naming its field (``scores.clarity: is required``).
FIELD_MESSAGE = gettext_noop("%(field)s: %(message)s")


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
        return Phrase(gettext_noop("must name %(hint)s"), hint=Phrase(LOCATION_HINT))
    for start, end in ranges:
        if start > end:
            return Phrase(gettext_noop("the range %(start)s-%(end)s runs backwards"), start=start, end=end)
        for n in (start, end):
            if not 1 <= n <= candidate_lines:
                return Phrase(gettext_noop("line %(n)s is not in the candidate (it has %(lines)s line)") if candidate_lines == 1
                              else gettext_noop("line %(n)s is not in the candidate (it has %(lines)s lines)"),
                              n=n, lines=candidate_lines)
    return None


def validate_verdict(payload: Any, rubric: Rubric, *, candidate_lines: int | None = None) -> VerdictData:
    """Check a verdict body against the rubric and return its normalised form.

    ``candidate_lines``: the packet's candidate has this many lines, and every finding's
    location must name lines among them (``findings[i].location`` otherwise). ``None`` skips
    that check (no candidate at hand)."""
    errors = _Errors()
    if not isinstance(payload, Mapping):
        errors.add("body", Phrase(gettext_noop("a verdict is a JSON object")))
        errors.raise_if_any()
    # Text PostgreSQL cannot store (U+0000, an unpaired surrogate from a pasted ``\ud800``) is
    # refused first, by its path, whichever channel sent it: nothing below may echo or store it.
    unstorable = unstorable_text_at(payload)
    if unstorable is not None:
        errors.add(printable_path(unstorable), UNSTORABLE_TEXT)
        errors.raise_if_any()
    for name in sorted(set(payload) - set(VERDICT_FIELDS)):
        errors.add(str(name), Phrase(UNKNOWN_FIELD))
    for name in VERDICT_FIELDS:
        if name not in payload:
            errors.add(name, Phrase(REQUIRED))

    for name in ("packet_fingerprint", "artifact_fingerprint"):
        if name in payload and not is_fingerprint(payload[name]):
            errors.add(name, Phrase(gettext_noop("must look like sha256:<64 lowercase hex digits>")))

    decision = payload.get("decision")
    if "decision" in payload and decision not in DECISIONS:
        errors.add("decision", Phrase(ONE_OF, choices=", ".join(DECISIONS)))

    scores_in = payload.get("scores")
    scores: dict[str, int] = {}
    if "scores" in payload:
        if not isinstance(scores_in, Mapping):
            errors.add("scores", Phrase(gettext_noop("must be an object with one integer per rubric criterion")))
        else:
            for key in sorted(set(scores_in) - {c.key for c in rubric.criteria}):
                errors.add(f"scores.{key}", Phrase(gettext_noop("is not a criterion of this rubric")))
            for c in rubric.criteria:
                field = f"scores.{c.key}"
                if c.key not in scores_in:
                    errors.add(field, Phrase(gettext_noop("is required (an integer from %(min)s to %(max)s)"),
                                             min=c.min, max=c.max))
                    continue
                value = scores_in[c.key]
                if not _is_int(value):
                    errors.add(field, Phrase(gettext_noop("must be an integer from %(min)s to %(max)s"), min=c.min, max=c.max))
                elif not c.min <= value <= c.max:
                    errors.add(field, Phrase(gettext_noop("%(value)s is outside the scale %(min)s..%(max)s"),
                                             value=value, min=c.min, max=c.max))
                else:
                    scores[c.key] = value

    findings: list[Finding] = []
    findings_in = payload.get("findings")
    if "findings" in payload:
        if not isinstance(findings_in, list):
            errors.add("findings", Phrase(gettext_noop("must be a list (it may be empty)")))
        elif len(findings_in) > MAX_FINDINGS:
            errors.add("findings", Phrase(gettext_noop("at most %(n)s findings"), n=MAX_FINDINGS))
        else:
            for i, item in enumerate(findings_in):
                where = f"findings[{i}]"
                if not isinstance(item, Mapping):
                    errors.add(where, Phrase(gettext_noop("must be an object {location, severity, note}")))
                    continue
                for name in sorted(set(item) - {"location", "severity", "note"}):
                    errors.add(f"{where}.{name}", Phrase(UNKNOWN_FIELD))
                location, severity, note = item.get("location"), item.get("severity"), item.get("note")
                ok = True
                if not isinstance(location, str) or not location.strip() or len(location) > MAX_LOCATION:
                    errors.add(f"{where}.location", Phrase(NON_EMPTY, n=MAX_LOCATION))
                    ok = False
                elif candidate_lines is not None and (why := location_error(location.strip(), candidate_lines)):
                    errors.add(f"{where}.location", why)
                    ok = False
                if severity not in SEVERITIES:
                    errors.add(f"{where}.severity", Phrase(ONE_OF, choices=", ".join(SEVERITIES)))
                    ok = False
                if not isinstance(note, str) or not note.strip() or len(note) > MAX_NOTE:
                    errors.add(f"{where}.note", Phrase(NON_EMPTY, n=MAX_NOTE))
                    ok = False
                if ok:
                    findings.append(Finding(location.strip(), severity, note.strip()))

    confidence = payload.get("confidence")
    if "confidence" in payload and (not _is_number(confidence) or not 0 <= confidence <= 1):
        errors.add("confidence", Phrase(gettext_noop("must be a number from 0 to 1")))

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
