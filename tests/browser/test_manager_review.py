"""A review end to end, seen by the manager: a writer session opens a page-route review gate
through the agent API; a reviewer logs in (landing on the queue), binds a verdict through the
form and sees the confirmation; the manager — whose session page was open the whole time —
sees the verdict (decision and bound fingerprints) arrive in the review panel without a
reload, and the session back to ``running``. A plain reload shows the same truth.

Screenshots (1366×768 viewport, full page): manager-review-waiting.png,
manager-review-reviewer-queue.png, manager-review-confirmation.png, manager-review-bound.png.
"""
from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import expect

from reviews.models import ReviewGate, Verdict
from tests.browser.conftest import login, screenshot
from tests.reviews.factories import PASSWORD, RUBRIC, make_world

pytestmark = pytest.mark.django_db(transaction=True)


def short(fp: str) -> str:
    return f"{fp[:11]}…{fp[-4:]}"


def test_a_verdict_bound_by_a_reviewer_reaches_the_managers_session_page(server, browser, page, project):
    world = make_world(project)  # writer session (running, open run), reviewers alice/bob, manager mia

    # The writer's run opens the gate through the agent API, with its own session-bound token.
    resp = httpx.post(
        f"{server.url}/api/v1/sessions/{world.writer.id}/review-gates",
        json={"candidate_version_id": world.version.id, "rubric": RUBRIC, "route": "page", "reviewers": ["alice"]},
        headers={"Authorization": f"Bearer {world.writer_api.token}"}, timeout=15,
    )
    assert resp.status_code == 201, resp.text
    gate = ReviewGate.objects.select_related("packet").get(id=resp.json()["id"])
    world.refresh()
    assert world.writer.status == "awaiting_user"

    # The manager watches the writer's session page.
    manager = browser.new_context(viewport={"width": 1366, "height": 768})
    mpage = manager.new_page()
    mpage.set_default_timeout(10_000)
    try:
        login(mpage, server, "mia", PASSWORD)
        assert mpage.url == server.url + "/", "a manager lands on the dashboard"
        mpage.get_by_role("link", name=f"#{world.writer.id}", exact=True).click()
        mpage.wait_for_url(re.compile(rf"/sessions/{world.writer.id}/$"))
        expect(mpage.locator("#conn")).to_have_text("live")
        mpage.evaluate("window.__sameDocument = true")
        expect(mpage.locator("#session-state")).to_have_text("waiting for a person")
        panel = mpage.locator(f"#gate-{gate.id}")
        expect(panel).to_have_attribute("data-state", "pending")
        expect(panel.locator("tbody tr").first).to_contain_text("no verdict yet")
        expect(mpage.locator(f'.tl-flag[data-gate-id="{gate.id}"]')).to_have_attribute("data-state", "pending")
        screenshot(mpage, "manager-review-waiting")

        # The reviewer logs in and lands on the queue (they manage nothing).
        login(page, server, "alice", PASSWORD)
        assert page.url == server.url + "/reviews/"
        expect(page.locator("nav.topnav")).to_contain_text("Reviews")
        row = page.locator(f'tr[data-packet-id="{gate.packet.id}"]')
        expect(row).to_contain_text("waiting for your review")
        screenshot(page, "manager-review-reviewer-queue")
        row.get_by_role("link", name="Review").click()
        page.wait_for_url(re.compile(rf"/reviews/packets/{gate.packet.id}/$"))
        page.check('input[name="decision"][value="pass"]')
        page.click('label.pip:has(input[name="score-clarity"][value="5"])')
        page.click('label.pip:has(input[name="score-pacing"][value="8"])')
        page.get_by_label("Certain", exact=True).check()
        page.get_by_role("button", name="Submit review").click()
        confirmation = page.locator("#confirmation")
        confirmation.wait_for()
        expect(confirmation).to_contain_text(f"Bound to {short(gate.packet.fingerprint)}")
        screenshot(page, "manager-review-confirmation")

        verdict = Verdict.objects.get(packet=gate.packet)
        assert (verdict.decision, verdict.channel, verdict.packet_fingerprint) == ("pass", "page", gate.packet.fingerprint)

        # Without a reload, the manager's page shows the verdict and the session running again.
        expect(mpage.locator("#session-state")).to_have_text("running")
        expect(panel).to_have_attribute("data-state", "complete")
        bound = panel.locator(f'tr[data-assignment-id="{verdict.assignment_id}"]')
        expect(bound.locator(".badge.dc-pass")).to_have_text("pass")
        expect(bound).to_contain_text("via the reviewer page")
        expect(bound.locator("code.fp")).to_have_attribute("title", verdict.fingerprint)
        expect(panel.locator(f'code.fp[title="{gate.packet.fingerprint}"]')).to_have_count(1)
        expect(panel.locator(f'code.fp[title="{gate.candidate_fingerprint}"]')).to_have_count(1)
        expect(mpage.locator(f'.tl-flag[data-gate-id="{gate.id}"]')).to_have_attribute("data-state", "complete")
        expect(mpage.locator("#feed .ev").first).to_contain_text("waiting for a person → running")
        assert mpage.evaluate("window.__sameDocument") is True, "no reload happened"
        mpage.locator(f"#gate-{gate.id}").scroll_into_view_if_needed()
        screenshot(mpage, "manager-review-bound")

        # A plain reload (JavaScript or not) shows the same truth.
        mpage.reload()
        expect(mpage.locator("#session-state")).to_have_text("running")
        expect(mpage.locator(f"#gate-{gate.id} .badge.dc-pass").first).to_have_text("pass")
    finally:
        manager.close()
    world.refresh()
    assert world.writer.status == "running" and world.run.state == "open"
