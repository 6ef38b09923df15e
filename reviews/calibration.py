"""Reviewer calibration: agreement with answer keys and with peers (pure; no Django).

Only *submitted* verdicts are counted, and the report is for managers only (views check it):
a reviewer never sees calibration answers or peers' decisions.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from reviews.packets import DECISIONS


def percent_agreement(pairs: Sequence[tuple[str, str]]) -> float | None:
    if not pairs:
        return None
    return sum(1 for a, b in pairs if a == b) / len(pairs)


def cohen_kappa(pairs: Sequence[tuple[str, str]], categories: Sequence[str] = DECISIONS) -> float | None:
    """Cohen's kappa of two raters over paired labels.

    ``None`` when undefined: no pairs, or chance agreement is already 1 (both raters used a
    single, identical category throughout — agreement is then not informative).
    """
    n = len(pairs)
    if n == 0:
        return None
    observed = sum(1 for a, b in pairs if a == b) / n
    left = {c: 0 for c in categories}
    right = {c: 0 for c in categories}
    for a, b in pairs:
        left[a] = left.get(a, 0) + 1
        right[b] = right.get(b, 0) + 1
    expected = sum(left[c] * right.get(c, 0) for c in left) / (n * n)
    if expected >= 1.0:
        return None
    return (observed - expected) / (1 - expected)


@dataclass(frozen=True)
class ReviewerCalibration:
    reviewer: str
    verdicts: int
    key_pairs: int
    key_agreement: float | None
    key_kappa: float | None
    peer_pairs: int
    peer_agreement: float | None
    peer_kappa: float | None


def calibration_report(
    decisions: Iterable[tuple[str, int, str]], expected: Mapping[int, str]
) -> list[ReviewerCalibration]:
    """``decisions``: (reviewer, packet_id, decision) of submitted verdicts;
    ``expected``: packet_id → expected decision (from the hidden calibration material)."""
    by_packet: dict[int, dict[str, str]] = defaultdict(dict)
    by_reviewer: dict[str, dict[int, str]] = defaultdict(dict)
    for reviewer, packet_id, decision in decisions:
        by_packet[packet_id][reviewer] = decision
        by_reviewer[reviewer][packet_id] = decision
    report = []
    for reviewer in sorted(by_reviewer):
        mine = by_reviewer[reviewer]
        key_pairs = [(d, expected[p]) for p, d in mine.items() if expected.get(p)]
        peer_pairs = [
            (d, other_decision)
            for p, d in mine.items()
            for other, other_decision in by_packet[p].items()
            if other != reviewer
        ]
        report.append(
            ReviewerCalibration(
                reviewer=reviewer,
                verdicts=len(mine),
                key_pairs=len(key_pairs),
                key_agreement=percent_agreement(key_pairs),
                key_kappa=cohen_kappa(key_pairs),
                peer_pairs=len(peer_pairs),
                peer_agreement=percent_agreement(peer_pairs),
                peer_kappa=cohen_kappa(peer_pairs),
            )
        )
    return report
