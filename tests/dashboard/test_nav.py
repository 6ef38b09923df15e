"""Landing and top navigation: reviewers who manage nothing land on their queue; the nav
shows Sessions / Reviews / Calibration according to the user's memberships."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from novelforge_sessions.models import Membership
from tests.dashboard.conftest import PASSWORD, logged_in, make_user

pytestmark = pytest.mark.django_db


def nav_links(html: str) -> list[str]:
    nav = re.search(r'<nav class="topnav" aria-label="Main">(.*?)</nav>', html, re.S).group(1)
    return re.findall(r">([^<>]+)</a>", nav)


def test_a_reviewer_logging_in_lands_on_the_review_queue(project):
    make_user("rita", project, role=Membership.Role.REVIEWER)
    resp = Client().post("/login/", {"username": "rita", "password": PASSWORD}, follow=True)
    assert resp.redirect_chain == [("/", 302), ("/reviews/", 302)]
    html = resp.content.decode()
    assert resp.status_code == 200 and "<h1>Review queue</h1>" in html
    assert nav_links(html) == ["Reviews"], "a reviewer who manages nothing sees only the review queue"


def test_a_manager_logging_in_lands_on_the_dashboard(project):
    make_user("mara", project)
    resp = Client().post("/login/", {"username": "mara", "password": PASSWORD}, follow=True)
    assert resp.redirect_chain == [("/", 302)] and "<h1>Sessions</h1>" in resp.content.decode()


def test_a_manager_who_also_reviews_keeps_the_dashboard_and_gets_a_reviews_link(project, other_project, make_session):
    session = make_session()
    both = make_user("both", project)
    Membership.objects.create(user=both, project=other_project, role=Membership.Role.REVIEWER)
    client = logged_in(both)
    html = client.get("/").content.decode()
    assert nav_links(html) == ["Sessions", "Reviews", "Calibration"]
    assert re.search(r'<a href="/" class="active" aria-current="page">Sessions</a>', html)
    assert '<a href="/reviews/gates/">Reviews</a>' in html and '<a href="/reviews/calibration/">Calibration</a>' in html
    # The project's gates, and from there the review queue of the projects they review.
    assert '<a href="/reviews/">Your own review queue</a>' in client.get("/reviews/gates/").content.decode()
    for url in (f"/sessions/{session.id}/", f"/projects/{project.id}/", f"/sessions/{session.id}/resume/"):
        assert nav_links(client.get(url).content.decode()) == ["Sessions", "Reviews", "Calibration"], url


def test_a_managers_menu_is_the_same_on_dashboard_and_review_pages(mgr_client, project, make_session):
    """The manager's menu once lacked "Reviews" on dashboard pages but had it on review pages."""
    session = make_session()
    expected = ["Sessions", "Reviews", "Calibration"]
    for url in ("/", f"/projects/{project.id}/", f"/sessions/{session.id}/", "/reviews/", "/reviews/calibration/"):
        resp = mgr_client.get(url)
        assert resp.status_code == 200, url
        assert nav_links(resp.content.decode()) == expected, url


def test_the_login_page_has_no_nav_links():
    assert nav_links(Client().get("/login/").content.decode()) == []
