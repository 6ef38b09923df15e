"""``{% review_panel session %}`` shows the session's gates, their state and the bound verdicts."""
from __future__ import annotations

import pytest
from django.template import Context, Template

from reviews.access import reviewer_for_user
from reviews.actions import bind_verdict
from tests.reviews.factories import verdict_for

pytestmark = pytest.mark.django_db

PANEL = Template("{% load review_panels %}{% review_panel session %}")


def test_panel_without_gates():
    from novelforge_sessions.models import Session

    html = PANEL.render(Context({"session": Session(id=0)}))
    assert "No review gates." in html


def test_panel_shows_gate_state_and_bound_verdict(world):
    gate = world.gate(reviewers=["alice", "bob"], required_verdicts=1,
                      calibration={"expected_decision": "pass", "answer_key": "SECRET-KEY-IN-PANEL"})
    html = PANEL.render(Context({"session": world.writer}))
    assert f'id="gate-{gate.id}"' in html and 'data-state="pending"' in html
    assert "0 of 1 verdict bound" in html and html.count("no verdict yet") == 2

    verdict = bind_verdict(reviewer_for_user(world.users["alice"]), gate.packet.id,
                           verdict_for(gate, decision="reject"), channel="page").verdict
    html = PANEL.render(Context({"session": world.writer}))
    assert 'data-state="complete"' in html and '<span class="badge rv-complete">complete</span>' in html
    assert '<span class="badge dc-reject">reject</span>' in html
    assert "<td>alice</td>" in html and "clarity <strong>4</strong><span class=\"muted\">/5</span>" in html and "0.70" in html
    assert f'title="{verdict.fingerprint}"' in html and 'data-channel="page">via the reviewer page<' in html
    assert "chapter-01 v1" in html and f'title="{gate.packet.fingerprint}"' in html
    assert "no verdict yet" in html  # bob's slot
    assert "SECRET-KEY-IN-PANEL" not in html  # calibration stays on the calibration page
