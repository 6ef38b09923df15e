"""Calibration for managers: agreement with answer keys and peers (percent and Cohen's kappa)."""
from __future__ import annotations

import re

import pytest

from reviews.access import reviewer_for_user
from reviews.actions import bind_verdict
from reviews.calibration import calibration_report, cohen_kappa, percent_agreement
from tests.reviews.factories import verdict_for


def test_cohen_kappa_textbook_example():
    # 20 both pass, 5 pass/reject, 10 reject/pass, 15 both reject: po = .7, pe = .5 → κ = .4
    pairs = [("pass", "pass")] * 20 + [("pass", "reject")] * 5 + [("reject", "pass")] * 10 + [("reject", "reject")] * 15
    assert percent_agreement(pairs) == pytest.approx(0.7)
    assert cohen_kappa(pairs) == pytest.approx(0.4)


def test_kappa_is_undefined_without_variation_or_pairs():
    assert cohen_kappa([]) is None and percent_agreement([]) is None
    assert cohen_kappa([("pass", "pass")] * 3) is None
    assert cohen_kappa([("pass", "reject"), ("reject", "pass")]) == pytest.approx(-1.0)


def test_report_pairs_reviewers_with_keys_and_peers():
    decisions = [("a", 1, "pass"), ("b", 1, "pass"), ("a", 2, "reject"), ("b", 2, "pass"), ("c", 2, "pass")]
    report = {r.reviewer: r for r in calibration_report(decisions, {1: "pass", 2: "reject"})}
    assert (report["a"].key_pairs, report["a"].key_agreement) == (2, 1.0)
    assert (report["b"].key_pairs, report["b"].key_agreement) == (2, 0.5)
    assert (report["a"].peer_pairs, report["a"].peer_agreement) == (3, pytest.approx(1 / 3))
    assert (report["c"].peer_pairs, report["c"].peer_agreement, report["c"].key_agreement) == (2, 0.5, 0.0)


@pytest.mark.django_db
def test_calibration_page_is_for_managers_only(world, as_user):
    rounds = [("pass", "pass", "pass"), ("revise", "revise", "pass"), ("reject", "reject", "reject"), ("pass", "revise", "revise")]
    for expected, alice_says, bob_says in rounds:
        gate = world.gate(reviewers=["alice", "bob"], required_verdicts=2,
                          calibration={"expected_decision": expected, "answer_key": "the key"})
        for user, decision in (("alice", alice_says), ("bob", bob_says)):
            bind_verdict(reviewer_for_user(world.users[user]), gate.packet.id, verdict_for(gate, decision=decision), channel="page")
    # A pending packet's verdicts are not there yet: only submitted verdicts count.
    world.gate(reviewers=["alice", "bob"], required_verdicts=2, calibration={"expected_decision": "pass"})

    resp = as_user("mia").get("/reviews/calibration/")
    assert resp.status_code == 200
    html = resp.content.decode()

    def row(user: str) -> list[str]:
        match = re.search(rf'<tr data-reviewer="user:{world.users[user].id}">(.*?)</tr>', html, re.S)
        cells = re.findall(r"<td[^>]*>(.*?)</td>", match.group(1), re.S)
        return [c.strip() for c in cells]

    # name, verdicts, key n, key %, key κ, peer pairs, peer %, peer κ
    assert row("alice") == ["alice", "4", "4", "75%", "0.64", "4", "75%", row("alice")[7]]
    assert row("bob")[:4] == ["bob", "4", "4", "50%"]
    assert row("alice")[7] == row("bob")[7] != "—"  # peer kappa is symmetric
    assert "5 calibrated packets" in html and "8 verdicts" in html

    for reviewer in ("alice", "bob"):
        assert as_user(reviewer).get("/reviews/calibration/").status_code == 404
