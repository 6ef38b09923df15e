"""Browser tests: Debian's Chromium driven by Playwright (sync API) against a real daphne.

Run in their own pytest process (``pytest -m browser``): sync Playwright and pytest-asyncio do
not share an event loop (PITFALLS.md). Every test here is marked ``browser`` automatically.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.live import DaphneServer

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


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
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
