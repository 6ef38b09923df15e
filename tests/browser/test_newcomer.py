"""What a newcomer trips on, walked in Chromium against a real daphne (docs/pages.md):

1. the overview never hides runtime status (the runtime badge of a failed and of a live session
   fully visible, role / task mode / last event not cut, the page using a 1920 px screen);
2. a manager's "Reviews" menu lists the project's review gates and their reviewers, and the
   project page counts the assigned reviewers;
3. the review-gate card says the session's own run number, as the timeline does;
4. event types in words, ids and fingerprints only under "details", a short session's timeline
   readable (distinct ends of the scale, no bar label cut to a letter);
5. the reviewer's confirmation, queue and refusals in the form's words; the demo rubric asks
   nothing of context the reviewer cannot see;
6. empty states that say what to do next, and no red "offline" badge when nothing is wrong;
7. ``examples/agent.py --pace`` slow enough to watch the waiting and failed states, saying that
   it plays the reviewer.

Screenshots go to tests/artifacts/newcomer-*.png.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone
from playwright.sync_api import expect

from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec, reconcile_expired_runtimes
from novelforge_sessions.models import Membership, RuntimeAttachment
from tests.browser.a11y import assert_no_serious_a11y_violations
from tests.browser.conftest import login, screenshot
from tests.reviews.factories import PASSWORD, make_world, orchestrator
from tests.support.factories import make_project
from tests.support.servers import ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)


def _session(project, family: str, *, role="specialist", task="drafting-the-second-chapter-with-continuity"):
    who = orchestrator(project)
    spec = sessions.NewSession(role=role, memory_policy="bounded", task_mode=task, runtime_family=family)
    return sessions.create_session(who, spec, runtime=RuntimeSpec(family, ["draft"], lease_seconds=600))


def _lost(project, family: str):
    """A session whose runtime stopped answering: ``failed / runtime_lost``, its runtime ``lost``."""
    s = _session(project, family)
    runs.start_run(orchestrator(project), s.id, cursor={"step": "draft"})
    RuntimeAttachment.objects.filter(session=s).update(lease_expires_at=timezone.now() - timedelta(seconds=5))
    reconcile_expired_runtimes()
    s.refresh_from_db()
    assert s.status == "failed"
    return s


# Every element that must not be clipped: its box inside each clipping ancestor's box up to the
# table card, and its own text not overflowing.
CLIPPED = """(el) => {
  const r = el.getBoundingClientRect();
  const out = [];
  if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== 'visible') out.push('own text overflows');
  for (let a = el.parentElement; a && !a.classList.contains('table-card'); a = a.parentElement) {
    const cs = getComputedStyle(a);
    if (cs.overflowX === 'visible' && cs.overflow === 'visible') continue;
    const b = a.getBoundingClientRect();
    if (r.left < b.left - 0.5 || r.right > b.right + 0.5 || r.top < b.top - 0.5 || r.bottom > b.bottom + 0.5)
      out.push('outside ' + a.tagName + '.' + a.className);
    if (a.scrollWidth > a.clientWidth + 1) out.push(a.tagName + '.' + a.className + ' overflows');
  }
  return out;
}"""


COLUMN = """(name) => 1 + [...document.querySelectorAll('table.sessions thead th')]
  .findIndex((th) => th.textContent.trim().toLowerCase() === name.toLowerCase())"""


@pytest.mark.parametrize("width,height", [(1366, 768), (1920, 1080)])
def test_1_the_overview_never_hides_runtime_status(server, browser, project, width, height):
    make_world(project)
    lost = _lost(project, "local-model-qwen2.5-coder-32b-instruct")
    live = _session(project, "claude-code-long-family-name")

    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    try:
        login(page, server, "mia", PASSWORD)
        for s, word in ((lost, "lost"), (live, "live")):
            row = page.locator(f"#session-{s.id}")
            badge = row.locator('[data-field="runtime-state"]')
            expect(badge).to_have_text(word)
            assert badge.evaluate(CLIPPED) == [], f"the {word} badge of session #{s.id} is clipped at {width} px"
            for header in ("Role", "Task mode", "Last event"):
                column = page.evaluate(COLUMN, header)
                problems = row.locator(f"td:nth-child({column})").evaluate(CLIPPED)
                assert problems == [], f"{header} of session #{s.id} is cut at {width} px: {problems}"
        assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
        if width == 1920:
            used = page.evaluate("document.querySelector('main').getBoundingClientRect().width")
            assert used > 1800, f"the page uses {used} px of a 1920 px window"
        screenshot(page, f"newcomer-1-overview-{width}")
    finally:
        context.close()


def test_2_a_managers_reviews_menu_lists_the_projects_gates_and_reviewers(server, page, project):
    world = make_world(project)
    gate = world.gate(reviewers=["alice"])
    login(page, server, "mia", PASSWORD)
    page.locator("nav.topnav").get_by_role("link", name="Reviews").click()
    page.wait_for_load_state("networkidle")
    body = page.locator("main")
    expect(body).not_to_contain_text("Nothing is waiting for you")
    item = page.locator(f'[data-gate-id="{gate.id}"]')
    expect(item).to_contain_text("alice")
    expect(body).to_contain_text(project.name)
    expect(item.get_by_role("link", name=re.compile(f"session #{world.writer.id}"))).to_be_visible()
    screenshot(page, "newcomer-2-manager-reviews")
    assert_no_serious_a11y_violations(page, "manager-gates")

    page.goto(f"{server.url}/projects/{project.id}/")
    stats = page.locator(".review-stats")
    expect(stats).to_contain_text("1 reviewer")
    expect(stats).not_to_contain_text("0 reviewers")
    screenshot(page, "newcomer-2-project")


def test_3_the_review_gate_card_says_the_sessions_own_run_number(server, page, project):
    # Other sessions' runs first, so run ids and per-session numbers differ.
    for _ in range(3):
        s = _session(project, "claude-code")
        runs.start_run(orchestrator(project), s.id, cursor={"step": "x"})
    world = make_world(project)
    assert world.run.seq == 1 and world.run.id != 1
    gate = world.gate()
    login(page, server, "mia", PASSWORD)
    page.goto(f"{server.url}/sessions/{world.writer.id}/")
    card = page.locator(f"#gate-{gate.id}")
    expect(card).to_contain_text("run #1")
    expect(card).not_to_contain_text(f"run #{world.run.id}")
    expect(page.locator('.tl-lane[data-run-label]').first).to_have_attribute("data-run-label", "run #1")
    screenshot(page, "newcomer-3-run-number")


RAW_TYPE = re.compile(r"\b[a-z]+(?:_[a-z]+)*\.[a-z_]+\b")


def test_4_manager_pages_speak_words_and_fold_ids_under_details(server, page, project):
    world = make_world(project)  # an artifact (with its fingerprint) and a run: events with ids
    done = _session(project, "claude-code", role="writer", task="drafting")
    run = runs.start_run(orchestrator(project), done.id, cursor={"step": "one"})
    runs.end_run(orchestrator(project), run.id, outcome="completed")
    sessions.close_session(orchestrator(project), done.id)
    login(page, server, "mia", PASSWORD)

    last = page.locator(f"#session-{world.writer.id} td.last")
    expect(last).not_to_be_empty()
    assert not RAW_TYPE.search(last.inner_text()), f"raw event type in the overview: {last.inner_text()!r}"

    feed = page.locator("#feed")
    expect(feed.locator(".ev").first).to_be_visible()
    shown = feed.inner_text()  # closed <details> are not rendered, so not in innerText
    expect(feed.locator(".ev-id:visible")).to_have_count(0)
    assert "sha256:" not in shown and "fingerprint=" not in shown, shown
    assert not RAW_TYPE.search(shown), f"raw event type in the feed: {shown!r}"
    details = feed.locator("details.ev-details").first
    details.locator("summary").click()
    expect(details).to_contain_text("#")
    screenshot(page, "newcomer-4-overview")

    page.goto(f"{server.url}/sessions/{done.id}/")
    scale = page.locator(".tl-scale > span")
    expect(scale).to_have_count(2)
    ends = scale.all_inner_texts()
    assert ends[0] != ends[1], f"the timeline's ends read the same: {ends}"
    cut = page.evaluate("""() => [...document.querySelectorAll('.tl-bar > span')]
        .filter((s) => s.offsetParent !== null && getComputedStyle(s).visibility !== 'hidden'
                && s.getBoundingClientRect().width > 0 && s.scrollWidth > s.parentElement.clientWidth + 1)
        .map((s) => s.textContent)""")
    assert cut == [], f"bar labels cut: {cut}"
    feed = page.locator("#feed").inner_text()
    assert not RAW_TYPE.search(feed), feed
    screenshot(page, "newcomer-4-session")


def test_5_the_reviewer_reads_the_forms_own_words(server, page, project):
    world = make_world(project)
    gate = world.gate(reviewers=["alice"])
    login(page, server, "alice", PASSWORD)
    row = page.locator(f'tr[data-packet-id="{gate.packet.id}"]')
    expect(row).to_contain_text("The lamp had not failed in forty years.")  # what is to be read
    expect(row).to_contain_text("4 lines")
    expect(row).to_contain_text("for you")  # for whom
    expect(row).to_contain_text(re.compile(r"waiting (for|since)", re.I))  # how long
    expect(row).not_to_contain_text("Packet #")
    screenshot(page, "newcomer-5-queue")

    page.goto(f"{server.url}/reviews/packets/{gate.packet.id}/")
    # Sent without a decision (the browser's own check switched off): the refusal uses the button's words.
    page.evaluate("document.querySelectorAll('input[name=decision]').forEach((i) => { i.required = false; })")
    page.click('label.pip:has(input[name="score-clarity"][value="4"])')
    page.click('label.pip:has(input[name="score-pacing"][value="6"])')
    page.get_by_label("Sure", exact=True).check()
    page.get_by_role("button", name="Submit review").click()
    refusal = page.locator('.field-error[data-field="decision"]')
    expect(refusal).to_contain_text("Needs revision")
    expect(page.locator(".refusal ul.plain")).to_contain_text("Pass, Needs revision or Reject")
    expect(page.locator(".refusal")).not_to_contain_text("pass, revise or reject")
    screenshot(page, "newcomer-5-refusal")

    page.get_by_label("Needs revision", exact=True).check()
    page.click('label.pip:has(input[name="score-clarity"][value="4"])')
    page.click('label.pip:has(input[name="score-pacing"][value="6"])')
    page.get_by_label("Sure", exact=True).check()
    page.get_by_role("button", name="Submit review").click()
    summary = page.locator("#confirmation .verdict-summary")
    expect(summary).to_contain_text("Needs revision")
    expect(summary).to_contain_text("Sure")
    expect(summary).not_to_contain_text("0.75")
    assert not re.search(r"\brevise\b", summary.inner_text()), summary.inner_text()
    screenshot(page, "newcomer-5-confirmation")


def test_5_the_demo_rubric_asks_only_what_the_packet_shows(server, page):
    call_command("load_demo", stdout=open(os.devnull, "w"))
    login(page, server, "reviewer", "reviewer-demo-pass")
    page.locator("table.queue tbody tr a").first.click()
    page.wait_for_load_state("networkidle")
    expect(page.locator("main")).not_to_contain_text("rest of the book")
    screenshot(page, "newcomer-5-demo-packet")


def test_6_empty_states_say_what_to_do_next(server, browser, page, project):
    get_user_model().objects.create_superuser("root", password=PASSWORD)
    login(page, server, "root", PASSWORD)
    main = page.locator("main")
    expect(main).to_contain_text("create_project")
    expect(page.locator("#conn.offline")).to_have_count(0)
    expect(main).not_to_contain_text("No sessions match these filters")
    screenshot(page, "newcomer-6-admin")

    # A manager of a fresh project: no session yet, and how the first one arrives.
    fresh = make_project("fresh-install")
    newcomer = get_user_model().objects.create_user("nia", password=PASSWORD)
    Membership.objects.create(user=newcomer, project=fresh, role=Membership.Role.MANAGER)
    context = browser.new_context(viewport={"width": 1366, "height": 768})
    other = context.new_page()
    try:
        login(other, server, "nia", PASSWORD)
        empty = other.locator("#session-rows tr.empty")
        expect(empty).to_contain_text("create_api_token")
        expect(empty).to_contain_text("agent")
        expect(other.locator("#conn")).to_have_text("live")
        screenshot(other, "newcomer-6-fresh")
    finally:
        context.close()


def test_7_the_example_agent_can_be_watched(server, page):
    call_command("load_demo", stdout=open(os.devnull, "w"))
    from novelforge_sessions.management.commands.load_demo import demo_token

    env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONPATH": str(ROOT),
           "DJANGO_SETTINGS_MODULE": "novelforge_sessions.settings", "NOVELFORGE_TOKEN": ""}
    reconciler = subprocess.Popen([sys.executable, "manage.py", "reconcile_runtimes", "--loop", "--interval", "0.5"],
                                  cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    login(page, server, "manager", "manager-demo-pass")
    page.goto(server.url + "/?family=example-agent")
    expect(page.locator("#conn")).to_have_text("live")
    agent = subprocess.Popen(
        [sys.executable, "examples/agent.py", "--url", server.url, "--token", demo_token(), "--lease", "2",
         "--pace", "3", "--timeout", "60"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        row = page.locator("#session-rows tr.srow").first
        badge = row.locator('[data-field="state"]')
        # The paused steps leave each state on screen long enough to be seen live.
        expect(badge).to_have_text("waiting for a person", timeout=60_000)
        screenshot(page, "newcomer-7-waiting")
        expect(badge).to_have_text("failed", timeout=60_000)
        screenshot(page, "newcomer-7-failed")
        out, _ = agent.communicate(timeout=180)
    finally:
        if agent.poll() is None:
            agent.kill()
        reconciler.terminate()
        reconciler.wait(timeout=30)
    assert agent.returncode == 0, out[-3000:]
    assert re.search(r"plays? the reviewer|playing the reviewer", out), out
