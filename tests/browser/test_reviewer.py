"""A human reviewer in headless Chromium (1366×768) against a real daphne: the queue, a packet,
the form generated from the rubric (plain words, score anchors, required fields caught by the
browser, finding lines checked in the browser and by the server), the relay (a fenced answer
accepted, a two-object answer refused), the confirmation with the way on, and axe-core on every
reviewer page (0 serious or critical violations).

Screenshots land in tests/artifacts/ (reviewer-*.png) for a person to look at; axe's full
findings per page in tests/artifacts/a11y-reviewer-*.json.
"""
from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from novelforge_sessions.actions.runs import start_run
from novelforge_sessions.apikit.auth import caller_for_token
from reviews.actions import GateSpec, open_gate
from reviews.models import Verdict
from tests.browser.a11y import assert_no_serious_a11y_violations
from tests.browser.conftest import login, screenshot
from tests.reviews.factories import PASSWORD, RUBRIC, add_writer, citing, make_world, orchestrator

pytestmark = pytest.mark.django_db(transaction=True)

ANCHORED = {"criteria": [
    {"key": "clarity", "label": "Clarity", "scale": {"min": 1, "max": 5}, "description": "Can a reader follow every sentence?",
     "anchors": {"1": "Confusing", "3": "Mostly clear", "5": "Crystal clear"}},
    {"key": "pacing", "label": "Pacing", "scale": {"min": 0, "max": 10}, "description": "Does the scene move?",
     "anchors": {"0": "Drags", "10": "Races"}},
]}


def posts(page) -> list[str]:
    """Every POST the page sends, recorded from now on."""
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if r.method == "POST" else None)
    return sent


def second_gate(world, *, route: str = "page", reviewers=("alice",)):
    """A gate of another writer session of the project (a session waits on one gate at a time)."""
    writer2, raw = add_writer(world.project)
    start_run(orchestrator(world.project), writer2.id, frozen_inputs=citing(world.version))
    return open_gate(caller_for_token(raw), writer2.id,
                     GateSpec(candidate_version_id=world.version.id, rubric=RUBRIC, route=route, reviewers=list(reviewers)))


def fill_valid(page, *, decision: str = "revise") -> None:
    page.check(f'input[name="decision"][value="{decision}"]')
    page.click('label.pip:has(input[name="score-clarity"][value="4"])')
    page.click('label.pip:has(input[name="score-pacing"][value="7"])')
    page.get_by_label("Sure", exact=True).check()


def test_reviewer_reads_a_packet_and_submits_a_review(server, page, project):
    world = make_world(project)
    gate = world.gate(route="page", reviewers=["alice"])
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)

    login(page, server, "alice", PASSWORD)
    page.goto(server.url + "/reviews/")
    row = page.locator(f'tr[data-packet-id="{gate.packet.id}"]')
    assert row.is_visible()
    assert "waiting for your review" in row.inner_text() and "Reviewer page" in row.inner_text()
    assert "sha256:" not in page.locator("main").inner_text()  # no fingerprints in the queue
    screenshot(page, "reviewer-queue")
    assert_no_serious_a11y_violations(page, "reviewer-queue")

    row.get_by_role("link", name="Review").click()
    page.wait_for_url(re.compile(rf"/reviews/packets/{gate.packet.id}/$"))
    assert page.locator("#L2").inner_text().startswith("Tonight it flickered twice")
    assert page.locator("ol.candidate li").count() == 4
    assert page.get_by_role("heading", name="Rubric").is_visible()
    assert page.get_by_role("heading", name="How to review").is_visible()
    # Plain words: the button, the decision, the confidence levels; no "Bind", no "Severity..".
    main = page.locator("main").inner_text()
    assert "Bind" not in main and "Severity.." not in main and "validation_error" not in main
    expect(page.get_by_role("button", name="Submit review")).to_be_visible()
    expect(page.get_by_label("Needs revision")).to_be_visible()
    expect(page.get_by_label("Fairly sure")).to_be_visible()
    expect(page.locator('select[name="finding-0-severity"] option').first).to_have_text("Choose…")
    # Fingerprints out of the way: hidden until "Technical details" is opened; copy still works.
    copy = page.locator(f'button.copy[data-copy="{gate.packet.fingerprint}"]')
    expect(copy).to_be_hidden()
    page.get_by_text("Technical details (fingerprints)").click()
    copy.click()
    assert page.evaluate("navigator.clipboard.readText()") == gate.packet.fingerprint
    screenshot(page, "reviewer-packet")
    assert_no_serious_a11y_violations(page, "reviewer-packet")

    fill_valid(page)
    page.fill('input[name="finding-0-location"]', "L2")
    page.select_option('select[name="finding-0-severity"]', "minor")
    page.fill('input[name="finding-0-note"]', "'the seconds between' — between what?")
    page.click("#add-finding")  # JS adds a row; an empty row is ignored on submit
    assert page.locator(".finding-row").count() == 2
    assert page.locator('input[name="finding-1-location"]').is_visible()
    page.get_by_role("button", name="Remove finding 2").click()
    assert page.locator(".finding-row").count() == 1
    page.get_by_role("button", name="Submit review").click()

    confirmation = page.locator("#confirmation")
    confirmation.wait_for()
    text = confirmation.inner_text()
    short = f"{gate.packet.fingerprint[:11]}…{gate.packet.fingerprint[-4:]}"
    assert re.search(r"Review submitted", text) and re.search(r"recorded at \d\d:\d\d UTC", text), text
    assert f"Bound to {short}" in text
    assert "Needs revision" in text and "between what?" in text  # the decision in the form's words
    assert page.locator("form.verdict-form").count() == 0
    expect(page.locator("#back-to-queue")).to_have_text("Back to the review queue")
    expect(page.locator("#no-next")).to_have_text("No other packet is waiting for you.")
    screenshot(page, "reviewer-confirmation")
    assert_no_serious_a11y_violations(page, "reviewer-confirmation")

    verdict = Verdict.objects.get()
    assert (verdict.decision, verdict.scores, verdict.confidence, verdict.channel) == (
        "revise", {"clarity": 4, "pacing": 7}, 0.75, "page")
    assert verdict.packet_fingerprint == gate.packet.fingerprint
    world.refresh()
    assert world.writer.status == "running"

    page.locator("#back-to-queue").click()
    page.wait_for_url(server.url + "/reviews/")
    assert page.locator(f'tr[data-packet-id="{gate.packet.id}"] .badge').inner_text() == "review submitted"


def test_anchors_are_shown_and_the_browser_catches_missing_scores(server, page, project):
    world = make_world(project)
    gate = world.gate(route="page", reviewers=["alice"], rubric=ANCHORED)
    login(page, server, "alice", PASSWORD)
    page.goto(f"{server.url}/reviews/packets/{gate.packet.id}/")

    clarity = page.locator('fieldset[data-criterion="clarity"]')
    for score, word in [("1", "Confusing"), ("3", "Mostly clear"), ("5", "Crystal clear")]:
        pip = clarity.locator(f'label.pip:has(input[value="{score}"])')
        expect(pip.locator(".anchor")).to_have_text(word)
        number, anchor = pip.locator(".pip-n").bounding_box(), pip.locator(".anchor").bounding_box()
        assert anchor["y"] >= number["y"] + number["height"] - 1, "the anchor sits under its number"
    expect(clarity.locator('label.pip:has(input[value="2"]) .anchor')).to_have_count(0)
    expect(page.locator('fieldset[data-criterion="pacing"] label.pip:has(input[value="10"]) .anchor')).to_have_text("Races")
    expect(page.locator('.rubric .anchors[data-criterion="clarity"]')).to_have_text(
        "1 = Confusing, 3 = Mostly clear, 5 = Crystal clear")
    expect(page.get_by_role("radio", name="1 Confusing")).to_have_count(1)  # the anchor is part of the name
    # Required fields are marked.
    expect(page.locator('fieldset[data-criterion="clarity"] legend .req')).to_have_text("*")
    screenshot(page, "reviewer-anchors")
    assert_no_serious_a11y_violations(page, "reviewer-anchors")

    # Submit with only a decision: the browser stops it (no request), naming the first missing score.
    sent = posts(page)
    page.check('input[name="decision"][value="pass"]')
    page.get_by_role("button", name="Submit review").click()
    invalid = page.evaluate("[...document.querySelectorAll('form.verdict-form :invalid')].map(e => e.name)")
    assert {"score-clarity", "score-pacing", "confidence"} <= set(invalid) and "decision" not in invalid, invalid
    message = page.locator('input[name="score-clarity"]').first.evaluate("e => e.validationMessage")
    assert message, "the browser explains the missing score"
    assert sent == [] and page.url.endswith(f"/reviews/packets/{gate.packet.id}/")
    screenshot(page, "reviewer-required-caught")
    assert Verdict.objects.count() == 0


def test_an_out_of_range_finding_is_refused_in_the_browser_and_by_the_server(server, browser, page, project):
    world = make_world(project)
    gate = world.gate(route="page", reviewers=["alice"])
    login(page, server, "alice", PASSWORD)
    page.goto(f"{server.url}/reviews/packets/{gate.packet.id}/")
    sent = posts(page)
    fill_valid(page)
    page.fill('input[name="finding-0-location"]', "L99")
    page.select_option('select[name="finding-0-severity"]', "major")
    page.fill('input[name="finding-0-note"]', "Beyond the end")
    page.get_by_role("button", name="Submit review").click()
    location = page.locator('input[name="finding-0-location"]')
    assert location.evaluate("e => e.validationMessage") == "Line 99 is not in the candidate (it has 4 lines)."
    assert sent == [] and Verdict.objects.count() == 0
    screenshot(page, "reviewer-finding-out-of-range-browser")
    page.fill('input[name="finding-0-location"]', "L2-4")
    assert location.evaluate("e => e.validationMessage") == ""

    # JavaScript off: the browser cannot know the candidate's lines; the server refuses by name.
    nojs = browser.new_context(viewport={"width": 1366, "height": 768}, java_script_enabled=False)
    p2 = nojs.new_page()
    p2.set_default_timeout(10_000)
    try:
        login(p2, server, "alice", PASSWORD)
        p2.goto(f"{server.url}/reviews/packets/{gate.packet.id}/")
        fill_valid(p2)
        p2.fill('input[name="finding-0-location"]', "L99")
        p2.select_option('select[name="finding-0-severity"]', "major")
        p2.fill('input[name="finding-0-note"]', "Beyond the end")
        with p2.expect_response(lambda r: r.request.method == "POST") as resp:
            p2.get_by_role("button", name="Submit review").click()
        assert resp.value.status == 422
        refusal = p2.locator("#verdict-form .refusal")
        expect(refusal.locator(".plain")).to_have_text("Finding 1: Line 99 is not in the candidate (it has 4 lines).")
        expect(refusal).to_contain_text("Your review was not submitted yet.")
        expect(p2.locator('input[name="finding-0-location"]')).to_have_value("L99")  # kept
        expect(p2.locator('p.field-error[data-field="findings[0]"]')).to_be_visible()
        screenshot(p2, "reviewer-finding-out-of-range-server")
    finally:
        nojs.close()
    assert Verdict.objects.count() == 0

    # A refusal only the server can make, with JavaScript on (axe needs it): the page went stale.
    page.locator('input[name="packet_fingerprint"]').evaluate("(e) => { e.value = 'sha256:' + '9'.repeat(64); }")
    with page.expect_response(lambda r: r.request.method == "POST") as resp:
        page.get_by_role("button", name="Submit review").click()
    assert resp.value.status == 409
    expect(page.locator("#verdict-form .refusal .plain")).to_have_text(
        "This page is out of date: the text under review changed. Reload the page and review it again.")
    expect(page.locator('input[name="finding-0-location"]')).to_have_value("L2-4")
    screenshot(page, "reviewer-refusal")
    assert_no_serious_a11y_violations(page, "reviewer-refusal")
    assert Verdict.objects.count() == 0
    world.refresh()
    assert world.writer.status == "awaiting_user"


def _answer(prompt: str, **over) -> dict:
    schema = json.loads(prompt.split("== JSON SCHEMA OF YOUR ANSWER ==\n", 1)[1].split("\n\n== ", 1)[0])
    answer = {
        "packet_fingerprint": re.search(r"packet_fingerprint:\s+(\S+)", prompt).group(1),
        "artifact_fingerprint": schema["properties"]["artifact_fingerprint"]["const"],
        "decision": "pass",
        "scores": {k: s["minimum"] for k, s in schema["properties"]["scores"]["properties"].items()},
        "findings": [{"location": "L4", "severity": "minor", "note": "A strong closing image."}],
        "confidence": 0.6,
    }
    answer.update(over)
    return answer


def test_relay_a_two_object_answer_is_refused_a_fenced_one_accepted(server, page, project):
    """The relay as a chat really answers: copy the prompt (clipboard), paste back a reply with
    two JSON blocks (refused: exactly one), one with a wrong score (the field is named in plain
    words), then one ```json block with prose around it (accepted, and the page says what it read)."""
    world = make_world(project)
    gate = world.gate(route="relay", reviewers=["bob"])
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    login(page, server, "bob", PASSWORD)
    page.goto(f"{server.url}/reviews/packets/{gate.packet.id}/")
    expect(page.get_by_role("heading", name="Ask another chat to review it")).to_be_visible()
    assert_no_serious_a11y_violations(page, "reviewer-relay")
    page.get_by_role("button", name="Copy prompt for another chat").click()
    prompt = page.evaluate("navigator.clipboard.readText()")
    assert gate.packet.fingerprint in prompt and "== JSON SCHEMA OF YOUR ANSWER ==" in prompt
    submit = page.get_by_role("button", name="Check and submit the reply")

    two = ("Here is my review:\n```json\n" + json.dumps(_answer(prompt)) + "\n```\nOn reflection, maybe:\n```json\n"
           + json.dumps(_answer(prompt, decision="revise")) + "\n```")
    page.fill("#id_answer", two)
    submit.click()
    refusal = page.locator("#relay .refusal")
    refusal.wait_for()
    expect(refusal.locator(".plain")).to_have_text(
        "The answer contains 2 JSON objects (starting on lines 3, 7); it must contain exactly one. Paste only the verdict object.")
    expect(refusal).to_have_attribute("data-code", "malformed_body")
    screenshot(page, "reviewer-relay-two-objects-refused")
    assert Verdict.objects.count() == 0

    wrong = _answer(prompt, scores={"clarity": 6, "pacing": 1})
    page.fill("#id_answer", "```json\n" + json.dumps(wrong, indent=2) + "\n```")
    submit.click()
    refusal = page.locator("#relay .refusal")
    refusal.wait_for()
    expect(refusal.locator(".plain")).to_have_text("Please give Clarity a whole-number score from 1 to 5.")
    expect(refusal.locator(".extracted")).to_contain_text("Checked one JSON object from the ```json block (lines 2–")
    refusal.get_by_text("Technical details").click()
    expect(refusal).to_contain_text("scores.clarity 6 is outside the scale 1..5")
    screenshot(page, "reviewer-relay-refusal")
    assert_no_serious_a11y_violations(page, "reviewer-relay-refusal")
    assert Verdict.objects.count() == 0

    reply = ("Thanks for the chapter! Here's my structured review.\n\n```json\n" + json.dumps(_answer(prompt), indent=2) +
             "\n```\n\nThe ending {the sea image} works well.")
    page.fill("#id_answer", reply)
    submit.click()
    confirmation = page.locator("#confirmation")
    confirmation.wait_for()
    expect(confirmation).to_contain_text("from the other chat's reply")
    expect(confirmation.locator(".extracted")).to_contain_text("Read one JSON object from the ```json block (lines 4–")
    screenshot(page, "reviewer-relay-fenced-accepted")
    verdict = Verdict.objects.get()
    assert (verdict.channel, verdict.decision, verdict.findings[0]["location"]) == ("relay", "pass", "L4")
    world.refresh()
    assert world.writer.status == "running"


def test_after_a_review_the_next_packet_and_the_queue(server, page, project):
    world = make_world(project)
    first = world.gate(route="page", reviewers=["alice"])
    second = second_gate(world, route="page")
    login(page, server, "alice", PASSWORD)
    page.goto(f"{server.url}/reviews/packets/{first.packet.id}/")
    fill_valid(page, decision="pass")
    page.get_by_role("button", name="Submit review").click()
    page.locator("#confirmation").wait_for()
    nxt = page.locator("#next-packet")
    expect(nxt).to_have_text(f"Next packet (#{second.packet.id})")
    expect(page.locator("#back-to-queue")).to_be_visible()
    expect(page.locator("#confirmation")).to_be_focused()  # announced and reachable from the keyboard
    page.keyboard.press("Tab")
    expect(nxt).to_be_focused()  # the next step is the first thing the keyboard reaches
    screenshot(page, "reviewer-next-packet")
    nxt.click()
    page.wait_for_url(re.compile(rf"/reviews/packets/{second.packet.id}/$"))
    expect(page.get_by_role("button", name="Submit review")).to_be_visible()
    page.get_by_role("link", name="Review queue").first.click()
    page.wait_for_url(server.url + "/reviews/")
    expect(page.locator(f'tr[data-packet-id="{second.packet.id}"] .badge')).to_have_text("waiting for your review")
    expect(page.locator(f'tr[data-packet-id="{first.packet.id}"] .badge')).to_have_text("review submitted")


def test_the_calibration_page_is_accessible(server, page, project):
    world = make_world(project)
    world.gate(reviewers=["alice"])
    login(page, server, "mia", PASSWORD)
    page.goto(server.url + "/reviews/calibration/")
    expect(page.locator("h1")).to_have_text("Reviewer calibration")
    screenshot(page, "reviewer-calibration")
    assert_no_serious_a11y_violations(page, "reviewer-calibration")


def test_a_reviewer_who_follows_a_dead_link_reads_plain_words(server, page, project):
    make_world(project)
    login(page, server, "alice", PASSWORD)
    response = page.goto(server.url + "/reviews/packets/987654/")
    assert response.status == 404
    assert page.get_by_role("heading", name="Page not found").is_visible()
    assert "not a member" in page.locator("main").inner_text()
    page.get_by_role("link", name="Back to the start page").click()  # the way out works
    page.wait_for_url(re.compile(r"/reviews/$|/$"))
    page.goto(server.url + "/reviews/packets/987654/")
    screenshot(page, "error-404")
    assert_no_serious_a11y_violations(page, "error-404")
