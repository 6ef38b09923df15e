"""Content-Security-Policy in Chromium: every page works under the strict
policy with no violation in the console (the autouse ``no_csp_violations`` fixture of conftest.py
fails any browser test that sees one), the timeline's geometry is applied without style
attributes, Swagger UI renders at /api/docs, and the watcher does catch a violation."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser import conftest
from tests.browser.conftest import login
from tests.reviews.factories import PASSWORD, make_world

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_watcher_reports_a_refused_inline_handler(server, page):
    page.goto(server.url + "/login/")
    with page.expect_console_message(lambda m: "Content Security Policy violation" in m.text):
        page.evaluate("""document.body.insertAdjacentHTML("beforeend", '<img src="/nothing.png" onerror="window.__ran = 1">')""")
    assert page.evaluate("window.__ran") is None, "the policy let an inline handler run"
    found = conftest.csp_violations()
    assert found and any("Refused to" in m or "Content Security Policy" in m for m in found), conftest.console_log
    conftest.console_log.clear()  # expected here: the autouse check must not fail this test


def test_every_page_works_under_the_policy(server, browser, page, project):
    world = make_world(project)  # writer session with an open run, reviewers alice/bob, manager mia
    gate = world.gate(reviewers=["alice"])

    page.goto(server.url + "/api/docs")
    expect(page.locator(".swagger-ui .info .title")).to_be_visible()
    expect(page.locator(".opblock").first).to_be_visible()

    page.goto(server.url + "/login/")
    login(page, server, "mia", PASSWORD)
    expect(page.locator("#conn")).to_have_text("live")  # the websocket connected (connect-src)
    page.goto(server.url + f"/sessions/{world.writer.id}/")
    expect(page.locator("#conn")).to_have_text("live")
    bar = page.locator(".tl-bar[data-left]").first
    expect(bar).to_be_visible()
    style = bar.evaluate("(n) => [n.dataset.left, n.style.left, n.dataset.width, n.style.width]")
    # The script applied the data attributes as percentages (the browser serialises "0.10%" as
    # "0.1%": compare the numbers).
    assert style[1].endswith("%") and style[3].endswith("%"), style
    assert float(style[1][:-1]) == float(style[0]) and float(style[3][:-1]) == float(style[2]), style
    page.goto(server.url + f"/projects/{world.project.id}/")
    expect(page.locator("h1")).to_be_visible()
    page.goto(server.url + "/reviews/calibration/")
    expect(page.locator("h1")).to_be_visible()

    reviewer = browser.new_context(viewport={"width": 1366, "height": 768})
    rpage = reviewer.new_page()
    rpage.set_default_timeout(10_000)
    try:
        login(rpage, server, "alice", PASSWORD)
        rpage.goto(server.url + "/reviews/")
        expect(rpage.locator(f'[data-packet-id="{gate.packet.id}"]')).to_be_visible()
        rpage.goto(server.url + f"/reviews/packets/{gate.packet.id}/")
        expect(rpage.locator("form")).not_to_have_count(0)
        rpage.wait_for_load_state("networkidle")
    finally:
        reviewer.close()
    assert conftest.csp_violations() == []
    assert not [m for m in conftest.console_log if m.startswith("pageerror")], conftest.console_log
