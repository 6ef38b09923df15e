"""Browser tests: Debian's Chromium driven by Playwright (sync API) against a real daphne.

Run in their own pytest process (``pytest -m browser``): sync Playwright and pytest-asyncio do
not share an event loop (sync Playwright
runs its own loop in the test's thread, where pytest-asyncio's would already be running).
Every test here is marked ``browser`` automatically.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.servers import DaphneServer

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # sync Playwright + ORM in one test

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def server(django_db_setup, django_db_blocker):
    srv = DaphneServer()
    yield srv
    srv.stop()


# ------------------------------------------------------------------ console and page errors
# Every page of every context the tests open is watched: its console messages and uncaught errors
# are recorded for the running test, and a test fails when any of them is a Content-Security-Policy
# refusal (Chromium logs "Refused to …" for each; the init script also reports every
# `securitypolicyviolation` event on the console, so none goes unnoticed).
CSP_PATTERNS = ("Content Security Policy", "Content-Security-Policy", "Refused to")
_REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (e) => {
  console.error("Content Security Policy violation: " + e.violatedDirective + " blocked " + (e.blockedURI || "inline")
                + " at " + e.sourceFile + ":" + e.lineNumber);
});
"""
console_log: list[str] = []  # the running test's console messages and page errors


def watch(page) -> None:
    page.on("console", lambda m: console_log.append(f"console.{m.type}: {m.text} ({page.url})"))
    page.on("pageerror", lambda e: console_log.append(f"pageerror: {e} ({page.url})"))


def csp_violations() -> list[str]:
    return [m for m in console_log if any(p in m for p in CSP_PATTERNS)]


class WatchedBrowser:
    """The session's Chromium; every context it opens watches its pages (see above)."""

    def __init__(self, browser) -> None:
        self._browser = browser

    def new_context(self, **kw):
        context = self._browser.new_context(**kw)
        context.add_init_script(_REPORT_VIOLATIONS)
        context.on("page", watch)
        return context

    def __getattr__(self, name: str):
        return getattr(self._browser, name)


@pytest.fixture(autouse=True)
def no_csp_violations():
    """Fails the test if a page it opened reported a Content-Security-Policy violation."""
    console_log.clear()
    yield console_log
    found = csp_violations()
    console_log.clear()
    assert found == [], "Content-Security-Policy violations in the browser console:\n" + "\n".join(found)


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield WatchedBrowser(chromium)
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1366, "height": 768})
    pg = context.new_page()
    pg.set_default_timeout(10_000)
    yield pg
    context.close()


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def login(page, server: DaphneServer, username: str, password: str) -> None:
    page.goto(server.url + "/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_load_state("networkidle")
