"""The manager dashboard in headless Chromium against a real daphne: changes made through the
agent API appear without a reload, the session diagram lights the new state, and after a
reconnect the page catches up from the event log."""
from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import expect

from novelforge_sessions.actions import checkpoints, runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec, reconcile_expired_runtimes
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.models import Membership
from tests.browser.conftest import login, screenshot
from tests.conftest import SESSION, caller_for, make_project

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

    expect(state_of(page, world.watched)).to_have_text("awaiting_user")
    expect(page.locator(f"#session-{world.watched}")).to_have_attribute("data-state", "awaiting_user")
    expect(page.locator('[data-count="awaiting_user"]')).to_have_text("1")
    expect(page.locator('[data-count="running"]')).to_have_text("0")
    expect(page.locator("#feed .ev").first).to_contain_text("running → awaiting_user")

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
    expect(page.locator("#session-state")).to_have_text("awaiting_user")
    expect(page.locator("svg.lifecycle g.node.next")).to_have_count(4)  # running, failed, terminated, stale
    expect(page.locator('svg.lifecycle path.taken[data-edge="running>awaiting_user"]')).to_have_count(1)
    expect(page.locator("#feed .ev").first).to_contain_text("running → awaiting_user")

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
    page.wait_for_function("NF.stream.ws === null")

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
