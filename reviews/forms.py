"""The verdict form and the relay paste box (its reply is searched by ``reviews.relay``).

The form is generated from the rubric (templates/reviews/_verdict_form.html); here its POST is
turned into the same JSON-shaped verdict an agent or another chat would send, and
``verdicts.validate_verdict`` judges it. Nothing is validated here beyond parsing numbers, so
the form, the relay and the API share one set of rules and one set of field names.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from django import forms
from django.http import QueryDict
from django.utils.translation import gettext_lazy

from reviews.packets import Rubric

#: At most 18 digits: an integer that fits a bigint. Python refuses to convert more than 4,300
#: (a ValueError), so a longer run stays text for the validator to name by its field.
_INT = re.compile(r"^-?\d{1,18}$")
#: A finding row's index as the form numbers its rows (a crafted longer index names no row).
_FINDING = re.compile(r"^finding-(\d{1,3})-(location|severity|note)$")
MAX_FINDING_ROWS = 60


@dataclass
class FindingRow:
    location: str = ""
    severity: str = ""
    note: str = ""


def _number(raw: str) -> Any:
    """An int or a finite float when the text is one; otherwise the text, for the validator to
    name by its field (``9`` × 5,000, ``nan`` and ``1e999`` are not numbers a verdict can hold)."""
    if _INT.match(raw):
        return int(raw)
    try:
        value = float(raw)
    except ValueError:
        return raw
    return value if math.isfinite(value) else raw


def finding_rows(post: QueryDict) -> list[FindingRow]:
    indices = sorted({int(m.group(1)) for key in post if (m := _FINDING.match(key))})[:MAX_FINDING_ROWS]
    rows = []
    for i in indices:
        row = FindingRow(*(post.get(f"finding-{i}-{part}", "").strip() for part in ("location", "severity", "note")))
        if row.location or row.note:
            rows.append(row)
    return rows


def verdict_payload_from_post(post: QueryDict, rubric: Rubric) -> dict[str, Any]:
    """The verdict a form POST describes, in the API's JSON shape (blank inputs are omitted, so
    the validator reports them as required by their field name)."""
    payload: dict[str, Any] = {
        "packet_fingerprint": post.get("packet_fingerprint", ""),
        "artifact_fingerprint": post.get("artifact_fingerprint", ""),
    }
    if post.get("decision"):
        payload["decision"] = post["decision"]
    scores: dict[str, Any] = {}
    for c in rubric.criteria:
        raw = post.get(f"score-{c.key}", "").strip()
        if raw:
            scores[c.key] = _number(raw)
    payload["scores"] = scores
    payload["findings"] = [
        {"location": r.location, "severity": r.severity, "note": r.note} for r in finding_rows(post)
    ]
    confidence = post.get("confidence", "").strip()
    if confidence:
        payload["confidence"] = _number(confidence)
    return payload


class RelayAnswerForm(forms.Form):
    answer = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 10, "spellcheck": "false", "class": "mono"}),
        max_length=200_000, strip=True,
        error_messages={"required": gettext_lazy("Paste the other chat's reply here.")},
    )
