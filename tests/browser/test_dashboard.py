"""The manager dashboard in headless Chromium against a real daphne: changes made through the
agent API appear without a reload, the session diagram lights the new state, and after a
reconnect the page catches up from the event log."""
from __future__ import annotations

import re
from datetime import timedelta

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import expect

from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.control import checkpoints
from novelforge_sessions.actions.runtimes import RuntimeSpec, reconcile_expired_runtimes
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.models import Membership
from tests.browser.conftest import login, screenshot
from tests.support.factories import SESSION, caller_for, make_project

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "lamp-flickered-twice"


class World:
    """A project with a manager, an agent token and sessions in several states."""

    def __init__(self) -> None:
        self.project = make_project("glass-orchard", name="The Glass Orchard")
        user = get_user_model().objects.create_user("mara", password=PASSWORD)
        Membership.objects.create(user=user, project=self.project, role=Membership.Role.MANAGER)
        _, self.token = create_token(self.project, name="agent", permissions=ALL_PERMISSIONS)
        who = caller_for(self.project)

        def session(role: str, task: str, family: str, **kw) -> int:
            spec = sessions.NewSession(role=role, memory_policy="bounded", task_mode=task, runtime_family=family, **kw)
            return sessions.create_session(who, spec, runtime=RuntimeSpec(family, ["draft"], lease_seconds=600)).id

        lost = sessions.create_session(
            who, sessions.NewSession(role="writer", memory_policy="bounded", task_mode="revision", runtime_family="local-model"),
            runtime=RuntimeSpec("local-model", ["draft"], lease_seconds=1),
        ).id
        runs.start_run(who, lost, cursor={"step": "revise"})
        reconcile_expired_runtimes(now=timezone.now() + timedelta(seconds=5))
        done = session("specialist", "continuity-check", "ci")
        run = runs.start_run(who, done, cursor={"step": "check"})
        runs.end_run(who, run.id, outcome="completed", session_status="completed")
        idle = session("writer", "drafting", "claude-code")
        run = runs.start_run(who, idle, cursor={"step": "draft"})
        runs.end_run(who, run.id, outcome="completed")
        self.watched = session("manager", "planning", "chat", provider_metadata={"thread_id": "chat-7f3"})
        run = runs.start_run(who, self.watched, cursor={"step": "outline"})
        self.watched_run = run.id
        checkpoints.record_checkpoint(who, run.id, {"boundary": "context_freeze", "cursor": {"step": "outline"}})

    def api(self, server, method: str, path: str, body: dict | None = None) -> dict:
        resp = httpx.request(method, server.url + "/api/v1" + path, json=body,
                             headers={"Authorization": f"Bearer {self.token}"}, timeout=15)
        assert resp.status_code in (200, 201), resp.text
        return resp.json()


@pytest.fixture
def world(server) -> World:
    return World()


def state_of(page, session_id: int):
    return page.locator(f"#session-{session_id} [data-field=state]")


def test_a_state_change_through_the_agent_api_appears_on_the_overview_without_reload(server, page, world):
    login(page, server, "mara", PASSWORD)
    page.goto(server.url + "/")
    expect(page.locator("#conn")).to_have_text("live")
    page.evaluate("window.__sameDocument = true")
    expect(state_of(page, world.watched)).to_have_text("running")
    expect(page.locator('[data-count="awaiting_user"]')).to_have_text("0")

    world.api(server, "POST", f"/sessions/{world.watched}/transition", {"to": "awaiting_user", "reason": "question for the author"})

    # The badge says it in words, painted live from the event with the page's one map;
    # the code stays in the row's data-state and the badge's title.
    expect(state_of(page, world.watched)).to_have_text("waiting for a person")
    expect(state_of(page, world.watched)).to_have_attribute("title", "awaiting_user")
    expect(page.locator(f"#session-{world.watched}")).to_have_attribute("data-state", "awaiting_user")
    expect(page.locator('[data-count="awaiting_user"]')).to_have_text("1")
    expect(page.locator('[data-count="running"]')).to_have_text("0")
    expect(page.locator("#feed .ev").first).to_contain_text("running → waiting for a person")

    # A session created by an agent appears as a new row.
    created = world.api(server, "POST", "/sessions", {**SESSION, "task_mode": "cover-copy"})
    expect(state_of(page, created["id"])).to_have_text("created")
    expect(page.locator("#session-rows tr").first).to_have_attribute("data-session-id", str(created["id"]))
    expect(page.locator('[data-count="total"]')).to_have_text("5")

    assert page.evaluate("window.__sameDocument") is True, "no reload happened"
    screenshot(page, "dashboard-overview")


def test_the_session_page_lights_the_new_state_in_the_diagram(server, page, world):
    login(page, server, "mara", PASSWORD)
    page.goto(server.url + f"/sessions/{world.watched}/")
    expect(page.locator("#conn")).to_have_text("live")
    page.evaluate("window.__sameDocument = true")
    current = page.locator("svg.lifecycle g.node.current")
    expect(current).to_have_attribute("data-state", "running")

    world.api(server, "POST", f"/sessions/{world.watched}/transition", {"to": "awaiting_user", "reason": "needs the author"})

    expect(current).to_have_attribute("data-state", "awaiting_user")
    expect(page.locator("#session-state")).to_have_text("waiting for a person")
    expect(page.locator("#session-state")).to_have_attribute("data-state", "awaiting_user")
    expect(page.locator("svg.lifecycle g.node.next")).to_have_count(4)  # running, failed, terminated, stale
    expect(page.locator('svg.lifecycle path.taken[data-edge="running>awaiting_user"]')).to_have_count(1)
    expect(page.locator("#feed .ev").first).to_contain_text("running → waiting for a person")

    # The waiting run continues: back to running, and the diagram follows again.
    world.api(server, "POST", f"/sessions/{world.watched}/transition", {"to": "running"})
    expect(current).to_have_attribute("data-state", "running")
    assert page.evaluate("window.__sameDocument") is True
    page.locator("details.meta summary").click()
    screenshot(page, "dashboard-session")


def test_after_a_reconnect_the_page_catches_up_from_the_event_log(server, page, world):
    login(page, server, "mara", PASSWORD)
    page.goto(server.url + "/")
    expect(page.locator("#conn")).to_have_text("live")
    page.evaluate("window.__sameDocument = true")
    # Drop the socket and hold the reconnect, so the change below is missed live.
    page.evaluate("NF.stream.stopped = true; NF.stream.ws.close()")
    page.wait_for_function("() => NF.stream.ws === null")  # a function: a bare expression is eval()ed, which the CSP refuses

    world.api(server, "POST", f"/sessions/{world.watched}/transition", {"to": "idle", "reason": "while offline"})
    expect(state_of(page, world.watched)).to_have_text("running")  # nothing arrived while disconnected

    page.evaluate("NF.stream.stopped = false; NF.stream.connect()")
    expect(state_of(page, world.watched)).to_have_text("idle")
    expect(page.locator("#conn")).to_have_text("live")
    expect(page.locator("#feed .ev").first).to_contain_text("running → idle")
    assert page.evaluate("window.__sameDocument") is True


def test_a_manager_action_from_the_session_page(server, page, world):
    login(page, server, "mara", PASSWORD)
    page.goto(server.url + f"/sessions/{world.watched}/")
    page.get_by_role("button", name="Close").click()
    expect(page.locator(".messages")).to_contain_text("Closed the live runtime")
    expect(page.locator("#session-state")).to_have_text("idle")
    expect(page.locator("svg.lifecycle g.node.current")).to_have_attribute("data-state", "idle")
    page.get_by_role("link", name="Resume…").click()
    confirm = page.get_by_role("button", name="Confirm resume")
    expect(confirm).to_be_visible()  # the dry-run report comes first
    expect(page.locator("ol.report li.step.fail")).to_have_count(0)
    assert page.locator("ol.report li.step.ok").count() >= 6
    confirm.click()
    expect(page.locator(".messages")).to_contain_text("Resumed: runtime generation 2")
    expect(page.locator("#session-state")).to_have_text("running")


def handoff_row(page, handoff_id: int):
    return page.locator(f"#handoff-{handoff_id}")


def test_handoffs_appear_tick_and_fold_away_live(server, page, world):
    """handoff.* events re-render the handoffs panel and the timeline: a job handed off through
    the agent API appears, a claim starts a ticking lease countdown, a bound result folds it away."""
    login(page, server, "mara", PASSWORD)
    page.goto(server.url + f"/sessions/{world.watched}/")
    expect(page.locator("#conn")).to_have_text("live")
    page.evaluate("window.__sameDocument = true")
    panel = page.locator('[data-panel="handoffs"]')
    expect(panel).to_contain_text("Nothing is waiting on an external worker.")

    job = world.api(server, "POST", f"/runs/{world.watched_run}/handoffs", {
        "logical_id": "outline/continuity-check", "required_capabilities": ["continuity"], "timeout_seconds": 90,
        "params": {"task": "check the outline against the series bible"}, "result_schema": {"verdict": "string"},
    })
    other = world.api(server, "POST", f"/runs/{world.watched_run}/handoffs", {"logical_id": "outline/blurb"})
    expect(handoff_row(page, job["id"])).to_have_attribute("data-state", "pending")
    expect(handoff_row(page, other["id"])).to_contain_text("not claimed")
    expect(page.locator("#session-state")).to_have_text("waiting for a worker")
    expect(page.locator(f'.tl-span[data-handoff-id="{job["id"]}"]')).to_have_count(1)

    claimed = world.api(server, "POST", "/handoffs/claim",
                        {"worker": "continuity-bot", "capabilities": ["continuity"], "handoff_id": job["id"]})["handoff"]
    row = handoff_row(page, job["id"])
    expect(row).to_have_attribute("data-state", "claimed")
    expect(row).to_contain_text("continuity-bot")
    countdown = row.locator(".countdown")
    expect(countdown).to_have_text(re.compile(r"^expires in 1:[0-3]\d$"))
    first = countdown.inner_text()
    expect(countdown).not_to_have_text(first)  # it ticks
    assert "UTC" in countdown.get_attribute("title")
    expect(page.locator(f'.tl-span[data-handoff-id="{job["id"]}"]')).to_have_class(re.compile("hs-claimed"))
    screenshot(page, "dashboard-session-handoffs")

    world.api(server, "POST", f"/handoffs/{job['id']}/results",
              {"fencing_token": claimed["fencing_token"], "job_fingerprint": claimed["job_fingerprint"],
               "result": {"verdict": "consistent"}})
    finished = page.locator("details.ho-finished")
    expect(finished).to_contain_text("Recently finished (1)")
    expect(handoff_row(page, job["id"])).to_have_attribute("data-state", "bound")
    expect(handoff_row(page, job["id"])).to_be_hidden()  # folded
    expect(page.locator('[data-field="open-handoffs"]')).to_have_text("1")
    expect(page.locator("#feed .ev").first).to_contain_text("outline/continuity-check · result consumed")
    assert page.evaluate("window.__sameDocument") is True
    # Live rows are summarised in JS exactly as the server renders them after a reload.
    from novelforge_sessions.dashboard.presenters import describe
    from tests.dashboard.test_handoffs import SUMMARY_CASES

    from novelforge_sessions.event_types import family_of

    for event_type, payload, summary in SUMMARY_CASES:  # the JS groups by the family the server sends
        js = page.evaluate("([t, p, f]) => NF.describe(t, p, f)", [event_type, payload, family_of(event_type)])
        assert js == describe(event_type, payload) == summary


def test_the_live_pages_say_states_and_reasons_in_the_servers_words(server, page, world):
    """static/js paints badges and feed lines from the map the server renders into the page
    (presenters.STATE_LABELS / REASON_TEXT): the same words as a reload, for every state and
    for coded and free-text reasons alike."""
    from novelforge_sessions.dashboard import presenters
    from tests.dashboard.test_words import LOST

    login(page, server, "mara", PASSWORD)
    for url in ("/", f"/sessions/{world.watched}/"):
        page.goto(server.url + url)
        for state in presenters.STATES:
            assert page.evaluate("(s) => NF.stateLabel(s)", state) == presenters.state_label(state)
        for role in [*presenters.ROLE_WORDS, "some_new_role"]:
            assert page.evaluate("(r) => NF.roleWords(r)", role) == presenters.role_words(role)
        for raw in ("runtime_lost", "conflicting_result: chapter-1/continuity", "conflicting_result", "conflicting_result: ",
                    "runtime_lost: as an agent wrote it", "needs the author", "", "{detail}: x"):
            assert page.evaluate("(r) => NF.reasonText(r)", raw) == presenters.reason_text(raw), raw
        for event_type, payload in [
            ("session.transitioned", {"from": "running", "to": "awaiting_external", "reason": "waiting on handoff x"}),
            ("session.transitioned", {"from": "running", "to": "failed", "reason": "runtime_lost"}),
            ("run.ended", {"seq": 3, "state": "interrupted", "reason": "runtime_lost"}),
            ("runtime.lost", {"runtime_id": 1, "generation": 2, "reason": "runtime_lost"}),
        ]:
            family = event_type.split(".")[0]
            assert page.evaluate("([t, p, f]) => NF.describe(t, p, f)", [event_type, payload, family]) \
                == presenters.describe(event_type, payload)
    assert presenters.describe("runtime.lost", {"generation": 2, "reason": "runtime_lost"}) == f"generation 2 · {LOST}"

    # Live: a badge painted from an event reads as the server renders it after a reload.
    page.goto(server.url + "/")
    expect(page.locator("#conn")).to_have_text("live")
    world.api(server, "POST", f"/sessions/{world.watched}/transition", {"to": "awaiting_external", "reason": "a worker"})
    badge = state_of(page, world.watched)
    expect(badge).to_have_text("waiting for a worker")
    expect(badge).to_have_attribute("title", "awaiting_external")
    expect(page.locator("#feed .ev .badge").first).to_have_text("waiting for a worker")
    live = badge.evaluate("(b) => b.outerHTML")
    page.reload()
    assert state_of(page, world.watched).evaluate("(b) => b.outerHTML") == live


def test_an_expired_lease_says_expired(server, page, world):
    job = world.api(server, "POST", f"/runs/{world.watched_run}/handoffs", {"logical_id": "outline/quick", "timeout_seconds": 2})
    world.api(server, "POST", "/handoffs/claim", {"worker": "slow-bot", "capabilities": [], "handoff_id": job["id"]})
    login(page, server, "mara", PASSWORD)
    page.goto(server.url + f"/sessions/{world.watched}/")
    countdown = handoff_row(page, job["id"]).locator(".countdown")
    # Nothing renews the lease: the countdown runs out, and the re-check after expiry
    # (heartbeats are not events) confirms it: the row reads "lease expired".
    expect(countdown).to_have_class(re.compile(r"\bexpired\b"), timeout=15_000)
    expect(countdown).to_have_text(re.compile(r"^expired "))
    expect(handoff_row(page, job["id"])).to_have_class(re.compile("lease-expired"), timeout=15_000)
    expect(handoff_row(page, job["id"])).to_contain_text("lease expired: claimable again")


def test_the_manager_approves_and_refuses_write_intents_on_the_project_page(server, page, world):
    from novelforge_sessions.actions import artifacts
    from novelforge_sessions.control import intents

    who = caller_for(world.project)
    chapter = artifacts.create_artifact(who, name="chapter-03", kind="chapter", content="The orchard froze.")
    v2 = artifacts.add_artifact_version(who, chapter.id, content="The orchard froze over.")
    before = world.api(server, "GET", f"/write-intents/before-state?kind=artifact.make_current&artifact_id={chapter.id}")
    keep = world.api(server, "POST", "/write-intents", {
        "kind": "artifact.make_current", "idempotency_key": "chapter-03-v2", "artifact_id": chapter.id,
        "params": {"version_id": v2.id}, "before_fingerprint": before["before_fingerprint"]})
    auth = intents.read_before_state(who, kind="framework.change")
    drop = world.api(server, "POST", "/write-intents", {
        "kind": "framework.change", "idempotency_key": "framework-2", "params": {"framework_version": "2"},
        "before_fingerprint": auth.fingerprint})

    login(page, server, "mara", PASSWORD)
    page.goto(server.url + f"/projects/{world.project.id}/")
    expect(page.locator('[data-field="open-intents"]')).to_have_text("2")
    keep_card = page.locator(f"#intent-{keep['id']}")
    expect(keep_card).to_contain_text("chapter-03: make v2 current (was v1)")
    screenshot(page, "dashboard-project")

    keep_card.locator('input[name="note"]').fill("reads well")
    keep_card.get_by_role("button", name=f"Approve write intent #{keep['id']}").click()
    expect(page.locator(".messages")).to_contain_text(f"Approved write intent #{keep['id']}")
    expect(page.locator(f"#intent-{keep['id']}")).to_have_attribute("data-state", "approved")
    expect(page.locator(f"#intent-{keep['id']}")).to_contain_text("Approved by")

    # Refusing is final: the page asks first (dismissed → nothing happens, accepted → refused).
    page.once("dialog", lambda d: d.dismiss())
    page.get_by_role("button", name=f"Refuse write intent #{drop['id']}").click()
    expect(page.locator(f"#intent-{drop['id']}")).to_have_attribute("data-state", "proposed")
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name=f"Refuse write intent #{drop['id']}").click()
    expect(page.locator(".messages")).to_contain_text(f"Refused write intent #{drop['id']}")
    expect(page.locator(f"#intent-{drop['id']}")).to_have_attribute("data-state", "rejected")
    expect(page.locator(f"#intent-{drop['id']}")).to_be_hidden()  # folded with the closed ones
    expect(page.locator('[data-field="open-intents"]')).to_have_text("1")

    # The agent executes the approved one; the project's artifacts follow.
    world.api(server, "POST", f"/write-intents/{keep['id']}/execute")
    page.reload()
    page.locator("details.intents-closed summary").click()
    expect(page.locator(f"#intent-{keep['id']}")).to_have_attribute("data-state", "executed")
    page.get_by_role("link", name="Reviewer calibration →").click()
    page.wait_for_url(server.url + "/reviews/calibration/")
    expect(page.get_by_role("heading", name="Reviewer calibration")).to_be_visible()

