"""A human reviewer in headless Chromium: log in, open the queue, read a packet, submit a
verdict through the form generated from the rubric, and see the confirmation.

Screenshots land in tests/artifacts/ (reviewer-queue.png, reviewer-packet.png,
reviewer-confirmation.png) for a person to look at.
"""
from __future__ import annotations

import re

import pytest

from reviews.models import Verdict
from tests.browser.conftest import login, screenshot
from tests.reviews.factories import PASSWORD, make_world

pytestmark = pytest.mark.django_db(transaction=True)


def test_reviewer_reads_a_packet_and_binds_a_verdict(server, page, project):
    world = make_world(project)
    gate = world.gate(route="page", reviewers=["alice"])
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)

    login(page, server, "alice", PASSWORD)
    page.goto(server.url + "/reviews/")
    row = page.locator(f'tr[data-packet-id="{gate.packet.id}"]')
    assert row.is_visible()
    assert "awaiting your verdict" in row.inner_text() and "Reviewer page" in row.inner_text()
    screenshot(page, "reviewer-queue")

    row.get_by_role("link", name="Review").click()
    page.wait_for_url(re.compile(rf"/reviews/packets/{gate.packet.id}/$"))
    assert page.locator("#L2").inner_text().startswith("Tonight it flickered twice")
    assert page.locator("ol.candidate li").count() == 4
    assert page.get_by_role("heading", name="Rubric").is_visible()
    # Copy the packet fingerprint (the whole value, not the short form shown).
    page.locator(f'button.copy[data-copy="{gate.packet.fingerprint}"]').click()
    assert page.evaluate("navigator.clipboard.readText()") == gate.packet.fingerprint
    screenshot(page, "reviewer-packet")

    page.check('input[name="decision"][value="revise"]')
    page.click('label.pip:has(input[name="score-clarity"][value="4"])')
    page.click('label.pip:has(input[name="score-pacing"][value="7"])')
    page.fill('input[name="finding-0-location"]', "L2")
    page.select_option('select[name="finding-0-severity"]', "minor")
    page.fill('input[name="finding-0-note"]', "'the seconds between' — between what?")
    page.click("#add-finding")  # JS adds a row; an empty row is ignored on submit
    assert page.locator(".finding-row").count() == 2
    assert page.locator('input[name="finding-1-location"]').is_visible()
    page.locator(".finding-row").nth(1).get_by_role("button", name="Remove this finding").click()
    assert page.locator(".finding-row").count() == 1
    page.fill("#id_confidence", "0.75")
    page.get_by_role("button", name="Bind verdict").click()

    confirmation = page.locator("#confirmation")
    confirmation.wait_for()
    text = confirmation.inner_text()
    short = f"{gate.packet.fingerprint[:11]}…{gate.packet.fingerprint[-4:]}"
    assert re.search(rf"Bound to {re.escape(short)} \(packet\) and .* at \d\d:\d\d UTC", text), text
    assert "revise" in text and "between what?" in text
    assert page.locator("form.verdict-form").count() == 0
    screenshot(page, "reviewer-confirmation")

    verdict = Verdict.objects.get()
    assert (verdict.decision, verdict.scores, verdict.confidence, verdict.channel) == (
        "revise", {"clarity": 4, "pacing": 7}, 0.75, "page")
    assert verdict.packet_fingerprint == gate.packet.fingerprint
    world.refresh()
    assert world.writer.status == "running"

    page.goto(server.url + "/reviews/")
    assert page.locator(f'tr[data-packet-id="{gate.packet.id}"] .badge').inner_text() == "verdict bound"


def test_relay_in_the_browser_copy_prompt_paste_answer(server, page, project):
    """The relay: copy the prompt (clipboard), answer as another chat would, paste it back —
    first with a wrong score (the field is named), then correctly (bound)."""
    import json

    world = make_world(project)
    gate = world.gate(route="relay", reviewers=["bob"])
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    login(page, server, "bob", PASSWORD)
    page.goto(f"{server.url}/reviews/packets/{gate.packet.id}/")
    page.get_by_role("button", name="Copy prompt for another chat").click()
    prompt = page.evaluate("navigator.clipboard.readText()")
    assert gate.packet.fingerprint in prompt and "== JSON SCHEMA OF YOUR ANSWER ==" in prompt

    schema = json.loads(prompt.split("== JSON SCHEMA OF YOUR ANSWER ==\n", 1)[1].split("\n\n== ", 1)[0])
    answer = {
        "packet_fingerprint": re.search(r"packet_fingerprint:\s+(\S+)", prompt).group(1),
        "artifact_fingerprint": schema["properties"]["artifact_fingerprint"]["const"],
        "decision": "pass",
        "scores": {k: s["maximum"] + 1 for k, s in schema["properties"]["scores"]["properties"].items()},
        "findings": [],
        "confidence": 0.6,
    }
    page.fill("#id_answer", json.dumps(answer))
    page.get_by_role("button", name="Validate and bind").click()
    refusal = page.locator("#relay .refusal")
    refusal.wait_for()
    assert "scores.clarity" in refusal.inner_text() and "outside the scale 1..5" in refusal.inner_text()
    screenshot(page, "reviewer-relay-refusal")

    answer["scores"] = {k: s["minimum"] for k, s in schema["properties"]["scores"]["properties"].items()}
    page.fill("#id_answer", json.dumps(answer))
    page.get_by_role("button", name="Validate and bind").click()
    page.locator("#confirmation").wait_for()
    assert "via relay" in page.locator("#confirmation").inner_text()
    screenshot(page, "reviewer-relay-bound")
    assert Verdict.objects.get().channel == "relay"
    world.refresh()
    assert world.writer.status == "running"
