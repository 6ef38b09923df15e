"""The bounded blind packet: rubric validation, verdict schema, packet building (pure).

No Django, no I/O. :func:`build_packet` takes its inputs as explicit keyword arguments — its
signature *is* the allowlist (docs/model.md#reviews-and-independence): the frozen candidate (content + fingerprint), the
typed rubric, the verdict schema derived from it, the evidence the rubric declares, and fixed
instructions. There is no parameter through which a writer's transcript, private reasoning,
run state, calibration material or another reviewer's verdict could enter, and the function
refuses evidence the rubric did not declare.

The packet fingerprint is the sha256 of the packet's canonical JSON (sorted keys, no
whitespace, UTF-8): the same inputs always give the same packet and the same fingerprint.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.utils.translation import gettext_lazy as _
from django.utils.translation import gettext_noop

from novelforge_sessions.session_runtime import FINGERPRINT_PATTERN, InvalidPayload

PACKET_SCHEMA = "novelforge.review_packet/1"
VERDICT_SCHEMA_ID = "novelforge.verdict/1"
DECISIONS: tuple[str, ...] = ("pass", "revise", "reject")
SEVERITIES: tuple[str, ...] = ("minor", "major", "critical")
ROUTES: tuple[str, ...] = ("page", "relay", "agent")

MAX_CRITERIA = 20
MAX_SCALE_SPAN = 100
MAX_EVIDENCE_ITEMS = 10
MAX_EVIDENCE_BYTES = 32 * 1024
MAX_FINDINGS = 50
MAX_LOCATION = 200
MAX_NOTE = 4000
MAX_ANCHOR = 80
MAX_LABEL = 120
MAX_DESCRIPTION = 2000
MAX_EVIDENCE_LABEL = 200

#: Named confidence levels offered to people (the form); a verdict carries the number, and the API
#: takes any number from 0 to 1.
#: The labels are marked for the pages' catalogs (the form shows them translated, views.py).
CONFIDENCE_LEVELS: tuple[tuple[str, str, float], ...] = (
    ("unsure", gettext_noop("Not sure"), 0.25),
    ("fairly", gettext_noop("Fairly sure"), 0.5),
    ("sure", gettext_noop("Sure"), 0.75),
    ("certain", gettext_noop("Certain"), 1.0),
)

#: The decisions in the verdict form's words (the confirmation, the refusals and the manager's
#: pages say these; the API and the stored verdict keep the codes).
DECISION_LABELS: dict[str, str] = {"pass": _("Pass"), "revise": _("Needs revision"), "reject": _("Reject")}


def confidence_words(value: float | None) -> str:
    """A stored confidence as the form's choice nearest to it ("Sure" for 0.75; "0.6" is "Fairly sure")."""
    if value is None:
        return ""
    return str(_(min(CONFIDENCE_LEVELS, key=lambda level: (abs(level[2] - float(value)), -level[2]))[1]))


#: Rubric criterion and evidence keys (the API schema declares this pattern).
KEY_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"
_KEY_RE = re.compile(KEY_PATTERN)

INSTRUCTIONS = (
    "You are an independent reviewer. Review only the candidate below, against the rubric below, "
    "using only the evidence listed here (if any). You have not seen, and must not ask for, the "
    "author's notes, drafts, conversation or anyone else's review. Score every criterion with an "
    "integer inside its scale, decide pass, revise or reject, list concrete findings (location = "
    "line number or range in the candidate, severity minor|major|critical, note), and state your "
    "confidence between 0 and 1. Where the rubric labels scores (anchors), use them as the meaning of those "
    "scores. Cite the packet fingerprint and the artifact fingerprint exactly: "
    "a verdict that cites other fingerprints is refused as stale."
)


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def sha256_fingerprint(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ------------------------------------------------------------------------------------------
# Rubric
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Criterion:
    key: str
    label: str
    min: int
    max: int
    description: str = ""
    #: What a score means, for some or all scores of the scale (score -> short label), e.g. its ends.
    anchors: tuple[tuple[int, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "label": self.label, "scale": {"min": self.min, "max": self.max},
                               "description": self.description}
        if self.anchors:  # absent when none: packets without anchors keep their bytes and fingerprints
            out["anchors"] = {str(score): label for score, label in self.anchors}
        return out

    def anchor(self, score: int) -> str:
        return dict(self.anchors).get(score, "")

    def anchors_text(self) -> str:
        """``1 = Confusing, 5 = Crystal clear`` (empty without anchors)."""
        return ", ".join(f"{score} = {label}" for score, label in self.anchors)


@dataclass(frozen=True)
class Rubric:
    criteria: tuple[Criterion, ...]
    evidence: tuple[str, ...] = ()  # evidence keys the rubric allows

    def as_dict(self) -> dict[str, Any]:
        return {"criteria": [c.as_dict() for c in self.criteria], "evidence": list(self.evidence)}

    def criterion(self, key: str) -> Criterion | None:
        return next((c for c in self.criteria if c.key == key), None)


def _text(value: Any, field: str, *, max_len: int, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise InvalidPayload(f"{field} must be a string", field=field)
    # Measured as sent, before stripping: the schema's maxLength counts the same characters.
    if len(value) > max_len:
        raise InvalidPayload(f"{field} is longer than {max_len} characters", field=field, limit=max_len)
    value = value.strip()
    if required and not value:
        raise InvalidPayload(f"{field} must not be empty", field=field)
    return value


def validate_rubric(value: Any, field: str = "rubric") -> Rubric:
    """A typed rubric: 1–20 criteria, each a unique key, a label, an integer scale min<max."""
    if not isinstance(value, Mapping):
        raise InvalidPayload(f"{field} must be an object with criteria", field=field)
    unknown = sorted(set(value) - {"criteria", "evidence"})
    if unknown:
        raise InvalidPayload(f"unknown rubric field {unknown[0]!r}", field=f"{field}.{unknown[0]}")
    raw = value.get("criteria")
    if not isinstance(raw, list) or not raw:
        raise InvalidPayload("a rubric needs at least one criterion", field=f"{field}.criteria")
    if len(raw) > MAX_CRITERIA:
        raise InvalidPayload(f"at most {MAX_CRITERIA} criteria", field=f"{field}.criteria")
    criteria: list[Criterion] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"{field}.criteria[{i}]"
        if not isinstance(item, Mapping):
            raise InvalidPayload("each criterion must be an object", field=where)
        extra = sorted(set(item) - {"key", "label", "scale", "description", "anchors"})
        if extra:
            raise InvalidPayload(f"unknown criterion field {extra[0]!r}", field=f"{where}.{extra[0]}")
        key = item.get("key")
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise InvalidPayload("criterion key must be a short lowercase name ([a-z][a-z0-9_]*)", field=f"{where}.key")
        if key in seen:
            raise InvalidPayload(f"criterion key {key!r} is used twice", field=f"{where}.key")
        seen.add(key)
        label = _text(item.get("label"), f"{where}.label", max_len=MAX_LABEL)
        description = _text(item.get("description"), f"{where}.description", max_len=MAX_DESCRIPTION, required=False)
        scale = item.get("scale")
        if not isinstance(scale, Mapping) or set(scale) != {"min", "max"}:
            raise InvalidPayload("scale must be an object {min, max}", field=f"{where}.scale")
        lo, hi = scale["min"], scale["max"]
        if not _is_int(lo):
            raise InvalidPayload("scale.min must be an integer", field=f"{where}.scale.min")
        if not _is_int(hi):
            raise InvalidPayload("scale.max must be an integer", field=f"{where}.scale.max")
        if not lo < hi or hi - lo > MAX_SCALE_SPAN:
            raise InvalidPayload(
                f"scale must satisfy min < max and max - min <= {MAX_SCALE_SPAN}", field=f"{where}.scale.max"
            )
        anchors = _validate_anchors(item.get("anchors"), lo, hi, f"{where}.anchors")
        criteria.append(Criterion(key, label, lo, hi, description, anchors))
    allowed = value.get("evidence", [])
    if not isinstance(allowed, list) or not all(isinstance(k, str) and _KEY_RE.match(k) for k in allowed):
        raise InvalidPayload("rubric.evidence must be a list of evidence keys", field=f"{field}.evidence")
    if len(set(allowed)) != len(allowed) or len(allowed) > MAX_EVIDENCE_ITEMS:
        raise InvalidPayload(f"rubric.evidence keys must be unique (at most {MAX_EVIDENCE_ITEMS})", field=f"{field}.evidence")
    return Rubric(tuple(criteria), tuple(allowed))


#: An anchor's key: a score of the scale written as an integer (the API schema declares this pattern).
SCORE_KEY_PATTERN = r"^-?\d{1,4}$"
_SCORE_KEY_RE = re.compile(SCORE_KEY_PATTERN)


def _validate_anchors(value: Any, lo: int, hi: int, field: str) -> tuple[tuple[int, str], ...]:
    """Anchors: an object mapping scores of the scale (written as JSON keys, e.g. ``"1"``) to short
    labels (e.g. ``{"1": "Confusing", "5": "Crystal clear"}``); some scores or all. Sorted by score."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise InvalidPayload('anchors must be an object {"<score>": "<label>"}', field=field)
    out: dict[int, str] = {}
    for raw_key, label in value.items():
        where = f"{field}.{str(raw_key)[:20]}"  # the key as given (cut short: it is echoed in the error)
        if not isinstance(raw_key, str) or not _SCORE_KEY_RE.match(raw_key):
            raise InvalidPayload("an anchor's key must be a score of the scale, written as an integer", field=where)
        score = int(raw_key)
        if not lo <= score <= hi:
            raise InvalidPayload(f"score {score} is outside the scale {lo}..{hi}", field=where)
        if score in out:
            raise InvalidPayload(f"score {score} has two anchors", field=where)
        out[score] = _text(label, where, max_len=MAX_ANCHOR)
    return tuple(sorted(out.items()))


def rubric_from_dict(value: Mapping[str, Any]) -> Rubric:
    """Rebuild a rubric stored by ``Rubric.as_dict`` (already validated)."""
    return validate_rubric(value)


# ------------------------------------------------------------------------------------------
# Declared evidence
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EvidenceItem:
    key: str
    label: str
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"key": self.key, "label": self.label, "content": self.content}


def validate_evidence(value: Any, rubric: Rubric, field: str = "evidence") -> tuple[EvidenceItem, ...]:
    """Only evidence the rubric declares: each item's key must be allowed."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidPayload("evidence must be a list", field=field)
    if len(value) > MAX_EVIDENCE_ITEMS:
        raise InvalidPayload(f"at most {MAX_EVIDENCE_ITEMS} evidence items", field=field)
    items: list[EvidenceItem] = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(item, Mapping) or set(item) - {"key", "label", "content"}:
            raise InvalidPayload("each evidence item is {key, label, content}", field=where)
        key = item.get("key")
        if key not in rubric.evidence:
            raise InvalidPayload(
                "the rubric does not declare this evidence", field=f"{where}.key", allowed=list(rubric.evidence)
            )
        if key in seen:
            raise InvalidPayload(f"evidence {key!r} is given twice", field=f"{where}.key")
        seen.add(key)
        label = _text(item.get("label"), f"{where}.label", max_len=MAX_EVIDENCE_LABEL)
        content = item.get("content")
        if not isinstance(content, str) or not content.strip():
            raise InvalidPayload("evidence content must be a non-empty string", field=f"{where}.content")
        if len(content.encode()) > MAX_EVIDENCE_BYTES:
            raise InvalidPayload(f"evidence content is over {MAX_EVIDENCE_BYTES} bytes", field=f"{where}.content")
        items.append(EvidenceItem(key, label, content))
    return tuple(items)


# ------------------------------------------------------------------------------------------
# Verdict schema (derived from the rubric) and the packet
# ------------------------------------------------------------------------------------------
def _score_schema(c: Criterion) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "minimum": c.min, "maximum": c.max, "title": c.label}
    if c.anchors:
        schema["description"] = c.anchors_text()
    return schema


def verdict_schema(rubric: Rubric, artifact_fingerprint: str) -> dict[str, Any]:
    """The JSON Schema a verdict on this packet must satisfy (``verdicts.validate_verdict``
    enforces exactly this, plus the packet fingerprint, which cannot be inside the packet it
    fingerprints)."""
    return {
        "$id": VERDICT_SCHEMA_ID,
        "type": "object",
        "additionalProperties": False,
        "required": ["packet_fingerprint", "artifact_fingerprint", "decision", "scores", "findings", "confidence"],
        "properties": {
            "packet_fingerprint": {"type": "string", "pattern": FINGERPRINT_PATTERN, "description": "the packet fingerprint, exactly"},
            "artifact_fingerprint": {"const": artifact_fingerprint},
            "decision": {"enum": list(DECISIONS)},
            "scores": {
                "type": "object",
                "additionalProperties": False,
                "required": [c.key for c in rubric.criteria],
                "properties": {
                    c.key: _score_schema(c) for c in rubric.criteria
                },
            },
            "findings": {
                "type": "array",
                "maxItems": MAX_FINDINGS,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["location", "severity", "note"],
                    "properties": {
                        "location": {"type": "string", "minLength": 1, "maxLength": MAX_LOCATION,
                                     "description": "line(s) of the candidate: L3, L3-5 or L3, L7"},
                        "severity": {"enum": list(SEVERITIES)},
                        "note": {"type": "string", "minLength": 1, "maxLength": MAX_NOTE},
                    },
                },
            },
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
    }


@dataclass(frozen=True)
class Packet:
    content: dict[str, Any]
    fingerprint: str


def build_packet(
    *,
    candidate_content: str,
    candidate_fingerprint: str,
    rubric: Rubric,
    evidence: Sequence[EvidenceItem] = (),
) -> Packet:
    """Build the blind packet from the allowlist and fingerprint it.

    The candidate's fingerprint is re-derived from its bytes: a packet never pairs content with
    a fingerprint it does not have.
    """
    if sha256_fingerprint(candidate_content.encode()) != candidate_fingerprint:
        raise InvalidPayload("the candidate's content does not match its fingerprint", field="candidate_fingerprint")
    for item in evidence:
        if item.key not in rubric.evidence:
            raise InvalidPayload("the rubric does not declare this evidence", field="evidence", key=item.key)
    content = {
        "schema": PACKET_SCHEMA,
        "instructions": INSTRUCTIONS,
        "candidate": {
            "fingerprint": candidate_fingerprint,
            "content": candidate_content,
            "lines": len(candidate_content.splitlines()),
        },
        "rubric": rubric.as_dict(),
        "evidence": [item.as_dict() for item in evidence],
        "verdict_schema": verdict_schema(rubric, candidate_fingerprint),
    }
    return Packet(content=content, fingerprint=sha256_fingerprint(canonical_json(content)))


def packet_fingerprint(content: Mapping[str, Any]) -> str:
    return sha256_fingerprint(canonical_json(content))


def answer_skeleton(rubric: Rubric, *, packet_fp: str, artifact_fp: str) -> str:
    """A shape reminder for the other chat (placeholders, not a suggested answer)."""
    scores = ", ".join(f'"{c.key}": <integer {c.min}..{c.max}>' for c in rubric.criteria)
    return (
        "{\n"
        f'  "packet_fingerprint": "{packet_fp}",\n'
        f'  "artifact_fingerprint": "{artifact_fp}",\n'
        '  "decision": "pass" | "revise" | "reject",\n'
        f"  \"scores\": {{{scores}}},\n"
        '  "findings": [{"location": "L3", "severity": "minor" | "major" | "critical", "note": "..."}],\n'
        '  "confidence": <number 0..1>\n'
        "}"
    )


def relay_prompt(content: Mapping[str, Any], fingerprint: str) -> str:
    """The self-contained text a reviewer copies into another chat (the peer-chat relay).

    Built from the stored packet only: whatever is not in the packet cannot be in the prompt.
    """
    rubric = validate_rubric(content["rubric"])
    candidate = content["candidate"]
    lines = [
        "INDEPENDENT REVIEW REQUEST (NovelForge blind review packet)",
        "",
        content["instructions"],
        "",
        "Answer with ONE JSON object matching the JSON schema below (a ```json code block is fine; give only one object).",
        "Copy both fingerprints into your answer exactly as written here:",
        f"  packet_fingerprint:   {fingerprint}",
        f"  artifact_fingerprint: {candidate['fingerprint']}",
        "",
        "== RUBRIC ==",
    ]
    for c in rubric.criteria:
        desc = f" — {c.description}" if c.description else ""
        anchors = f" [{c.anchors_text()}]" if c.anchors else ""
        lines.append(f"- {c.key} ({c.label}): integer from {c.min} to {c.max}{anchors}{desc}")
    if content.get("evidence"):
        lines += ["", "== EVIDENCE (declared by the rubric; use nothing else) =="]
        for item in content["evidence"]:
            lines += [f"--- {item['key']}: {item['label']} ---", item["content"]]
    numbered = "\n".join(f"{n:>4} | {line}" for n, line in enumerate(candidate["content"].splitlines(), start=1))
    lines += [
        "",
        f"== CANDIDATE ({candidate['fingerprint']}; line numbers added for your findings) ==",
        numbered,
        "== END OF CANDIDATE ==",
        "",
        "== JSON SCHEMA OF YOUR ANSWER ==",
        json.dumps(content["verdict_schema"], indent=2, ensure_ascii=False),
        "",
        "== SHAPE OF YOUR ANSWER ==",
        answer_skeleton(rubric, packet_fp=fingerprint, artifact_fp=candidate["fingerprint"]),
        "",
    ]
    return "\n".join(lines)
