"""A runtime left without heartbeats, watched in headless Chromium (docs/model.md#runtimes-and-leases).

The server and a reconciler loop (``reconcile_runtimes --loop``, as ``make run`` starts it) run
as separate processes against the test database, in both setups: sharing the Redis channel
layer (a deployment with several processes), and in the default single-server setup without
Redis, where the reconciler's commit wakes the server's sockets through PostgreSQL
``LISTEN/NOTIFY`` (``live/pgnotify.py``). The server's periodic sweep is off, so every update
crosses processes; the page shows the session failed within about a second of the commit. The page, never reloaded, shows the runtime "lease
expired" within one lease period (liveness is derived from the lease, not from a record), then
— driven by the reconciler's events over the websocket — the runtime lost and the session
``failed`` / ``runtime_lost``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.models import Event, Membership, RuntimeAttachment, Session
from tests.browser.conftest import login, screenshot
from tests.support.factories import caller_for, make_project
from tests.support.servers import ROOT, DaphneServer, database_url

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "kettle-sang-at-dawn"
LEASE_SECONDS = 4
RECONCILE_INTERVAL = "1"
REDIS_URL = os.environ.get("TEST_REDIS_URL") or "redis://127.0.0.1:6379/14"

# Records, in order, every text the newest runtime's state badge and the session's state badge
# take, so a state held only briefly is still seen (expect() polls; it could miss one).
RECORDER = """
() => {
  window.__seen = [];
  const root = document.getElementById("session-page");
  const note = () => {
    const badge = root.querySelector('[data-panel="runtimes"] [data-field="runtime-state"]');
    const state = document.getElementById("session-state");
    for (const text of [badge && "runtime:" + badge.textContent.trim(), state && "session:" + state.textContent.trim()]) {
      if (text && !window.__seen.includes(text)) window.__seen.push(text);
    }
  };
  new MutationObserver(note).observe(root, { subtree: true, childList: true, characterData: true, attributes: true });
  note();
}
"""


@pytest.fixture(scope="module", params=["redis", "in-memory"])
def redis_server(request, django_db_setup, django_db_blocker):
    """A daphne with its periodic sweep off — on the Redis layer, or on the default in-memory
    layer (then woken by LISTEN/NOTIFY): every live update the page gets crossed processes."""
    srv = DaphneServer(redis_url=REDIS_URL if request.param == "redis" else None,
                       extra_env={"LIVE_SWEEP_SECONDS": "3600"})
    srv.layer = request.param
    yield srv
    srv.stop()


@pytest.fixture
def reconciler(redis_server):
    log_path = ROOT / "tests" / "artifacts" / f"reconciler-browser-{redis_server.layer}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update({"DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"})
    if redis_server.layer == "redis":
        env["REDIS_URL"] = REDIS_URL
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "reconcile_runtimes", "--loop", "--interval", RECONCILE_INTERVAL],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
        yield proc
        proc.terminate()
        proc.wait(timeout=10)


def test_a_silent_runtime_shows_lease_expired_then_its_session_fails_without_a_reload(redis_server, reconciler, page):
    project = make_project("quiet-harbour", name="The Quiet Harbour")
    user = get_user_model().objects.create_user("ines", password=PASSWORD)
    Membership.objects.create(user=user, project=project, role=Membership.Role.MANAGER)
    who = caller_for(project)
    login(page, redis_server, "ines", PASSWORD)

    session = sessions.create_session(
        who, sessions.NewSession(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli"),
        runtime=RuntimeSpec(runtime_family="cli", lease_seconds=LEASE_SECONDS),
    )
    attached = time.monotonic()
    runs.start_run(who, session.id, cursor={"step": "draft"})
    runtime = RuntimeAttachment.objects.get(session=session)

    page.goto(f"{redis_server.url}/sessions/{session.id}/")
    expect(page.locator("#conn")).to_have_text("live")
    page.evaluate("window.__sameDocument = true")
    page.evaluate(RECORDER)
    badge = page.locator(f'#runtime-{runtime.id} [data-field="runtime-state"]')
    expect(badge).to_have_text("live")
    expect(page.locator("#session-state")).to_have_text("running")

    # No heartbeat ever comes. Within one lease period (plus a moment for the page's timer):
    left = LEASE_SECONDS + 1.5 - (time.monotonic() - attached)
    page.wait_for_function("() => window.__seen.includes('runtime:lease expired')", timeout=max(left, 0.5) * 1000)

    # Then the reconciler's runtime.lost and session.transitioned arrive over the websocket,
    # within about a second of its commit (waiting on the database, then on the page).
    deadline = time.monotonic() + LEASE_SECONDS * 3
    while not Session.objects.filter(id=session.id, status=rt.SessionStatus.FAILED).exists():
        assert time.monotonic() < deadline, "the reconciler never failed the session"
        page.wait_for_timeout(50)
    expect(page.locator("#session-state")).to_have_text("failed", timeout=1500)
    expect(badge).to_have_text("lost")
    expect(page.locator('[data-panel="identity"] .reason')).to_have_text("The runtime went away (closed, or it stopped answering)")
    expect(page.locator('[data-panel="identity"] .reason')).to_have_attribute("data-reason", "runtime_lost")
    expect(page.locator("#feed")).to_contain_text("runtime.lost")
    assert page.evaluate("window.__sameDocument") is True, "the page was never reloaded"
    seen = page.evaluate("window.__seen")
    assert seen.index("runtime:live") < seen.index("runtime:lease expired") < seen.index("runtime:lost"), seen
    assert seen.index("runtime:lease expired") < seen.index("session:failed"), seen
    screenshot(page, f"session-lease-expired-then-failed-{redis_server.layer}")

    # The records say what the page showed, and the reconciler process wrote them.
    session.refresh_from_db()
    runtime.refresh_from_db()
    assert (session.status, session.status_reason) == (rt.SessionStatus.FAILED, "runtime_lost")
    assert (runtime.state, runtime.end_reason) == (rt.RuntimeState.LOST, "runtime_lost")
    lost = Event.objects.get(session_id=session.id, type="runtime.lost")
    assert lost.actor == "system:reconciler"
    assert reconciler.poll() is None, "the reconciler loop keeps running"
    assert Session.objects.filter(id=session.id, status=rt.SessionStatus.RUNNING).count() == 0
