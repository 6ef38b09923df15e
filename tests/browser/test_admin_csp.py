"""The Django admin works under the strict Content-Security-Policy, in Chromium.

Every page of the admin a superuser uses (index, change lists with their filters and search,
change forms with date/time widgets and inlines, the add form that shows a new token) renders
and runs its scripts with no policy violation: the autouse ``no_csp_violations`` fixture
(tests/browser/conftest.py) fails the test on any "Refused to …" in the console."""
from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from novelforge_sessions.models import ApiToken, Project, Session
from tests.reviews.factories import PASSWORD, make_world

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_admin_works_under_the_policy(server, page, project):
    world = make_world(project)
    get_user_model().objects.create_superuser("root", "root@example.invalid", PASSWORD)
    page.goto(server.url + "/admin/login/")
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", PASSWORD)
    page.click("input[type=submit]")
    expect(page.locator("#site-name")).to_be_visible()
    page.wait_for_load_state("networkidle")

    urls = [
        "/admin/",
        "/admin/novelforge_sessions/session/",
        f"/admin/novelforge_sessions/session/{world.writer.id}/change/",
        "/admin/novelforge_sessions/session/?status__exact=running&q=writer",
        "/admin/novelforge_sessions/event/",
        f"/admin/novelforge_sessions/project/{Project.objects.get().id}/change/",  # membership inlines
        "/admin/novelforge_sessions/apitoken/add/",  # date/time widgets
        f"/admin/novelforge_sessions/apitoken/{ApiToken.objects.first().id}/change/",
        "/admin/reviews/reviewgate/",
        "/admin/auth/user/",
    ]
    for url in urls:
        resp = page.goto(server.url + url)
        assert resp is not None and resp.status == 200, url
        assert resp.headers.get("content-security-policy"), url  # the policy is not switched off for the admin
        expect(page.locator("#content")).to_be_visible()
        page.wait_for_load_state("networkidle")

    # The scripts run: the add form's calendar and clock widgets open (DateTimeShortcuts.js).
    page.goto(server.url + "/admin/novelforge_sessions/apitoken/add/")
    page.locator("#calendarlink0").click()
    expect(page.locator(".calendarbox").first).to_be_visible()
    # The project form's inline "Add another" adds a row (inlines.js).
    page.goto(server.url + f"/admin/novelforge_sessions/project/{Project.objects.get().id}/change/")
    rows = page.locator(".dynamic-memberships, .dynamic-membership_set, tr.form-row.dynamic-memberships")
    before = rows.count()
    page.locator(".add-row a").first.click()
    expect(rows).to_have_count(before + 1)
    assert Session.objects.filter(id=world.writer.id).exists()
