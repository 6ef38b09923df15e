"""Manager pages, in headless Chromium against a real daphne: the overview fits
1366 px (asserted from the DOM) with a "waiting for" column, the timeline's labels never
overlap (bounding boxes, pairwise), a conflict resolved from the page, an expired runtime shown
as expired on both pages, the charts present and updating live, and axe-core finding no serious
or critical violation on any manager page. Screenshots go to tests/artifacts/."""
from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import expect

from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec, reconcile_expired_runtimes
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.control import checkpoints
from novelforge_sessions.control.handoffs import claim_handoff, create_handoff
from novelforge_sessions.control.models import Handoff
from novelforge_sessions.control.results import deliver_result
from novelforge_sessions.errors import ConflictingResult
from novelforge_sessions.models import Event, Membership, RuntimeAttachment
from tests.browser.a11y import assert_no_serious_a11y_violations
from tests.browser.conftest import login, screenshot
from tests.support.factories import caller_for, make_project

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "orchard-in-winter-light"


class Day:
    """One project of a manager, sessions in every kind of wait, long values, a busy run."""

    def __init__(self) -> None:
        self.project = make_project("winter-orchard", name="The Winter Orchard: a novel in four seasons")
        self.user = get_user_model().objects.create_user("mara", password=PASSWORD)
        Membership.objects.create(user=self.user, project=self.project, role=Membership.Role.MANAGER)
        _, self.token = create_token(self.project, name="agent", permissions=ALL_PERMISSIONS)
        self.who = caller_for(self.project)

        def session(role="writer", task="drafting-the-second-chapter-with-continuity", family="claude-code-long-family-name",
                    **kw) -> int:
            spec = sessions.NewSession(role=role, memory_policy="bounded", task_mode=task, runtime_family=family, **kw)
            return sessions.create_session(self.who, spec, runtime=RuntimeSpec(family, ["draft"], lease_seconds=600)).id

        # Waiting on a worker (a handoff), on a person (a question), running, idle, completed.
        self.external = session()
        run = runs.start_run(self.who, self.external, cursor={"step": "continuity"})
        self.job = create_handoff(self.who, run.id, logical_id="chapter-2/continuity-check-of-the-orchard-scenes",
                                  required_capabilities=[], timeout_seconds=300).handoff
        self.asking = session(role="specialist")
        runs.start_run(self.who, self.asking, cursor={"step": "ask"})
        sessions.transition_session(self.who, self.asking, "awaiting_user",
                                    reason="Which year does the lighthouse keeper arrive? The outline says both 1911 and 1913.")
        for _ in range(4):
            s = session(role="manager", task="planning")
            runs.start_run(self.who, s, cursor={"step": "plan"})
        idle = session()
        r = runs.start_run(self.who, idle, cursor={"step": "draft"})
        runs.end_run(self.who, r.id, outcome="completed")

        # A busy run: checkpoints close together, sub-second handoffs, two runs.
        self.busy = session()
        # Run #1 is sub-second with a checkpoint: its tick used to cover the whole bar.
        first = runs.start_run(self.who, self.busy, cursor={"step": "one"})
        checkpoints.record_checkpoint(self.who, first.id, {"boundary": "context_freeze", "cursor": {"step": "one"}})
        runs.end_run(self.who, first.id, outcome="completed")
        second = runs.start_run(self.who, self.busy, cursor={"step": "two"})
        for n, boundary in enumerate(["context_freeze", "before_consequential_write", "candidate_frozen",
                                      "after_external_result", "before_canon_settlement", "before_long_handoff",
                                      "context_freeze", "candidate_frozen"]):
            checkpoints.record_checkpoint(self.who, second.id, {"boundary": boundary, "cursor": {"step": f"s{n}"}})
        for n in range(3):
            h = create_handoff(self.who, second.id, logical_id=f"quick-{n}", required_capabilities=[],
                               timeout_seconds=60).handoff
            h = claim_handoff(self.who, worker="w-quick", capabilities=[], handoff_id=h.id)
            deliver_result(self.who, h.id, fencing_token=h.fencing_token, job_fingerprint=h.job_fingerprint,
                           result={"ok": n})

        # A conflicting result.
        self.conflicted = session()
        run = runs.start_run(self.who, self.conflicted, cursor={"step": "style"})
        h = create_handoff(self.who, run.id, logical_id="chapter-3/style", required_capabilities=[], timeout_seconds=60).handoff
        h = claim_handoff(self.who, worker="w-style", capabilities=[], handoff_id=h.id)
        deliver_result(self.who, h.id, fencing_token=h.fencing_token, job_fingerprint=h.job_fingerprint,
                       result={"verdict": "consistent"})
        try:
            deliver_result(self.who, h.id, fencing_token=h.fencing_token, job_fingerprint=h.job_fingerprint,
                           result={"verdict": "the narrator changed voice"})
        except ConflictingResult:
            pass
        self.conflict_handoff = h.id

    def api(self, server, method: str, path: str, body: dict | None = None) -> dict:
        resp = httpx.request(method, server.url + "/api/v1" + path, json=body,
                             headers={"Authorization": f"Bearer {self.token}"}, timeout=15)
        assert resp.status_code in (200, 201), resp.text
        return resp.json()


@pytest.fixture
def day(server) -> Day:
    return Day()


NO_HORIZONTAL_SCROLL = """() => {
  const doc = document.documentElement, card = document.querySelector('.table-card');
  return {doc: [doc.scrollWidth, doc.clientWidth], card: [card.scrollWidth, card.clientWidth],
          headers: [...document.querySelectorAll('table.sessions thead th')].map((th) => th.textContent.trim()),
          lastRight: document.querySelector('table.sessions thead th:last-child').getBoundingClientRect().right,
          innerWidth: window.innerWidth};
}"""


@pytest.mark.parametrize("width,height", [(1366, 768), (1920, 1080)])
def test_the_overview_fits_without_a_horizontal_scrollbar(server, browser, day, width, height):
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    login(page, server, "mara", PASSWORD)
    page.goto(server.url + "/")
    expect(page.locator("#conn")).to_have_text("live")
    m = page.evaluate(NO_HORIZONTAL_SCROLL)
    assert m["doc"][0] <= m["doc"][1], f"the page scrolls sideways at {width} px: {m}"
    assert m["card"][0] <= m["card"][1], f"the sessions table scrolls sideways at {width} px: {m}"
    assert m["lastRight"] <= m["innerWidth"], "the Age column is on screen"
    assert "Project" not in m["headers"], "one project: no project column"
    assert "Waiting for" in m["headers"]
    waiting = page.locator(f"#session-{day.external} [data-field=waiting]")
    expect(waiting).to_contain_text("handoff chapter-2/continuity-check-of-the-orchard-scenes (pending)")
    expect(waiting).to_contain_text("since")
    expect(page.locator(f"#session-{day.asking} [data-field=waiting]")).to_contain_text("a question: Which year")
    screenshot(page, f"manager-overview-{width}")
    context.close()


LABEL_BOXES = """() => {
  const out = [];
  for (const track of document.querySelectorAll('[data-panel="timeline"] .tl-track')) {
    const boxes = [...track.querySelectorAll('.tl-tick-label:not(.thinned)')].map((l) => {
      const r = l.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom, l.textContent];
    });
    const trackBox = track.getBoundingClientRect();
    out.push({boxes, thinned: [...track.querySelectorAll('.tl-tick-label.thinned')].map((l) => l.closest('.tl-tick').title),
              ticks: track.querySelectorAll('.tl-tick').length, right: trackBox.right, left: trackBox.left});
  }
  return out;
}"""

SAME_COLOURS = """() => [...document.querySelectorAll('.tl-legend li')].map((li) => {
  const [element, ...classes] = li.dataset.legend.split(' ').filter(Boolean);
  const sel = '.tl-track .' + element + classes.map((c) => '.' + c).join('');
  const drawn = document.querySelector(sel);
  const swatch = li.querySelector('.swatch');
  const paint = (n) => { const s = getComputedStyle(n); return [s.backgroundColor, s.backgroundImage, s.borderLeftColor, s.color]; };
  return {legend: li.textContent.trim(), sel, drawn: drawn && paint(drawn), swatch: paint(swatch)};
})"""


def test_the_timeline_labels_never_overlap_and_every_span_is_visible(server, page, day):
    login(page, server, "mara", PASSWORD)
    page.goto(server.url + f"/sessions/{day.busy}/")
    expect(page.locator("#conn")).to_have_text("live")
    tracks = page.evaluate(LABEL_BOXES)
    run_tracks = [t for t in tracks if t["ticks"]]
    assert run_tracks, "the busy run has checkpoint ticks"
    shown = 0
    for t in run_tracks:
        boxes = t["boxes"]
        shown += len(boxes)
        for i, a in enumerate(boxes):
            assert a[0] >= t["left"] - 1 and a[2] <= t["right"] + 1, f"label {a[4]!r} runs off its track"
            for b in boxes[i + 1:]:
                apart = a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
                assert apart, f"labels overlap: {a} and {b}"
        assert all(title.startswith("checkpoint #") for title in t["thinned"]), "a thinned label keeps its tooltip"
    assert shown >= 2
    # Every run appears, every bar and span has a visible width (sub-second handoffs included).
    bars = page.locator('[data-panel="timeline"] .tl-lane[data-run-label] .tl-bar')
    expect(bars).to_have_count(2)
    for box in [bars.nth(i).bounding_box() for i in range(2)] + [
            page.locator(".tl-track .tl-span").nth(i).bounding_box() for i in range(page.locator(".tl-track .tl-span").count())]:
        assert box and box["width"] >= 5 and box["height"] >= 8, box
    assert page.locator(".tl-track .tl-span").count() == 3
    # Nothing covers a run's bar: the element at its middle is the bar itself.
    covered = page.evaluate("""() => [...document.querySelectorAll('.tl-lane[data-run-label] .tl-track > .tl-bar')].map((b) => {
      b.scrollIntoView({ block: "center" });
      const r = b.getBoundingClientRect();
      const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
      return hit === b || [hit && hit.className, r.left, r.top, r.width, window.scrollY];
    })""")
    assert covered == [True, True], covered
    # The legend is painted by the bars' own rules.
    legend = page.evaluate(SAME_COLOURS)
    assert {e["legend"] for e in legend} >= {"run completed", "open run", "checkpoint", "handoff bound"}
    for entry in legend:
        assert entry["drawn"] is not None, f"legend entry {entry['legend']!r} explains nothing drawn"
        if entry["sel"].startswith(".tl-track .tl-flag"):
            assert entry["swatch"][2:] == entry["drawn"][2:], entry
        else:
            assert entry["swatch"][:2] == entry["drawn"][:2], entry
    page.locator('[data-panel="timeline"]').screenshot(path=str(screenshot(page, "manager-session-busy").with_name(
        "manager-timeline.png")))
    # Narrow: labels are placed again from their measured boxes.
    page.set_viewport_size({"width": 1000, "height": 768})
    page.wait_for_function("() => document.querySelector('.tl-track.lanes-0, .tl-track.lanes-1, .tl-track.lanes-2') !== null")
    for t in page.evaluate(LABEL_BOXES):
        for i, a in enumerate(t["boxes"]):
            for b in t["boxes"][i + 1:]:
                assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], f"labels overlap at 1000 px: {a} {b}"
    screenshot(page, "manager-session-busy-1000")


def test_a_conflict_is_resolved_from_the_page(server, page, day):
    login(page, server, "mara", PASSWORD)
    page.goto(server.url + f"/sessions/{day.conflicted}/")
    expect(page.locator("#conn")).to_have_text("live")
    expect(page.locator("[role=alert]")).to_contain_text("Open conflict")
    card = page.locator("#conflicts")
    expect(card.locator(".result.consumed pre")).to_contain_text('"verdict": "consistent"')
    expect(card.locator(".result.conflicting pre")).to_contain_text('"verdict": "the narrator changed voice"')
    left, right = card.locator(".result.consumed").bounding_box(), card.locator(".result.conflicting").bounding_box()
    assert left["x"] + left["width"] <= right["x"] and abs(left["y"] - right["y"]) < 2, "side by side"
    screenshot(page, "manager-conflict-open")
    card.get_by_label("How was it resolved?").fill("kept the consumed draft; the late one was a retry")
    card.get_by_role("button", name="Resolve conflict").click()
    page.wait_for_load_state("networkidle")
    expect(page.locator(".messages")).to_contain_text("Conflict on handoff chapter-3/style resolved")
    expect(page.locator("#conflicts .conflict")).to_have_count(0)
    expect(page.locator("[role=alert]")).to_have_count(0)
    h = Handoff.objects.get(id=day.conflict_handoff)
    assert h.state == "bound" and h.conflict_resolution == "kept the consumed draft; the late one was a retry"
    assert Event.objects.filter(session_id=day.conflicted, type="handoff.conflict_resolved").count() == 1
    screenshot(page, "manager-conflict-resolved")


def test_an_expired_runtime_is_shown_expired_on_both_pages_and_lost_names_its_generation(server, page, day):
    session_id = day.external
    RuntimeAttachment.objects.filter(session_id=session_id).update(lease_expires_at=timezone.now() - timedelta(seconds=5))
    login(page, server, "mara", PASSWORD)
    page.goto(server.url + "/")
    badge = page.locator(f"#session-{session_id} [data-field=runtime-state]")
    expect(badge).to_have_text("lease expired")
    assert "rt-live" not in badge.get_attribute("class")
    screenshot(page, "manager-expired-overview")
    page.goto(server.url + f"/sessions/{session_id}/")
    expect(page.locator("#conn")).to_have_text("live")
    for where in ('[data-panel="identity"]', '[data-panel="runtimes"]'):
        b = page.locator(f"{where} [data-field=runtime-state]").first
        expect(b).to_have_text("lease expired")
        assert "rt-live" not in b.get_attribute("class"), where
    expect(page.locator(".rt.rt-live")).to_have_count(0)
    screenshot(page, "manager-expired-session")
    # The reconciler records it lost: the feed names the generation (it read "generation ?").
    reconcile_expired_runtimes(now=timezone.now())
    expect(page.locator("#feed li[data-type='runtime.lost'] .ev-sum")).to_have_text(
        "generation 1 · The runtime went away (closed, or it stopped answering)")


def test_the_charts_are_present_and_update_live(server, page, day):
    login(page, server, "mara", PASSWORD)
    page.goto(server.url + "/")
    expect(page.locator("#conn")).to_have_text("live")
    page.evaluate("window.__sameDocument = true")
    charts = page.locator("#charts figure.chart")
    expect(charts).to_have_count(3)
    for key in ("states", "events", "handoffs"):
        expect(page.locator(f"#charts [data-chart={key}] svg rect").first).to_be_attached()
    events = page.locator("#charts [data-chart=events] [data-field=summary]")
    before = int(events.text_content().split()[0])
    waiting = page.locator("#charts [data-chart=handoffs] [data-field=summary]")
    expect(waiting).to_contain_text("1 waiting now")
    screenshot(page, "manager-charts-before")
    # Changes through the agent API: a new session, a new handoff.
    created = day.api(server, "POST", "/sessions", {"role": "writer", "memory_policy": "bounded", "task_mode": "drafting",
                                                  "runtime_family": "chat", "runtime": {"runtime_family": "chat", "capabilities": ["draft"]}})
    run = day.api(server, "POST", f"/sessions/{created['id']}/runs", {"cursor": {"step": "x"}})
    day.api(server, "POST", f"/runs/{run['id']}/handoffs", {"logical_id": "live-chart-job", "timeout_seconds": 60})
    expect(waiting).to_contain_text("2 waiting now")
    after = int(events.text_content().split()[0])
    assert after > before, (before, after)
    expect(page.locator("#charts [data-chart=states] [data-field=summary]")).to_contain_text("waiting for a worker")
    assert page.evaluate("window.__sameDocument") is True, "no reload"
    screenshot(page, "manager-charts-after")
    # The session page's charts follow its panels.
    page.goto(server.url + f"/sessions/{created['id']}/")
    expect(page.locator("#conn")).to_have_text("live")
    sw = page.locator('[data-panel="charts"] [data-chart=handoffs] [data-field=summary]')
    expect(sw).to_contain_text("1 waiting now")
    day.api(server, "POST", f"/runs/{run['id']}/handoffs", {"logical_id": "live-chart-job-2", "timeout_seconds": 60})
    expect(sw).to_contain_text("2 waiting now")
    screenshot(page, "manager-session-charts")


def test_every_manager_page_has_no_serious_accessibility_violation(server, page, day):
    page.goto(server.url + "/login/")
    assert_no_serious_a11y_violations(page, "login")
    login(page, server, "mara", PASSWORD)
    pages = {
        "overview": "/",
        "session-waiting": f"/sessions/{day.external}/",
        "session-busy": f"/sessions/{day.busy}/",
        "session-conflict": f"/sessions/{day.conflicted}/",
        "project": f"/projects/{day.project.id}/",
        "resume": f"/sessions/{day.asking}/resume/",
    }
    for name, url in pages.items():
        page.goto(server.url + url)
        page.wait_for_load_state("networkidle")
        nav = page.locator("nav.topnav a")
        expect(nav).to_have_text(["Sessions", "Reviews", "Calibration"])
        assert_no_serious_a11y_violations(page, name)
        screenshot(page, f"manager-a11y-{name}")
